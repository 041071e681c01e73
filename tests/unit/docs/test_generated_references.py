"""The generated reference pages (docs/reference/sidecarset-api.md from the CRD, docs/reference/cli.md
from the command line's parsers) are what tools/gen_docs.py writes now, and a stale copy is caught.

The generator imports the CLI's public parser builder (`sidecarctl.cli.main.build_parser`), so a
rename there fails here, in one place, rather than leaving the page silently out of date.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecarctl.cli.main import build_parser
from tools import gen_docs

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("page", sorted(gen_docs.PAGES), ids=str)
def test_committed_page_is_what_the_generator_writes(page: Path) -> None:
    committed = (REPO / page).read_text(encoding="utf-8")
    assert committed == gen_docs.PAGES[page](), f"{page} is stale: run .venv/bin/python tools/gen_docs.py"


def test_a_stale_copy_is_reported(tmp_path: Path) -> None:
    for page in gen_docs.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / page, tmp_path / page)
    assert gen_docs.stale_pages(tmp_path) == []
    cli = tmp_path / gen_docs.CLI_PAGE
    cli.write_text(cli.read_text(encoding="utf-8").replace("--explain", "--explain-less"), encoding="utf-8")
    (tmp_path / gen_docs.SIDECARSET_PAGE).unlink()
    assert sorted(gen_docs.stale_pages(tmp_path)) == sorted([gen_docs.CLI_PAGE, gen_docs.SIDECARSET_PAGE])


def test_every_flag_of_every_command_is_on_the_cli_page() -> None:
    page = (REPO / gen_docs.CLI_PAGE).read_text(encoding="utf-8")
    parser = build_parser()
    (sub_action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in sub_action.choices.items():
        section = page[page.index(f"## sidecarctl {name}\n") :]
        section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in section, f"sidecarctl {name} {flag} missing from {gen_docs.CLI_PAGE}"


def test_every_sidecarset_field_is_on_the_api_page() -> None:
    """Each spec field of each served version, outside the embedded Kubernetes types, has a row."""
    page = (REPO / gen_docs.SIDECARSET_PAGE).read_text(encoding="utf-8")
    crd = yaml.safe_load(gen_docs.CRD.read_text(encoding="utf-8"))
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        for name, field in spec["properties"].items():
            assert f"| `spec.{name}` |" in page, (version["name"], name)
            for extra in gen_docs.SIDECAR_CONTAINER_FIELDS:
                if gen_docs.kubernetes_type(field.get("items") or {}) == "Container":
                    assert f"| `spec.{name}[].{extra}` |" in page, (version["name"], name, extra)
    assert "| `spec.updateStrategy.progressDeadlineSeconds` |" in page


def test_kubernetes_types_are_told_by_their_shape() -> None:
    selector: dict[str, Any] = {"properties": {"matchLabels": {}, "matchExpressions": {}}}
    container: dict[str, Any] = {
        "properties": {p: {} for p in ("name", "image", "command", "args", "env", "podInjectPolicy")}
    }
    assert gen_docs.kubernetes_type(selector) == "LabelSelector"
    assert gen_docs.kubernetes_type(container) == "Container"
    assert gen_docs.kubernetes_type({"properties": {"limits": {}, "requests": {}}}) is None  # resourcesExpr: ours
