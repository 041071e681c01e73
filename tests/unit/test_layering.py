"""The arrows between the rooms of the README's code map, enforced on every import statement.

kuberuntime knows nothing of ours. Within sidecarsets the rooms import downwards only: values <-
spec <- validation, pods <- rollout <- controller (which also reads validation's Pod Security
checks), with the admission store and pins beside them
reading the spec, and per-pod overrides (reading the spec) below the rooms that inject, resize or
explain with them. Within injector: engine <- policy <- policysync, and policy <- http and
manifests, none of them reading the SidecarSet controller or rollout. The three TLS jobs are three
packages: certwatcher (serving the certificate) knows only kuberuntime; cabundle (publishing the
CA) and selfsigned (issuing into a Secret) read certwatcher's certificate files and checks, never
each other. sidecarctl, the program, wires everything; its manager never imports its cli, and
nothing in the product imports sidecarctl. bench/ and tools/ may use the product and the test
helpers of tests/kube (the demo and the benchmarks drive the same control plane and fakes as the
tests), and bench/ the Kruise oracle harness of tests/kruise (bench_kruise times Kruise's code
through it), never a test module itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("kuberuntime", "certwatcher", "cabundle", "selfsigned", "sidecarsets", "injector", "sidecarctl")
TOP = (*PRODUCT, "tests", "bench", "tools")

_SPEC = {"sidecarsets.values", "sidecarsets.spec", "kuberuntime"}
# Per-pod overrides read the spec only, and every room that injects, resizes or explains reads them.
_OVERRIDES = "sidecarsets.overrides"
_ADMISSION_READS = {*_SPEC, _OVERRIDES, "sidecarsets.validation", "sidecarsets.store", "sidecarsets.pins"}
# room -> the rooms of ours it may import (itself always allowed). A room is a package or a
# module; a module belongs to the longest room that names it.
ALLOWED: dict[str, set[str]] = {
    "kuberuntime": set(),
    "certwatcher": {"kuberuntime"},
    "cabundle": {"kuberuntime", "certwatcher.pem"},
    "selfsigned": {"kuberuntime", "certwatcher.pem", "certwatcher.files", "certwatcher.atomicdir", "certwatcher.tls"},
    "sidecarsets": set(),  # the package's own __init__: documentation only
    "sidecarsets.values": {"kuberuntime"},
    "sidecarsets.spec": _SPEC,
    "sidecarsets.validation": _SPEC,
    "sidecarsets.overrides": _SPEC,
    "sidecarsets.pods": _SPEC,
    "sidecarsets.rollout": {*_SPEC, _OVERRIDES, "sidecarsets.pods"},
    # the Pod Security condition reuses validation's checks
    "sidecarsets.controller": {
        *_SPEC,
        _OVERRIDES,
        "sidecarsets.validation",
        "sidecarsets.pods",
        "sidecarsets.rollout",
    },
    "sidecarsets.store": _SPEC,
    "sidecarsets.pins": {*_SPEC, "sidecarsets.store"},
    "injector": set(),
    "injector.engine": {*_SPEC, _OVERRIDES},
    "injector.policy": {*_SPEC, "injector.engine"},
    "injector.policysync": {*_SPEC, "injector.engine", "injector.policy"},
    "injector.http": {*_ADMISSION_READS, "injector.engine", "injector.policy"},
    "injector.manifests": {*_ADMISSION_READS, "injector.engine", "injector.policy"},
    "sidecarctl": set(),
    "sidecarctl.manager": {"kuberuntime", "certwatcher", "cabundle", "selfsigned", "sidecarsets", "injector"},
    "sidecarctl.cli": {
        "kuberuntime",
        "certwatcher",
        "cabundle",
        "selfsigned",
        "sidecarsets",
        "injector",
        "sidecarctl.manager",
    },
    "bench": {*PRODUCT, "tests.kube", "tests.kruise.oracle", "tests.kruise.compare"},
    "tools": {*PRODUCT, "tests.kube"},
}


def room_of(module: str) -> str:
    """The longest room that is `module` or one of its parents."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in ALLOWED:
            return candidate
    raise KeyError(module)


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


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


