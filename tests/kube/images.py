"""Container images for the real-node tier, made without a registry or an image builder.

No registry is reachable from the test machines, so every image a test pod runs is built here from
Debian's static busybox and imported into the node's containerd (`ctr images import`). The images
are written directly in the `docker save` layout (manifest.json, one config and uncompressed
layer tars), byte for byte reproducible (fixed timestamps, owners and order), so a content hash of
the inputs names the cached archive and a warm run only hashes them. All images share one busybox
layer, so the archive stays ~2 MB and one import brings in every image.

Each image's behaviour is spelled out in its entrypoint because that is what the tests rely on:
the sidecars trap SIGTERM and exit 0 (a busybox process run as PID 1 would otherwise ignore it),
the "stubborn" sidecar ignores it (the kubelet must wait out the grace period and SIGKILL it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

BUSYBOX = Path("/bin/busybox")
SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"
FORMAT = "sidecarctl-test-images/1"  # bump when the archive layout below changes
EPOCH = "1970-01-01T00:00:00Z"

# A reference that can never be pulled: a registry on 127.0.0.1 port 1, where nothing listens, so a
# pull fails at once with "connection refused" and sends nothing off the machine.
BAD_IMAGE = "127.0.0.1:1/sidecarctl/never-pullable:v1"
PAUSE_IMAGE = "sidecarctl.local/pause:1"
APP_IMAGE = "sidecarctl.local/app:1"
SIDECAR_PORT = 15020
APP_PORT = 8080


def sidecar_image(version: str) -> str:
    return f"sidecarctl.local/sidecar:{version}"


def stubborn_image(version: str) -> str:
    return f"sidecarctl.local/sidecar-stubborn:{version}"


def cache_root() -> Path:
    """The per-machine cache shared with tools/build-control-plane.sh (same variables, same default)."""
    if explicit := os.environ.get("SIDECARCTL_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sidecarctl"


@dataclasses.dataclass(frozen=True)
class Spec:
    """One image: its reference, entrypoint, and the files of its own layer (path -> text)."""

    ref: str
    entrypoint: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()
    env: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    ports: tuple[int, ...] = ()


def _httpd(port: int, *, on_term: str) -> tuple[str, ...]:
    # httpd in the background and the shell waiting for it: the shell is PID 1 and owns the signal policy.
    script = f"{on_term}; httpd -f -p {port} -h /www & while :; do sleep 3600 & wait $!; done"
    return ("/bin/sh", "-c", script)


def _sidecar(ref: str, version: str, *, stubborn: bool) -> Spec:
    on_term = "trap '' TERM" if stubborn else "trap 'exit 0' TERM"
    return Spec(
        ref=ref,
        entrypoint=_httpd(SIDECAR_PORT, on_term=on_term),
        files=(("www/ready", "ok\n"), ("www/version", f"{version}\n"), ("etc/sidecar-version", f"{version}\n")),
        env=(f"SIDECAR_VERSION={version}",),
        labels=(("org.opencontainers.image.version", version),),
        ports=(SIDECAR_PORT,),
    )


def catalog() -> tuple[Spec, ...]:
    """Every busybox image the node tier uses."""
    specs = [
        # The sandbox ("pause") container only has to hold the pod's namespaces open.
        Spec(ref=PAUSE_IMAGE, entrypoint=("/bin/sleep", "2147483647")),
        Spec(
            ref=APP_IMAGE,
            entrypoint=_httpd(APP_PORT, on_term="trap 'exit 0' TERM"),
            files=(("www/index.html", "app\n"), ("www/ready", "ok\n")),
            ports=(APP_PORT,),
        ),
    ]
    for version in ("v1", "v2"):
        specs.append(_sidecar(sidecar_image(version), version, stubborn=False))
        specs.append(_sidecar(stubborn_image(version), version, stubborn=True))
    return tuple(specs)


# -- the archive --------------------------------------------------------------------------------


def _add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, mode: int = 0o644, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if link:
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
        tar.addfile(info)
    elif data is None:
        info.type, info.mode = tarfile.DIRTYPE, mode
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))


def _layer(build: Callable[[tarfile.TarFile], None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        build(tar)
    return buf.getvalue()


def _base_layer(busybox: bytes, applets: list[str]) -> bytes:
    def build(tar: tarfile.TarFile) -> None:
        for d in ("bin", "dev", "etc", "proc", "sys", "www"):
            _add(tar, d, mode=0o755)
        _add(tar, "tmp", mode=0o1777)
        _add(tar, "bin/busybox", data=busybox, mode=0o755)
        for applet in applets:
            if applet != "busybox":
                _add(tar, f"bin/{applet}", link="busybox")
        _add(tar, "etc/passwd", data=b"root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
        _add(tar, "etc/group", data=b"root:x:0:\nnobody:x:65534:\n")

    return _layer(build)


def _spec_layer(spec: Spec) -> bytes:
    def build(tar: tarfile.TarFile) -> None:
        dirs = sorted({str(Path(p).parent) for p, _ in spec.files} - {".", "www", "etc"})
        for d in dirs:
            _add(tar, d, mode=0o755)
        for path, text in sorted(spec.files):
            _add(tar, path, data=text.encode())

    return _layer(build)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _config(spec: Spec, diff_ids: list[str]) -> bytes:
    cfg = {
        "architecture": "amd64",
        "os": "linux",
        "created": EPOCH,
        "config": {
            "Entrypoint": list(spec.entrypoint),
            "Env": ["PATH=/bin", *spec.env],
            "Labels": dict(spec.labels),
            "WorkingDir": "/",
            "ExposedPorts": {f"{p}/tcp": {} for p in spec.ports},
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
        "history": [
            {"created": EPOCH, "created_by": "busybox-static base (sidecarctl test images)"},
            {"created": EPOCH, "created_by": f"files of {spec.ref}"},
        ],
    }
    return json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()


def write_archive(path: Path, specs: tuple[Spec, ...], busybox: bytes) -> None:
    """All `specs` in one `docker save` archive at `path` (written elsewhere, then renamed into place)."""
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    base = _base_layer(busybox, sorted(applets))
    blobs: dict[str, bytes] = {f"{_sha(base)}/layer.tar": base}
    manifest = []
    for spec in specs:
        own = _spec_layer(spec)
        blobs[f"{_sha(own)}/layer.tar"] = own
        config = _config(spec, [_sha(base), _sha(own)])
        blobs[f"{_sha(config)}.json"] = config
        manifest.append(
            {
                "Config": f"{_sha(config)}.json",
                "RepoTags": [spec.ref],
                "Layers": [f"{_sha(base)}/layer.tar", f"{_sha(own)}/layer.tar"],
            }
        )
    blobs["manifest.json"] = json.dumps(manifest, separators=(",", ":")).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tar")
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(blobs):
                if "/" in name:
                    _add(tar, name.split("/")[0], mode=0o755)
                _add(tar, name, data=blobs[name])
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cached_archive(prefix: str, specs: tuple[Spec, ...]) -> Path:
    if not BUSYBOX.exists():
        raise FileNotFoundError(f"{BUSYBOX} is missing: install Debian's busybox-static (tools/setup-node.sh)")
    busybox = BUSYBOX.read_bytes()
    key = hashlib.sha256(
        json.dumps([FORMAT, _sha(busybox), [dataclasses.asdict(s) for s in specs]], sort_keys=True).encode()
    ).hexdigest()[:16]
    path = cache_root() / "images" / f"{prefix}-{key}.tar"
    if not path.exists():
        write_archive(path, specs, busybox)
    return path


def busybox_archive() -> Path:
    """The archive of every catalog image, built on a cache miss; its name carries the input hash."""
    return _cached_archive("test-images", catalog())


# -- stand-ins for the images of config/samples (the demo on a real node) ------------------------


def sample_images() -> dict[str, str]:
    """The image of each container the samples run, by container name (proxy-init, proxy, log-agent, app)."""
    found: dict[str, str] = {}
    for path in sorted(SAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            spec = (doc or {}).get("spec") or {}
            spec = (spec.get("template") or {}).get("spec") or spec
            for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
                found[c["name"]] = c["image"]
    return found


def next_patch_version(image: str) -> str:
    """`repo:v1.32.3` -> `repo:v1.32.4`: the proxy image the demo rolls to."""
    repo, _, tag = image.rpartition(":")
    m = re.fullmatch(r"(v?\d+\.\d+\.)(\d+)", tag)
    if not repo or m is None:
        raise ValueError(f"{image}: no x.y.z tag to bump")
    return f"{repo}:{m.group(1)}{int(m.group(2)) + 1}"


def sample_catalog() -> tuple[Spec, ...]:
    """Busybox stand-ins under the samples' own image names, doing what the samples need of them:
    proxy-init exits 0 (it redirects nothing), the proxy serves Envoy's readiness path
    /stats/prometheus on 15090 (and its version on /version), the log agent tails the app's log, and
    the app image is busybox itself. The proxy comes in its sample version and the next one."""
    imgs = sample_images()
    proxy = imgs["proxy"]
    note = "stand-in built from Debian's busybox (no registry reachable); not the real image"

    def proxy_spec(ref: str) -> Spec:
        version = ref.rpartition(":")[2]
        stats = f'# stand-in for {ref}\nenvoy_server_live 1\nenvoy_server_version{{version="{version}"}} 1\n'
        return Spec(
            ref=ref,
            entrypoint=_httpd(15090, on_term="trap 'exit 0' TERM"),
            files=(("www/stats/prometheus", stats), ("www/version", f"{version}\n")),
            labels=(("org.opencontainers.image.description", note), ("org.opencontainers.image.version", version)),
            ports=(15090,),
        )

    init_script = 'echo "proxy-init stand-in: would run: $*"; echo "no traffic is redirected"'
    agent_script = (
        "trap 'exit 0' TERM; echo \"log-agent stand-in: tailing /var/log/app/app.log\"; "
        "tail -F /var/log/app/app.log & while :; do sleep 3600 & wait $!; done"
    )
    return (
        Spec(
            ref=imgs["proxy-init"],
            entrypoint=("/bin/sh", "-c", init_script, "proxy-init"),
            labels=(("org.opencontainers.image.description", note),),
        ),
        proxy_spec(proxy),
        proxy_spec(next_patch_version(proxy)),
        Spec(
            ref=imgs["log-agent"],
            entrypoint=("/bin/sh", "-c", agent_script, "log-agent"),
            labels=(("org.opencontainers.image.description", note),),
        ),
        Spec(ref=imgs["app"], entrypoint=("/bin/sh",), labels=(("org.opencontainers.image.description", note),)),
    )


def samples_archive() -> Path:
    """The archive of the sample stand-ins (cached like the test images)."""
    return _cached_archive("sample-images", sample_catalog())
