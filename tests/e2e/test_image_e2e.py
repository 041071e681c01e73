"""What the container image runs, without a Docker engine: the Dockerfile's install, replayed.

The Dockerfile builds a wheel from the files .dockerignore lets in and installs it with
`pip install -c constraints.txt` into a fresh venv, then removes pip and setuptools from it. This
module does the same in a temp dir (once per session: it takes a while), then runs the installed
`sidecarctl` from outside the repository, so only what the wheel ships is importable: `--help`
of each command, and `sidecarctl run --self-signed` against the test control plane until /readyz
answers 200, then SIGTERM, which must end it with status 0 within 10 s. That manager uses its own
Lease, Secret and webhook configurations (selecting no object), so the session manager is undisturbed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube.client import Kube, eventually
from tests.kube.controlplane import REPO, ControlPlane, free_port
from tests.kube.images import cache_root
from tests.kube.managerharness import MANAGER_NS, MWC_PATH, VWC_PATH, ensure_namespace, probe, webhook_configs

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
TERM_DEADLINE = 10.0


# ---------------------------------------------------------------------------------------------
# The Dockerfile and its build context


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """(instruction, arguments) per stage, with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), " ".join(rest.split())))
    return stages


def context_allowlist() -> list[str]:
    """The paths .dockerignore lets into the build context (it must be an allowlist)."""
    lines = [ln.strip() for ln in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    assert lines[0] == "*", ".dockerignore must start by excluding everything"
    return [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]


def test_dockerfile_builds_a_wheel_and_runs_it_unprivileged_from_a_venv() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage: build tools stay in the builder"
    bases = [args.split()[0] for (_, args), *_ in stages]
    args_defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(encoding="utf-8"), flags=re.MULTILINE))
    resolved = [re.sub(r"\$\{(\w+)\}", lambda m: args_defaults[m.group(1)], b) for b in bases]
    assert all(re.fullmatch(r"python:3\.11-slim(-\w+)?", b) for b in resolved), resolved

    builder, final = stages[0], stages[-1]
    assert any(i == "RUN" and "pip wheel" in a and "--no-deps" in a for i, a in builder)
    final_runs = " ".join(a for i, a in final if i == "RUN")
    assert "-c /tmp/constraints.txt" in final_runs and "sidecarctl-*.whl" in final_runs
    assert "python -m venv" in final_runs
    assert "uninstall -y setuptools pip" in final_runs
    for tool in ("apt-get", "gcc", "build-essential", "apk add"):
        assert tool not in final_runs, f"{tool} in the runtime stage"
    assert not [a for i, a in final if i in ("COPY", "ADD")], "the runtime stage copies nothing into a layer"

    env = " ".join(a for i, a in final if i == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    (user,) = [a for i, a in final if i == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric non-root UID (runAsNonRoot can only check numbers)"
    entrypoints = [a for i, a in final if i == "ENTRYPOINT"]
    assert [json.loads(e) for e in entrypoints] == [["sidecarctl", "run"]]
    labels = " ".join(a for i, a in final if i == "LABEL")
    for label in ("org.opencontainers.image.title", "org.opencontainers.image.version"):
        assert label in labels
    (expose,) = [a for i, a in final if i == "EXPOSE"]
    assert set(expose.split()) == {"9443", "8080"}

    allowed = context_allowlist()
    for needed in (
        "pyproject.toml",
        "constraints.txt",
        "injector",
        "sidecarsets",
        "certwatcher",
        "cabundle",
        "selfsigned",
    ):
        assert needed in allowed, f".dockerignore keeps {needed} out of the build context"


# ---------------------------------------------------------------------------------------------
# The install, replayed


def _run(*args: str | Path, cwd: Path | None = None, timeout: float = 300) -> str:
    proc = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=_clean_env(), check=False
    )
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _clean_env() -> dict[str, str]:
    """The environment without anything that would let the repository's code in."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SIDECARCTL_")}


def _wheelhouse() -> list[str]:
    """pip's options to install from the wheelhouse tools/setup.sh fills once per pin set (the same
    pinned versions PyPI serves, without asking PyPI about each again), or none if it is not there."""
    deps = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + (REPO / "constraints.txt").read_bytes())
    house = cache_root() / "wheels" / deps.hexdigest()[:16]
    return ["--no-index", "--find-links", str(house)] if (house / ".complete").exists() else []


@pytest.fixture(scope="session")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runtime stage's venv: the wheel built from the build context, installed with the constraints."""
    root = tmp_path_factory.mktemp("image")
    context = root / "context"
    context.mkdir()
    for rel in context_allowlist():
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, context / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, context / rel)
    wheels = root / "wheels"
    offline = _wheelhouse()
    _run(sys.executable, "-m", "pip", "wheel", *offline, "--no-deps", "--wheel-dir", wheels, ".", cwd=context)
    (wheel,) = wheels.glob("sidecarctl-*.whl")
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", *offline, "-q", "-c", context / "constraints.txt", wheel)
    _run(venv / "bin" / "pip", "uninstall", "-q", "-y", "setuptools", "pip")
    return venv


