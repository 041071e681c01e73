"""The Kruise differential tier's oracle process and its summary line.

The oracle binary is built by `tools/build-kruise-oracle.sh` (run by `tools/setup.sh`). Without it
the tier skips, except under `CI=true`, where a missing oracle fails the run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kruise import summary
from tests.kruise.cases import corpus_pods, corpus_sidecarsets
from tests.kruise.oracle import Oracle, binary
from tests.kube.ci import IN_CI


@pytest.fixture(scope="session")
def oracle() -> Iterator[Oracle]:
    path = binary()
    if not path.exists():
        if IN_CI:
            pytest.fail(f"the Kruise oracle {path} is missing: run tools/build-kruise-oracle.sh")
        pytest.skip(f"the Kruise oracle {path} is not built: run tools/build-kruise-oracle.sh")
    proc = Oracle(path)
    yield proc
    proc.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = summary.lines()
    if not lines:
        return
    pods, valid, invalid = corpus_pods(), corpus_sidecarsets(), corpus_sidecarsets(invalid=True)
    terminalreporter.write_line(
        f"kruise differential corpus: {len(pods)} pods, {len(valid) + len(invalid)} SidecarSets "
        f"({len(invalid)} of them invalid), sources in tests/kruise/corpus/README.md; Kruise v1.9.1"
    )
    for line in lines:
        terminalreporter.write_line(line)
