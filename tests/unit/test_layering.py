"""The package arrows of the README's code map, enforced on every import statement.

kuberuntime knows nothing of ours; certwatcher, sidecarsets and injector build on it (injector
also reads the sidecarsets model); sidecarctl, the program, wires them all and nothing in the
product imports it. bench/ and tools/ may use the product and the test helpers of tests/kube
(by design: the demo and the benchmarks drive the same control plane and fakes as the tests),
never a test module itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("kuberuntime", "certwatcher", "sidecarsets", "injector", "sidecarctl")
TOP = (*PRODUCT, "tests", "bench", "tools")
# package -> the top-level packages of ours it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "kuberuntime": set(),
    "certwatcher": {"kuberuntime"},
    "sidecarsets": {"kuberuntime"},
    "injector": {"kuberuntime", "sidecarsets"},
    "sidecarctl": {"kuberuntime", "certwatcher", "sidecarsets", "injector"},
    "bench": {*PRODUCT, "tests.kube"},
    "tools": {*PRODUCT, "tests.kube"},
}


def _imports(path: Path) -> set[str]:
    """Modules of ours imported by `path`, as dotted names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {m for m in found if m.split(".")[0] in TOP}


def _allowed(package: str, module: str) -> bool:
    if module.split(".")[0] == package:
        return True
    return any(module == a or module.startswith(a + ".") for a in ALLOWED[package])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_respects_its_arrows(package: str) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    offenders: dict[str, list[str]] = {}
    for f in files:
        found = _imports(f)
        # `from tests.kube import client` names both tests.kube and tests.kube.client: judge the longest.
        bad = {
            m
            for m in found
            if not _allowed(package, m) and not any(o.startswith(m + ".") and _allowed(package, o) for o in found)
        }
        if bad:
            offenders[str(f.relative_to(REPO))] = sorted(bad)
    assert offenders == {}


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text("from sidecarsets import model\nimport injector.engine\nfrom tests.kube.client import Kube\n")
    found = _imports(source)
    assert {"sidecarsets.model", "injector.engine", "tests.kube.client"} <= found
    assert not _allowed("kuberuntime", "sidecarsets.model")
    assert not _allowed("sidecarsets", "injector.engine")
    assert _allowed("tools", "tests.kube.client")
    assert not _allowed("bench", "tests.unit.podbuild")