def test_installed_commands_answer_help_from_the_wheel_alone(image_venv: Path, tmp_path: Path) -> None:
    exe = image_venv / "bin" / "sidecarctl"
    top = _run(exe, "--help", cwd=tmp_path)
    assert "run" in top and "inject" in top
    assert "--sidecarset" in _run(exe, "inject", "--help", cwd=tmp_path)
    assert "--self-signed" in _run(exe, "run", "--help", cwd=tmp_path)
    where = _run(
        image_venv / "bin" / "python", "-c", "import injector, sidecarsets; print(injector.__file__)", cwd=tmp_path
    )
    assert Path(where.strip()).is_relative_to(image_venv), "imported from the repository, not the installed wheel"
    assert not (image_venv / "bin" / "pip").exists(), "pip is removed from the runtime venv"


def _configs(url: str, suffix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Webhook configurations of their own that select no object: harmless to the rest of the session."""
    mwc, vwc = webhook_configs(url, mutating=f"image-{suffix}-injector", validating=f"image-{suffix}-validator")
    never = {"matchLabels": {f"sidecarctl.io/test-image-{suffix}": "never"}}
    for config in (mwc, vwc):
        for hook in config["webhooks"]:
            hook["objectSelector"] = never
    return mwc, vwc


@pytest.fixture
def suffix(kube: Kube) -> Iterator[str]:
    value = secrets.token_hex(3)
    yield value
    kube.delete(f"{MWC_PATH}/image-{value}-injector")
    kube.delete(f"{VWC_PATH}/image-{value}-validator")
    kube.delete(f"/api/v1/namespaces/{MANAGER_NS}/secrets/image-{value}-certs")
    kube.delete(f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/image-{value}")


def test_installed_manager_becomes_ready_and_stops_cleanly_on_sigterm(
    image_venv: Path, control_plane: ControlPlane, kube: Kube, crd: dict[str, Any], suffix: str, tmp_path: Path
) -> None:
    ensure_namespace(kube, MANAGER_NS)
    webhook_port, probe_port = free_port(), free_port()
    mwc, vwc = _configs(f"https://127.0.0.1:{webhook_port}", suffix)
    kube.create(MWC_PATH, mwc)
    kube.create(VWC_PATH, vwc)
    identity = f"image-{suffix}"
    log_path = tmp_path / "manager.log"
    args = [
        str(image_venv / "bin" / "sidecarctl"),
        "run",
        f"--kubeconfig={control_plane.kubeconfig}",
        "--self-signed",
        "--extra-ip",
        "127.0.0.1",
        f"--cert-dir={tmp_path / 'certs'}",
        f"--webhook-bind=127.0.0.1:{webhook_port}",
        f"--probe-bind=127.0.0.1:{probe_port}",
        f"--lease-name=image-{suffix}",
        f"--secret-name=image-{suffix}-certs",
        f"--mutating-config={mwc['metadata']['name']}",
        f"--validating-config={vwc['metadata']['name']}",
        "--conversion-crd=",  # its own CA: the session's manager keeps the shared CRD's caBundle
        f"--identity={identity}",
        "--log-format=text",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=_clean_env())
    probe_url = f"http://127.0.0.1:{probe_port}"

    def log_tail() -> str:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])

    try:

        def ready() -> bool:
            assert proc.poll() is None, f"manager exited with {proc.returncode}:\n{log_tail()}"
            return probe(probe_url + "/readyz") == 200

        eventually(ready, timeout=30, interval=0.1, what="/readyz of the installed manager")
        assert probe(probe_url + "/healthz") == 200
        assert probe(probe_url + "/metrics") == 200

        def bundle_synced() -> bool:
            got = kube.get(f"{MWC_PATH}/{mwc['metadata']['name']}")["webhooks"][0]["clientConfig"]
            return b"BEGIN CERTIFICATE" in base64.b64decode(got.get("caBundle") or "")

        eventually(bundle_synced, timeout=20, what="caBundle of its own configuration synced")
        secret = kube.get(f"/api/v1/namespaces/{MANAGER_NS}/secrets/image-{suffix}-certs")
        assert secret["type"] == "kubernetes.io/tls"
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/image-{suffix}"
        eventually(lambda: kube.get(lease_path)["spec"].get("holderIdentity") == identity, timeout=20)

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=TERM_DEADLINE)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {TERM_DEADLINE}s after SIGTERM:\n{log_tail()}") from None
        took = time.monotonic() - started
        assert code == 0, f"exit status {code} after SIGTERM:\n{log_tail()}"
        assert kube.get(lease_path)["spec"].get("holderIdentity") in ("", None), "Lease released on SIGTERM"
        assert "Traceback" not in log_path.read_text(errors="replace"), log_tail()
        print(f"\ninstalled manager stopped {took:.2f}s after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
