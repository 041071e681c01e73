"""helm and kubectl for the chart tests: the binaries tools/build-control-plane.sh keeps in its cache.

helm is built with the real-node binaries (`build-control-plane.sh --node`, which tools/setup.sh
runs as root); kubectl with the control plane. Neither is looked up on PATH: the tests must run the
versions the project pins.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.ci import IN_CI
from tests.kube.controlplane import BUILD_SCRIPT, REPO, ControlPlaneError, binaries_dir, supported_versions

CHART = REPO / "charts" / "sidecarctl"
CONFIG = REPO / "config"
Obj = dict[str, Any]


def cache_dir() -> Path:
    """The newest version's build cache directory, where helm is built with the node binaries,
    without building anything (`build-control-plane.sh --dir`)."""
    newest = supported_versions()[-1]
    args = ["bash", str(BUILD_SCRIPT), "--dir", "--version", newest]
    proc = subprocess.run(args, capture_output=True, text=True, check=True)
    return Path(proc.stdout.strip())


def cached_binary(name: str) -> Path | None:
    """`name` from the control plane's binaries ($KUBEBUILDER_ASSETS or the cache) or the cache, if built."""
    dirs = [cache_dir()]
    with contextlib.suppress(ControlPlaneError):
        dirs.insert(0, binaries_dir())
    return next((d / name for d in dirs if (d / name).exists()), None)


def missing_reason(*names: str) -> str | None:
    absent = [n for n in names if cached_binary(n) is None]
    if not absent:
        return None
    script = BUILD_SCRIPT.relative_to(REPO)
    return f"{' and '.join(absent)} not built: run `bash {script} --node` (tools/setup.sh does, as root)"


def require(*names: str, checking: str) -> None:
    """Skip unless the binaries `names` are built; under CI=true, fail instead (naming what cannot
    be checked: `checking`)."""
    if reason := missing_reason(*names):
        if IN_CI:
            pytest.fail(f"{checking} cannot be checked under CI=true: {reason}", pytrace=False)
        pytest.skip(reason)


def run(binary: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    path = cached_binary(binary)
    assert path is not None, missing_reason(binary)
    return subprocess.run([str(path), *args], capture_output=True, text=True, timeout=timeout, check=False)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{' '.join(map(str, proc.args))} failed ({proc.returncode}):\n{proc.stderr}"
    return proc.stdout


def docs(text: str) -> list[Obj]:
    return [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]


def helm_template(*args: str, chart: Path = CHART) -> list[Obj]:
    """`helm template sidecarctl CHART ARGS...` as objects."""
    return docs(ok(run("helm", "template", "sidecarctl", str(chart), *args)))


def template_sources(*args: str, chart: Path = CHART) -> dict[tuple[str, str, str], str]:
    """Which chart template rendered each object ((kind, namespace, name) -> path in the repository)."""
    out: dict[tuple[str, str, str], str] = {}
    for chunk in ok(run("helm", "template", "sidecarctl", str(chart), *args)).split("\n---"):
        lines = chunk.splitlines()
        source = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("# Source:")), "")
        for obj in docs(chunk):
            meta = obj.get("metadata") or {}
            key = (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))
            out[key] = str(Path("charts") / source) if source else "charts/sidecarctl"
    return out


def config_sources(directory: Path) -> dict[tuple[str, str, str], str]:
    """Which file under config/ holds each object a kustomization lists (following `resources` only)."""
    out: dict[tuple[str, str, str], str] = {}
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    for entry in kustomization.get("resources") or []:
        target = (directory / entry).resolve()
        if target.is_dir():
            out.update(config_sources(target))
            continue
        for obj in docs(target.read_text(encoding="utf-8")):
            meta = obj.get("metadata") or {}
            key = (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))
            out[key] = str(target.relative_to(REPO))
    return out


def kustomize(directory: Path) -> list[Obj]:
    return docs(ok(run("kubectl", "kustomize", str(directory))))
