"""What the documentation promises that can drift from the code: the Kruise migration guide lists
exactly the differences the Kruise differential tier documents, the README stays a front door with
its quickstart marked for tests/node/test_quickstart_node.py, and no CI run times creep back in."""

from __future__ import annotations

import re
from pathlib import Path

from tests.kruise import differences
from tests.kruise.test_convert_differential import DOCUMENTED as CONVERT_DOCUMENTED
from tests.kruise.test_validate_differential import DOCUMENTED as VALIDATE_DOCUMENTED

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"
QUICKSTART_STEPS = ("image", "install", "upgrade")


def section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def table_first_column(text: str) -> list[str]:
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    return [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]  # type: ignore[union-attr]


def tier_differences() -> dict[str, str]:
    out = {rule.name: "injection" for rule in differences.RULES}
    out.update({doc.name: "validation" for doc in VALIDATE_DOCUMENTED})
    out.update({name: "conversion" for name, _paths in CONVERT_DOCUMENTED})
    return out


def test_the_kruise_guide_lists_every_documented_difference_and_no_other() -> None:
    page = (DOCS / "migration" / "from-kruise.md").read_text(encoding="utf-8")
    table = section(page, "## What differs")
    listed = table_first_column(table)
    assert len(listed) == len(set(listed)), "a difference listed twice"
    assert set(listed) == set(tier_differences())
    for row in table.splitlines():
        if row.startswith("| `"):
            name = table_first_column(row)[0]
            assert f"| {tier_differences()[name]} |" in row, f"{name}: wrong tier named"


def test_the_readme_is_a_front_door() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / link).exists(), link
    assert "(docs/operations/versions.md)" in text


def test_the_quickstart_blocks_are_marked_once_each_in_order() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    marks = re.findall(r"<!-- quickstart:(\w+) -->\n```sh\n", text)
    assert tuple(marks) == QUICKSTART_STEPS


def test_no_ci_timings_in_the_docs() -> None:
    """Figures belong in docs/benchmarks.md with their command; how long a CI run took is not documentation."""
    pages = [REPO / "README.md", *DOCS.rglob("*.md")]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\.ci/run[^\n]{0,80}\d+ min", text), page
        assert not re.search(r"\b\d[\d,]* tests in \d", text), page