def _allowed(room: str, module: str) -> bool:
    if module == room or module.startswith(room + "."):
        return True
    return any(module == a or module.startswith(a + ".") for a in ALLOWED[room])


def bad_imports(room: str, found: set[str]) -> set[str]:
    """The imports in `found` that `room` may not make."""
    # `from tests.kube import client` names both tests.kube and tests.kube.client, and
    # `from sidecarsets.spec import names` both the package and the module: judge the longest.
    return {
        m
        for m in found
        if not _allowed(room, m) and not any(o.startswith(m + ".") and _allowed(room, o) for o in found)
    }


def offenders(files: list[Path]) -> dict[str, list[str]]:
    """Each file's imports that its room may not make."""
    out: dict[str, list[str]] = {}
    for f in files:
        bad = bad_imports(room_of(module_name(f)), _imports(f))
        if bad:
            out[str(f.relative_to(REPO))] = sorted(bad)
    return out


TOPS = sorted({room.split(".")[0] for room in ALLOWED})


@pytest.mark.parametrize("package", TOPS)
def test_package_respects_its_arrows(package: str) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    assert offenders(files) == {}


def test_every_room_of_the_product_is_a_package_with_a_docstring() -> None:
    """Each room's `__init__.py` opens with what it holds and what it may import."""
    for room in ALLOWED:
        path = REPO / room.replace(".", "/")
        if room.split(".")[0] not in PRODUCT or not path.is_dir():
            continue
        doc = ast.get_docstring(ast.parse((path / "__init__.py").read_text()))
        assert doc and "import" in doc, room


def test_no_product_folder_holds_more_than_15_modules() -> None:
    for package in PRODUCT:
        for folder in [REPO / package, *(p for p in (REPO / package).rglob("*") if p.is_dir())]:
            modules = [p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
            assert len(modules) <= 15, (folder, len(modules))


def test_no_product_module_over_400_lines_and_no_function_over_80() -> None:
    """A module a reader can hold, a function a screen can show."""
    too_long = []
    for package in PRODUCT:
        for path in (REPO / package).rglob("*.py"):
            source = path.read_text()
            lines = source.count("\n")
            if lines > 400:
                too_long.append((str(path.relative_to(REPO)), "module", lines))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > 80:
                        too_long.append((str(path.relative_to(REPO)), node.name, length))
    assert not too_long, too_long


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text(
        "from sidecarsets.spec import model\nimport injector.engine.engine\nfrom tests.kube.client import Kube\n"
    )
    found = _imports(source)
    assert {"sidecarsets.spec.model", "injector.engine.engine", "tests.kube.client"} <= found
    assert room_of("sidecarsets.spec.model") == "sidecarsets.spec"
    assert room_of("sidecarsets.store") == "sidecarsets.store"
    assert room_of("injector.http.app") == "injector.http"
    assert not _allowed("kuberuntime", "sidecarsets.spec.model")
    assert not _allowed("sidecarsets.spec", "sidecarsets.rollout.planner")
    assert not _allowed("sidecarsets.spec", "sidecarsets.controller.controller")
    assert not _allowed("sidecarsets.rollout", "sidecarsets.controller.podwrites")
    assert not _allowed("injector.engine", "injector.http.admission")
    assert not _allowed("injector.engine", "injector.policy.plan")
    assert not _allowed("injector.http", "sidecarsets.controller.controller")
    assert not _allowed("sidecarctl.manager", "sidecarctl.cli.injectcmd")
    assert _allowed("sidecarsets.rollout", "sidecarsets.pods.projection")
    assert _allowed("injector.http", "injector.engine.engine")
    assert _allowed("tools", "tests.kube.client")
    assert not _allowed("bench", "tests.unit.podbuild")


def test_a_bad_import_in_a_real_room_is_reported() -> None:
    """The whole check, on a real module's imports plus one its room may not make."""
    real = REPO / "sidecarsets" / "spec" / "hashing.py"
    room = room_of(module_name(real))
    assert room == "sidecarsets.spec"
    assert offenders([real]) == {}
    found = _imports(real) | {"sidecarsets.rollout.planner", "sidecarsets.controller"}
    assert bad_imports(room, found) == {"sidecarsets.rollout.planner", "sidecarsets.controller"}
