"""The package boundaries of DESIGN.md, enforced: certwatcher imports nothing of ours, sidecarsets
never imports injector, and nothing in the product imports the tests."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = ("injector", "sidecarsets", "certwatcher", "tests")
FORBIDDEN = {
    "certwatcher": {"injector", "sidecarsets", "tests"},
    "sidecarsets": {"injector", "tests"},
    "injector": {"tests"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & set(OURS)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_its_boundary(package: str) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    offenders = {str(f.relative_to(REPO)): sorted(bad) for f in files if (bad := _imports(f) & FORBIDDEN[package])}
    assert offenders == {}
