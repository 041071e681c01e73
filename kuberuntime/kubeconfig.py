"""Where the API server is and how to authenticate: in-cluster, or from a kubeconfig file.

Why our own loader: the official client's loaders import its whole generated client (18 MiB of
RSS per process, 126 MiB of the image) for what is a YAML file and two mounted files. This covers
what the manager and its tests use: the in-cluster service account (its bound token re-read when
the kubelet rotates it), and kubeconfig clusters with CA data or files, insecure-skip-tls-verify,
client certificates (data or files), bearer tokens (inline or tokenFile) and exec credential
plugins (client.authentication.k8s.io/v1, token or client certificate, cached until they expire).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from kuberuntime.jsontypes import mapping

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_RECHECK = 10.0  # seconds between looks at a token file


class ConfigError(ValueError):
    """No usable cluster credentials; the message says which source failed and why."""


@dataclass
class ClusterConfig:
    """Where the API server is and how to authenticate; built once, used by every request."""

    server: str
    ssl_context: ssl.SSLContext | None
    headers: Callable[[], dict[str, str]] = field(default=lambda: {})


class _TokenFile:
    """A bearer token read from a file, re-read when the file changes (bound tokens rotate)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._checked = 0.0
        self._stamp: tuple[int, int] | None = None
        self._token = ""
        self.read()

    def read(self) -> str:
        now = time.monotonic()
        if now - self._checked >= TOKEN_RECHECK or not self._token:
            self._checked = now
            try:
                st = self.path.stat()
                stamp = (st.st_mtime_ns, st.st_ino)
                if stamp != self._stamp:
                    self._token = self.path.read_text().strip()
                    self._stamp = stamp
            except OSError as e:
                if not self._token:
                    raise ConfigError(f"cannot read the token file {self.path}: {e.strerror or e}") from None
        return self._token


class _ExecPlugin:
    """client.authentication.k8s.io ExecCredential: run the command, keep its answer until it expires."""

    def __init__(self, spec: Mapping[str, Any], base: Path) -> None:
        command = spec.get("command")
        if not isinstance(command, str) or not command:
            raise ConfigError("user.exec.command is required")
        self.argv = [command, *[str(a) for a in spec.get("args") or []]]
        self.env = {**os.environ, **{str(e["name"]): str(e["value"]) for e in spec.get("env") or []}}
        self.cwd = str(base)
        self._status: dict[str, Any] = {}
        self._expires = 0.0

    def status(self) -> dict[str, Any]:
        if self._status and time.time() < self._expires:
            return self._status
        try:
            out = subprocess.run(
                self.argv, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=30, check=True
            ).stdout
            status = json.loads(out).get("status") or {}
        except (OSError, subprocess.SubprocessError, ValueError, AttributeError) as e:
            raise ConfigError(f"the exec credential plugin {self.argv[0]} failed: {e}") from None
        expiry = status.get("expirationTimestamp")
        self._expires = (
            datetime.fromisoformat(expiry.replace("Z", "+00:00")).timestamp() - 10 if expiry else float("inf")
        )
        self._status = status
        return status


def _data(entry: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    """`key-data` (base64) or `key` (a path, relative to the kubeconfig's directory)."""
    inline = entry.get(f"{key}-data")
    if inline:
        try:
            return base64.b64decode(inline, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{key}-data is not base64") from None
    path = entry.get(key)
    if not path:
        return None
    try:
        return (base / str(path)).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {key} {path}: {e.strerror or e}") from None


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="sidecarctl-kubeconfig-") as tmp:
        cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert_path.write_bytes(cert)
        key_path.write_bytes(key)
        key_path.chmod(0o600)
        try:
            ctx.load_cert_chain(str(cert_path), str(key_path))
        except ssl.SSLError as e:
            raise ConfigError(f"the client certificate or key is unusable: {e}") from None


def _context(ca: bytes | None, insecure: bool) -> ssl.SSLContext:
    if insecure:
        ctx = ssl._create_unverified_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cadata=ca.decode() if ca else None)
    except (ssl.SSLError, ValueError) as e:
        raise ConfigError(f"the cluster CA is unusable: {e}") from None


