"""Golden injection cases, replayed through `sidecarctl inject` and through the engine directly.

`SIDECARCTL_UPDATE_GOLDEN=1 pytest tests/unit/engine/test_golden.py` rewrites the expected files from
the CLI's output; every rewritten file is a claim about behaviour and is reviewed before commit.
"""

from __future__ import annotations

import os

import jsonpatch
import pytest

from injector.engine import engine
from injector.manifests import manifests
from sidecarctl.cli import main as cli
from sidecarsets.spec.model import SidecarSet
from tests.golden_cases import GOLDEN_NOW, GoldenCase, cases

UPDATE = os.environ.get("SIDECARCTL_UPDATE_GOLDEN") == "1"
CASES = cases()
POD_CASES = [c for c in CASES if c.has_pods]


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 25
    assert len(POD_CASES) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cli(case: GoldenCase, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(case.cli_argv())
    out, err = capsys.readouterr()
    assert code == 0, err
    err = err.replace(f"{case.dir}/", "")  # warnings about a file name it; the case's own names stay short
    expected_path = case.dir / "expected.yaml"
    warnings_path = case.dir / "expected.warnings"
    if UPDATE:
        expected_path.write_text(out, encoding="utf-8")
        if err:
            warnings_path.write_text(err, encoding="utf-8")
        elif warnings_path.exists():
            warnings_path.unlink()
        return
    assert out == expected_path.read_text(encoding="utf-8")
    assert err.splitlines() == case.expected_warnings


@pytest.mark.skipif(UPDATE, reason="expected files are being rewritten")
@pytest.mark.parametrize("case", POD_CASES, ids=[c.name for c in POD_CASES])
def test_engine(case: GoldenCase) -> None:
    """The engine's patch, applied by jsonpatch, gives the CLI's pod; its warnings are the CLI's."""
    sidecarsets = [SidecarSet.from_object(obj) for obj in case.sidecarsets]
    for pod, expected in case.pods():
        ns = pod["metadata"].get("namespace")
        namespace, scoped = manifests.scope(ns, sidecarsets)
        result = engine.inject(
            pod,
            namespace=namespace,
            namespace_labels=case.namespace_labels.get(namespace),
            sidecarsets=scoped,
            now=GOLDEN_NOW,
            require_namespace_label=False,
        )
        assert result.denied is None
        assert jsonpatch.apply_patch(pod, result.patch) == expected
        where = manifests.describe(pod)
        for warning in result.warnings:
            assert f"warning: {where}: {warning}" in case.expected_warnings
        assert bool(result.patch) == (pod != expected)
