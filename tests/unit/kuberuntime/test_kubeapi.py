"""Credentials from kubeconfig reach the wire, and API errors map to typed exceptions."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kuberuntime import api, kubeconfig


def _kubeconfig(tmp_path: Path, user: dict[str, object]) -> str:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_bearer_token_is_sent(tmp_path: Path) -> None:
    cfg = kubeconfig.load_config(_kubeconfig(tmp_path, {"token": "s3cret"}))
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.headers() == {"Authorization": "Bearer s3cret"}


def test_no_credentials_means_no_authorization_header(tmp_path: Path) -> None:
    cfg = kubeconfig.load_config(_kubeconfig(tmp_path, {}))
    assert "Authorization" not in cfg.headers()


def test_status_codes_map_to_error_types() -> None:
    body = {"kind": "Status", "reason": "AlreadyExists", "message": 'pods "x" already exists'}
    err = api.error_from_status(409, body)
    assert isinstance(err, api.Conflict)
    assert err.reason == "AlreadyExists"
    assert "already exists" in str(err)
    assert isinstance(api.error_from_status(404, {}), api.NotFound)
    assert isinstance(api.error_from_status(410, {}), api.Gone)
    assert isinstance(api.error_from_status(422, {}), api.Invalid)
    plain = api.error_from_status(500, "<html>oops</html>")
    assert type(plain) is api.ApiError
    assert plain.message == "<html>oops</html>"


def test_missing_or_broken_kubeconfig_is_a_clear_config_error(tmp_path: Path) -> None:

    with pytest.raises(kubeconfig.ConfigError, match="/nonexistent"):
        kubeconfig.load_config("/nonexistent")
    broken = tmp_path / "broken"
    broken.write_text("clusters: [oops")
    with pytest.raises(kubeconfig.ConfigError, match="cannot load cluster credentials"):
        kubeconfig.load_config(str(broken))


def test_sidecarctl_run_reports_bad_credentials_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from sidecarctl.cli import main as cli

    assert cli.main(["run", "--kubeconfig", "/nonexistent", "--self-signed", "--log-format", "text"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sidecarctl run: error: cannot load cluster credentials from /nonexistent")
    assert "Traceback" not in err
