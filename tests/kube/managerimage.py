"""The manager's own image, built from the repository's Dockerfile on a machine without a registry.

The Dockerfile's default base (`python:3.11-slim-bookworm`) lives in a registry this machine cannot
reach, so the base is made here from Debian's packages: a bookworm root filesystem from the apt
mirror (debootstrap, minbase plus python3 3.11, venv, pip and `python-is-python3`, which gives
`python` the name the Dockerfile uses, as the public image does), saved as an image archive and
passed in as the `PYTHON_IMAGE` build argument. The Dockerfile a user builds is unchanged.

The builder is Debian's buildah, daemonless: `buildah bud` with chroot isolation and the host
network (no CNI set-up, no firewall rules), storage in a throwaway directory with the vfs driver
(no overlay mounts to leak), the result pushed to a `docker save` archive. Both archives are cached
under ~/.cache/sidecarctl/images, named by a hash of their inputs (for the manager image: the
base, the Dockerfile, .dockerignore and every file it lets into the build context), so a warm run
costs the hashing only.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.kube.images import cache_root

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
BASE_REF = "localhost/sidecarctl-base:bookworm-python3.11"
BASE_FORMAT = "sidecarctl-base/1"  # bump when the base recipe below changes
# Trimmed from the base as the slim public image does: package lists, caches and documentation.
TRIM = (
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/cache/debconf",
    "var/log",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
)
POLICY = {"default": [{"type": "insecureAcceptAnything"}]}  # local archives only; nothing is pulled


def manager_image_ref() -> str:
    """The image config/manager/deployment.yaml names, as containerd normalises it (`sidecarctl:0.1.0`
    is docker.io/library/sidecarctl:0.1.0), so the shipped Deployment finds the imported image."""
    deployment = yaml.safe_load((REPO / "config" / "manager" / "deployment.yaml").read_text())
    image: str = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    first = image.split("/")[0]
    if "/" not in image:
        return f"docker.io/library/{image}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{image}"
    return image


class ImageBuildError(RuntimeError):
    """A step of the image build failed; the message has its command and output tail."""


@dataclasses.dataclass
class Built:
    """A cached image archive and what it cost (seconds 0.0 when it came from the cache)."""

    archive: Path
    ref: str
    seconds: float
    cached: bool

    @property
    def size(self) -> int:
        return self.archive.stat().st_size


def _run(args: list[str], *, timeout: float = 1800, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise ImageBuildError(f"{' '.join(args[:4])} ... failed with {proc.returncode}:\n{tail}")
    return proc.stdout


def _unmount_under(prefix: Path) -> None:
    """debootstrap and buildah mount /proc and friends inside their trees; a failed run can leave them."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for _ in range(10):
        points = [
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(str(prefix) + "/")
        ]
        if not points:
            return
        for p in sorted(points, key=len, reverse=True):
            libc.umount2(p.encode(), 2)


@contextlib.contextmanager
def _scratch(parent: Path) -> Iterator[Path]:
    parent.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=".build-", dir=parent))
    try:
        yield d
    finally:
        _unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _write_docker_archive(rootfs: Path, out: Path, ref: str) -> None:
    """One layer with the whole tree (numeric owners, hard links kept; /dev, /proc, /sys left empty)."""
    work = out.parent / (out.name + ".d")
    work.mkdir()
    layer = work / "layer.tar"
    _run(
        [
            "tar",
            "--numeric-owner",
            "--sort=name",
            "--xattrs",
            "-C",
            str(rootfs),
            "--exclude=./dev/*",
            "--exclude=./proc/*",
            "--exclude=./sys/*",
            "-cf",
            str(layer),
            ".",
        ]
    )
    digest = hashlib.sha256()
    with layer.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    diff_id = digest.hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
                "Cmd": ["python3"],
                "Labels": {
                    "org.opencontainers.image.description": f"Debian {SUITE} minbase + {' '.join(BASE_PACKAGES)}"
                },
            },
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
            "history": [{"created_by": f"debootstrap --variant=minbase {SUITE} {MIRROR}"}],
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    (work / config_name).write_bytes(config)
    (work / diff_id).mkdir()
    layer.rename(work / diff_id / "layer.tar")
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [f"{diff_id}/layer.tar"]}]
    (work / "manifest.json").write_text(json.dumps(manifest))
    with tarfile.open(out, "w") as tar:
        for name in ("manifest.json", config_name, diff_id):
            tar.add(work / name, arcname=name)
    shutil.rmtree(work)


