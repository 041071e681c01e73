"""Session-wide hooks and the background loop; each tier's servers live in its own conftest.

Everything under tests/e2e/ is marked `e2e`, everything under tests/node/ `node`, everything under
tests/reliability/ `reliability`. Under CI=true a test of any of these tiers that skips is reported
as a failure: those tiers must really run there. Those tiers, and the Kruise differential tier
(whose summary lines its own process prints), are `serial` too: with the tests marked so by hand
(they bound elapsed time) they run one at a time, and under more than one xdist worker they fail
instead of running beside other tests.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.kube import keptlogs, node
from tests.kube.ci import IN_CI
from tests.kube.loop import BackgroundLoop

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.path)
        if "/tests/e2e/" in path:
            item.add_marker(pytest.mark.e2e)
        if "/tests/node/" in path:
            item.add_marker(pytest.mark.node)
        if "/tests/reliability/" in path:
            item.add_marker(pytest.mark.reliability)
        if any(f"/tests/{tier}/" in path for tier in ("e2e", "node", "reliability", "kruise")):
            item.add_marker(pytest.mark.serial)


_STARTED = pytest.StashKey[float]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A `serial` test among several xdist workers would measure their load, not its own: refuse it."""
    item.stash[_STARTED] = time.time()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and item.get_closest_marker("serial") is not None:
        pytest.fail(f"marked serial, so it runs alone: run it without -n (or with -n 1), not among {workers} workers")


def pytest_report_header(config: pytest.Config) -> str:
    """The one line saying whether the real-node tier (tests/node) can run on this machine."""
    reason = node.unavailable_reason()
    if reason is None:
        return "real-node tier: this machine can run a node"
    return f"real-node tier: {'fails under CI=true' if IN_CI else 'skipped'}: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    tier = next((m for m in ("e2e", "node", "reliability") if item.get_closest_marker(m) is not None), None)
    # An expected failure (xfail) is reported as skipped too; it ran, so it stands.
    if IN_CI and report.skipped and tier is not None and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"{tier} test skipped under CI=true (not allowed): {report.longrepr}"
    if item.get_closest_marker("versions") is not None and (report.when == "call" or report.outcome != "passed"):
        _VERSIONS_OUTCOMES[item.nodeid] = report.outcome
    if report.failed and tier is not None and _STARTED in item.stash:
        kept = keptlogs.keep(item.nodeid, item.stash[_STARTED])
        if kept is not None:
            report.sections.append(("logs kept", f"the logs this test wrote are kept in {kept}"))
    return report


# The outcome of each test of the versions tier run by this process (a failed setup or teardown
# counts as failed); written out at the end when SIDECARCTL_VERSIONS_REPORT names a file.
_VERSIONS_OUTCOMES: dict[str, str] = {}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Append this run's versions-tier counts, with the Kubernetes version it ran against, to the file
    SIDECARCTL_VERSIONS_REPORT names: tools/test.sh prints them minor by minor at the end."""
    target = os.environ.get("SIDECARCTL_VERSIONS_REPORT")
    if not target or not _VERSIONS_OUTCOMES or hasattr(session.config, "workerinput"):
        return
    from tests.kube.controlplane import ControlPlaneError, binaries_dir, binary_version

    try:
        version = binary_version(binaries_dir())
    except (ControlPlaneError, OSError) as e:
        version = f"unknown ({e})"
    counts = Counter(_VERSIONS_OUTCOMES.values())
    line = {"kubernetes": version, **{k: counts.get(k, 0) for k in ("passed", "failed", "skipped")}}
    with open(target, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_pytests_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every temporary file or directory the tiers make, in this process and in the processes they
    start (certificates, manager logs and run directories, control plane data), goes under pytest's
    base temporary directory, of which pytest keeps the last three runs: a failed run can still be
    read afterwards, and runs do not pile up in /tmp (a full run made about 80 entries there)."""
    where = tmp_path_factory.mktemp("tmp", numbered=False)
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = str(where)
    os.environ["TMPDIR"] = str(where)
    try:
        yield
    finally:
        tempfile.tempdir = saved[0]
        if saved[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[1]


@pytest.fixture(scope="session")
def aloop() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()
