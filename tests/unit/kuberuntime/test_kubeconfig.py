"""Our kubeconfig and in-cluster loader: every credential form the manager and its tests use."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberuntime import kubeconfig
from tests.certutil import make_ca, make_leaf


def write(tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None, **extra: Any) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://127.0.0.1:6443/"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
        **extra,
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_server_and_ca_data_and_client_certificate(tmp_path: Path) -> None:
    ca = make_ca("cluster-ca")
    client = make_leaf(ca)
    path = write(
        tmp_path,
        {"client-certificate-data": b64(client.cert_pem), "client-key-data": b64(client.key_pem)},
        {"server": "https://127.0.0.1:6443/", "certificate-authority-data": b64(ca.cert_pem)},
    )
    cfg = kubeconfig.load_config(str(path))
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.ssl_context is not None and cfg.ssl_context.verify_mode.name == "CERT_REQUIRED"
    assert cfg.ssl_context.get_ca_certs()[0]["subject"][0][0][1] == "cluster-ca"
    assert cfg.headers() == {}


def test_files_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    ca = make_ca("files-ca")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    (tmp_path / "token").write_text("from-file\n")
    path = write(tmp_path, {"tokenFile": "token"}, {"server": "https://h:1", "certificate-authority": "ca.pem"})
    cfg = kubeconfig.load_config(str(path))
    assert cfg.headers() == {"Authorization": "Bearer from-file"}


def test_a_rotated_token_file_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubeconfig, "TOKEN_RECHECK", 0.0)
    token = tmp_path / "token"
    token.write_text("one")
    cfg = kubeconfig.load_config(str(write(tmp_path, {"tokenFile": str(token)})))
    assert cfg.headers()["Authorization"] == "Bearer one"
    token.write_text("two")
    os.utime(token, ns=(1, 1))  # a new stamp, as the kubelet's atomic swap gives
    assert cfg.headers()["Authorization"] == "Bearer two"


def test_exec_plugin_token(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "exec-token", "expirationTimestamp": "2999-01-01T00:00:00Z"},
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    cfg = kubeconfig.load_config(str(write(tmp_path, {"exec": {"command": str(plugin), "apiVersion": "v1"}})))
    assert cfg.headers() == {"Authorization": "Bearer exec-token"}


def test_in_cluster_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = make_ca("in-cluster")
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    cfg = kubeconfig.in_cluster(tmp_path)
    assert cfg is not None and cfg.server == "https://10.0.0.1:443"
    assert cfg.headers() == {"Authorization": "Bearer sa-token"}
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert kubeconfig.in_cluster(tmp_path) is None


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"current-context": "nope", "contexts": []}, "no context named 'nope'"),
        ({"contexts": [{"name": "x", "context": {"cluster": "c"}}], "current-context": "x"}, "no cluster named 'c'"),
        ([1, 2], "is not a kubeconfig"),
        ({}, "has no current-context"),
    ],
)
def test_broken_kubeconfigs_name_the_problem(tmp_path: Path, doc: Any, message: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(kubeconfig.ConfigError, match=message):
        kubeconfig.load_config(str(path))


def test_bad_inline_data_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, {}, {"server": "https://h:1", "certificate-authority-data": "%%%"})
    with pytest.raises(kubeconfig.ConfigError, match="certificate-authority-data is not base64"):
        kubeconfig.load_config(str(path))


def _service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return sa


def test_kubeconfig_env_wins_over_the_in_cluster_account_as_in_controller_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = _service_account(tmp_path, monkeypatch)
    path = write(tmp_path, {"token": "from-file"}, {"server": "https://file.example:6443"})
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), str(path)]))
    cfg = kubeconfig.load_config(sa_dir=sa)
    assert cfg.server.startswith("https://file.example:6443")
    assert cfg.headers() == {"Authorization": "Bearer from-file"}


def test_without_kubeconfig_env_the_in_cluster_account_wins_over_the_home_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = _service_account(tmp_path, monkeypatch)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    home = tmp_path / "home"
    write_home = write(tmp_path, {"token": "home"})
    (home / ".kube").mkdir(parents=True)
    write_home.rename(home / ".kube" / "config")
    monkeypatch.setenv("HOME", str(home))
    cfg = kubeconfig.load_config(sa_dir=sa)
    assert cfg.server == "https://10.0.0.1:443"
    assert cfg.headers() == {"Authorization": "Bearer pod-token"}


def test_nothing_found_names_every_place_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(kubeconfig.ConfigError, match=r"no \$KUBECONFIG, not running in a cluster"):
        kubeconfig.load_config(sa_dir=tmp_path / "no-sa")