def base_archive() -> Built:
    """The Debian bookworm + Python 3.11 base, as an image archive; built on a cache miss (minutes)."""
    key = _key(BASE_FORMAT, SUITE, MIRROR, BASE_PACKAGES, TRIM, BASE_REF)
    out = cache_root() / "images" / f"base-{SUITE}-{key}.tar"
    if out.exists():
        return Built(out, BASE_REF, 0.0, True)
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is missing: install it (tools/setup-node.sh does)")
    started = time.monotonic()
    with _scratch(out.parent) as tmp:
        rootfs = tmp / "rootfs"
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), MIRROR])
        _unmount_under(tmp)
        for rel in TRIM:
            target = rootfs / rel
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        _write_docker_archive(rootfs, tmp / "base.tar", BASE_REF)
        os.replace(tmp / "base.tar", out)
    return Built(out, BASE_REF, time.monotonic() - started, False)


def context_files() -> list[Path]:
    """The build context as .dockerignore lets it in (an allowlist), without bytecode."""
    lines = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()]
    allowed = [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]
    files: list[Path] = []
    for rel in allowed:
        p = REPO / rel
        if p.is_dir():
            files += [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"]
        elif p.is_file():
            files.append(p)
    return sorted(files)


def _inputs_hash(base: Built) -> str:
    h = hashlib.sha256()
    for f in [REPO / "Dockerfile", REPO / ".dockerignore", *context_files()]:
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    buildah = _run(["buildah", "--version"]).strip()
    return _key(base.archive.name, h.hexdigest(), buildah, manager_image_ref())


def _host_trust() -> list[str]:
    """RUN steps see this machine's CA bundle (not baked into the image): pip must reach PyPI from
    wherever this runs, including networks whose proxy re-signs TLS with a CA only the host trusts."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    return ["--volume", f"{bundle}:{bundle}:ro"] if bundle.exists() else []


def manager_archive() -> Built:
    """The image of the repository's Dockerfile, built with buildah on the local base (cached)."""
    base = base_archive()
    ref = manager_image_ref()
    if shutil.which("buildah") is None:
        raise ImageBuildError("buildah is missing: install it (tools/setup-node.sh does)")
    out = cache_root() / "images" / f"manager-{_inputs_hash(base)}.tar"
    if out.exists():
        return Built(out, ref, 0.0, True)
    started = time.monotonic()
    with _scratch(out.parent) as tmp:
        policy = tmp / "policy.json"
        policy.write_text(json.dumps(POLICY))
        store = ["--root", str(tmp / "storage"), "--runroot", str(tmp / "run"), "--storage-driver", "vfs"]
        env = {**os.environ, "BUILDAH_ISOLATION": "chroot", "TMPDIR": str(tmp)}
        _run(["buildah", *store, "pull", "--signature-policy", str(policy), f"docker-archive:{base.archive}"], env=env)
        _run(
            [
                "buildah",
                *store,
                "bud",
                "--signature-policy",
                str(policy),
                "--isolation",
                "chroot",
                "--network",
                "host",
                "--pull=never",
                *_host_trust(),
                "--build-arg",
                f"PYTHON_IMAGE={BASE_REF}",
                "-f",
                str(REPO / "Dockerfile"),
                "-t",
                ref,
                str(REPO),
            ],
            env=env,
        )
        archive = tmp / "manager.tar"
        _run(
            ["buildah", *store, "push", "--signature-policy", str(policy), ref, f"docker-archive:{archive}:{ref}"],
            env=env,
        )
        os.replace(archive, out)
    _prune(out.parent, "manager-*.tar", keep=3)
    return Built(out, ref, time.monotonic() - started, False)


def _prune(directory: Path, pattern: str, *, keep: int) -> None:
    """Every source change makes a new ~330 MiB archive: keep the newest few (other checkouts may use them)."""
    for old in sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)[keep:]:
        old.unlink(missing_ok=True)