def in_cluster(sa_dir: Path = SA_DIR) -> ClusterConfig | None:
    """The pod's service account, or None when not running in a cluster."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not (sa_dir / "token").exists():
        return None
    token = _TokenFile(sa_dir / "token")
    ca = (sa_dir / "ca.crt").read_bytes() if (sa_dir / "ca.crt").exists() else None
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return ClusterConfig(server, _context(ca, False), lambda: {"Authorization": f"Bearer {token.read()}"})


def _named(doc: Mapping[str, Any], kind: str, name: str) -> Mapping[str, Any]:
    for entry in doc.get(f"{kind}s") or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            return mapping(entry, kind)
    raise ConfigError(f"no {kind} named {name!r}")


def from_kubeconfig(path: Path, *, context: str | None = None) -> ClusterConfig:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path} is not a kubeconfig")
    name = context or doc.get("current-context")
    if not name:
        raise ConfigError(f"{path} has no current-context")
    ctx = _named(doc, "context", str(name))
    cluster = _named(doc, "cluster", str(ctx.get("cluster")))
    user = _named(doc, "user", str(ctx.get("user"))) if ctx.get("user") else {}
    base = path.parent
    server = str(cluster.get("server") or "")
    if not server:
        raise ConfigError(f"cluster {ctx.get('cluster')!r} has no server")
    ssl_ctx = None
    if server.startswith("https"):
        ssl_ctx = _context(_data(cluster, "certificate-authority", base), bool(cluster.get("insecure-skip-tls-verify")))
    headers: Callable[[], dict[str, str]] = lambda: {}  # noqa: E731
    cert, key = _data(user, "client-certificate", base), _data(user, "client-key", base)
    if cert and key and ssl_ctx is not None:
        _load_cert_chain(ssl_ctx, cert, key)
    if user.get("token"):
        token = str(user["token"])
        headers = lambda: {"Authorization": f"Bearer {token}"}  # noqa: E731
    elif user.get("tokenFile"):
        token_file = _TokenFile(base / str(user["tokenFile"]))
        headers = lambda: {"Authorization": f"Bearer {token_file.read()}"}  # noqa: E731
    elif isinstance(user.get("exec"), Mapping):
        plugin = _ExecPlugin(user["exec"], base)
        status = plugin.status()
        if status.get("clientCertificateData") and ssl_ctx is not None:
            _load_cert_chain(
                ssl_ctx, str(status["clientCertificateData"]).encode(), str(status["clientKeyData"]).encode()
            )
        if status.get("token"):
            headers = lambda: {"Authorization": f"Bearer {plugin.status().get('token', '')}"}  # noqa: E731
    return ClusterConfig(server.rstrip("/"), ssl_ctx, headers)


def load_config(kubeconfig: str | None = None, *, context: str | None = None, sa_dir: Path = SA_DIR) -> ClusterConfig:
    """The manager's credentials, found where controller-runtime looks, in its order: `kubeconfig`
    when given, then $KUBECONFIG (its first file that exists; files are not merged), then the
    in-cluster service account, then ~/.kube/config. A $KUBECONFIG set in the pod wins over the
    pod's own account, as it does for a controller-runtime manager."""
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if kubeconfig is not None:
        where = kubeconfig
    elif env:
        kubeconfig = next((p for p in env if Path(p).exists()), env[0])
        where = f"{kubeconfig} (from $KUBECONFIG)"
    else:
        found = in_cluster(sa_dir)
        if found is not None:
            return found
        kubeconfig = str(Path.home() / ".kube" / "config")
        where = f"{kubeconfig} (no --kubeconfig, no $KUBECONFIG, not running in a cluster)"
    try:
        return from_kubeconfig(Path(kubeconfig), context=context)
    except ConfigError as e:
        raise ConfigError(f"cannot load cluster credentials from {where}: {e}") from None
