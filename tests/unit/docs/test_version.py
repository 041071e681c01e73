"""The version is written once, in pyproject.toml; everything that names it agrees."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from sidecarctl.cli.main import main
from sidecarctl.manager import user_agent, version

REPO = Path(__file__).resolve().parents[3]


def pyproject_version() -> str:
    value: str = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    return value


def test_the_installed_package_reports_pyproject_version() -> None:
    assert version() == pyproject_version()
    assert user_agent("control", "replica-1") == f"sidecarctl/{pyproject_version()} (control; replica-1)"
    assert user_agent("webhook-0", "replica-1") == f"sidecarctl/{pyproject_version()} (webhook-0; replica-1)"


def test_sidecarctl_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"sidecarctl {pyproject_version()}\n"


def test_the_chart_the_manifests_and_the_image_name_the_same_version() -> None:
    expected = pyproject_version()
    chart = yaml.safe_load((REPO / "charts" / "sidecarctl" / "Chart.yaml").read_text(encoding="utf-8"))
    assert str(chart["appVersion"]) == expected
    deployment = yaml.safe_load((REPO / "config" / "manager" / "deployment.yaml").read_text(encoding="utf-8"))
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"sidecarctl:{expected}"
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert re.findall(r"^ARG VERSION=(\S+)$", dockerfile, re.M) == [expected]


def test_the_docs_build_the_image_under_that_version() -> None:
    for path in (REPO / "README.md", REPO / "docs" / "getting-started.md", REPO / "docs" / "operations" / "install.md"):
        tags = set(re.findall(r"\bsidecarctl:(\d+\.\d+\.\d+\S*?)\b", path.read_text(encoding="utf-8")))
        assert tags == {pyproject_version()}, (path.name, tags)


def test_the_changelog_is_in_keep_a_changelog_form() -> None:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    assert "keepachangelog.com" in text
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert headings and headings[0] == "Unreleased"
    for section in re.findall(r"^### (.+)$", text, re.M):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, section
