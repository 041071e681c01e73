"""sidecarctl.cli.manifestio: documents and their text; libyaml and pure Python agree byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecarctl.cli import manifestio, yamlcodec

needs_libyaml = pytest.mark.skipif(yamlcodec.pure_python(), reason="this PyYAML has no libyaml")

STREAM = """\
%YAML 1.1
# leading comment
---
a: 1   # one
b:
- x
# inner
- y
# trailing of a
---
--- {flow: true}
# between
...
---
c: |
  block
  text
d: 0400
e: 2024-01-01
"""


@pytest.mark.parametrize("fast", [pytest.param(True, marks=needs_libyaml), False])
def test_documents_cover_the_text_exactly(fast: bool) -> None:
    stream = manifestio.parse(STREAM, fast=fast)
    assert [d.value for d in stream.documents] == [
        {"a": 1, "b": ["x", "y"]},
        None,
        {"flow": True},
        {"c": "block\ntext\n", "d": 256, "e": "2024-01-01"},
    ]
    assert "".join(stream.original(d) for d in stream.documents) == STREAM
    assert [d.index for d in stream.documents] == [1, 2, 3, 4]
    first = stream.documents[0]
    assert STREAM[first.content : first.content_end] == "a: 1   # one\nb:\n- x\n# inner\n- y"


@needs_libyaml
def test_both_parsers_give_the_same_documents_and_positions() -> None:
    fast, pure = manifestio.parse(STREAM, fast=True), manifestio.parse(STREAM, fast=False)
    assert fast.documents == pure.documents


def test_a_byte_order_mark_is_kept_out_of_positions() -> None:
    stream = manifestio.parse("\ufeffa: é😀\n---\nb: 2\n")
    assert stream.bom
    assert [stream.original(d) for d in stream.documents] == ["a: é😀\n", "---\nb: 2\n"]


def test_replaced_keeps_the_comments_around_the_document() -> None:
    stream = manifestio.parse(STREAM)
    first, _, flow, last = stream.documents
    assert (
        manifestio.replaced(stream, first, {"z": [1]})
        == "%YAML 1.1\n# leading comment\n---\nz:\n- 1\n# trailing of a\n"
    )
    # Content on the marker's line: the marker is kept on a line of its own. A flow document's text
    # ends with its closing bracket: what follows on other lines belongs to the next one.
    assert manifestio.replaced(stream, flow, {"flow": False}) == "---\nflow: false\n"
    assert manifestio.replaced(stream, last, {"c": "x\ny"}) == "\n# between\n...\n---\nc: |-\n  x\n  y\n"


def test_an_alias_at_the_end_drops_the_trailing_comments_rather_than_repeat_content() -> None:
    text = "a: &x [1, 2]\nb:\n  *x\n# after\n"
    stream = manifestio.parse(text)
    (doc,) = stream.documents
    assert manifestio.replaced(stream, doc, {"a": 1}) == "a: 1\n"


def test_timestamps_stay_text_and_aliases_are_written_out() -> None:
    (value,) = manifestio.load_all("when: 2024-01-01T00:00:00Z\nl: &l {a: 1}\nm: *l\n")
    assert value["when"] == "2024-01-01T00:00:00Z"
    assert value["l"] is value["m"]
    assert manifestio.dump(value) == "when: '2024-01-01T00:00:00Z'\nl:\n  a: 1\nm:\n  a: 1\n"


def test_the_usual_constructor_handles_the_rest() -> None:
    (value,) = manifestio.load_all("base: &b {x: 1}\nmerged:\n  <<: *b\n  y: 2\nset: !!set {a, b}\n")
    assert value["merged"] == {"x": 1, "y": 2}
    assert value["set"] == {"a": None, "b": None} or value["set"] == {"a", "b"}
    with pytest.raises(manifestio.YamlError, match="unhashable key"):
        manifestio.parse("? [a]\n: 1\n")
    with pytest.raises(manifestio.YamlError, match="line 1, column 1"):
        manifestio.parse("!Ref x\n")


def test_alias_bombs_and_cycles_are_refused() -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    with pytest.raises(manifestio.YamlError, match="expand it to more than"):
        manifestio.parse("\n".join(levels) + "\n")
    with pytest.raises(manifestio.YamlError, match="contains it"):
        manifestio.parse("&a [*a]\n")


def test_yaml_errors_name_the_document_and_hint_at_helm() -> None:
    with pytest.raises(manifestio.YamlError) as info:
        manifestio.parse("a: 1\n---\nb: [\n")
    assert info.value.document == 2
    assert str(info.value).startswith("invalid YAML at line 4, column 1: ")
    with pytest.raises(manifestio.YamlError, match="looks like a Helm template: render it first"):
        manifestio.parse("metadata:\n  name: {{ .Release.Name }}\n  x: [\n")


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    [
        "a\nb",
        "a\nb\n",
        " lead\nx",
        "trail \nx",
        "x\n\n",
        "\n",
        "tab\there\nx",
        "yes",
        "0400",
        "~",
        "",
        "- x",
        "#c",
        "a: b",
        "é\n😀",
        "\u2028",
        "\x85a\nb",
        "a\r\nb",
        "x" * 128,
        "é" * 64,
        "é" * 65,
        "2024-01-01",
    ]
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@needs_libyaml
@settings(max_examples=400, suppress_health_check=list(HealthCheck), deadline=None)
@given(st.dictionaries(_TEXT, _JSON, max_size=5))
def test_libyaml_and_pure_python_write_the_same_bytes(value: dict[str, Any]) -> None:
    fast = manifestio.dump(value, fast=True)
    assert manifestio.dump(value, fast=False) == fast
    assert manifestio.load_all(fast, fast=True) == [value]
    assert manifestio.load_all(fast, fast=False) == [value]
    assert yaml.safe_load(fast) == value
