"""YAML manifests in and out for `sidecarctl inject`: documents with their original text.

Why not `yaml.safe_load_all` + `yaml.safe_dump_all`: a tool people pipe whole release manifests
through must give back what it did not touch as it was (comments, quoting, key order, `0400`, block
scripts), the way `istioctl kube-inject` does, and must be fast on files of thousands of documents.
So a file is split into one slice of text per document, at the positions the parser reports;
an untouched document is written back as its slice, byte for byte, and only an injected one is
dumped again, between the comment lines that came before and after it in its slice. How values
are read and dumped (libyaml or pure Python, same results) is sidecarctl.cli.yamlcodec's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from sidecarctl.cli.yamlcodec import YamlError as YamlError
from sidecarctl.cli.yamlcodec import dumper_class, loader_class

_BOM = "\ufeff"
# A line that may stand around a document in its slice: blank, a comment, a marker or a directive.
_FRAME_LINE = re.compile(r"[ \t]*(?:#.*)?|---(?:[ \t]+(?:#.*)?)?|\.\.\.(?:[ \t]+(?:#.*)?)?|%.*")
_MARKER_LINE = re.compile(r"---(?:[ \t]+(?:#.*)?)?")
_HELM = re.compile(r"\{\{-?\s|\{\{[.$]")


@dataclass(slots=True)
class Document:
    """One document of a file: its value and where its text is.

    `text[start:end]` is the document's slice: everything from the end of the previous
    document's content to the end of its own (its `---` line, comments, the content, trailing
    comments). `content` and `content_end` delimit the content within it.
    """

    index: int  # 1-based, in its file
    value: Any
    start: int
    content: int
    content_end: int
    end: int


@dataclass(slots=True)
class Stream:
    """A parsed file: its text (any byte-order mark removed) and its documents in order."""

    text: str
    documents: list[Document]
    bom: bool = False

    def original(self, doc: Document) -> str:
        return self.text[doc.start : doc.end]


def _content_end(node: Node) -> int:
    """Where the document's content ends: the end of its last scalar or flow collection.

    A block collection's own end mark lies after the comments that follow it, so follow the last
    entries down instead. An alias may point back to an earlier node; the caller checks the text
    after the result and keeps no trailing comments when it is not all comments.
    """
    while True:
        if isinstance(node, MappingNode) and not node.flow_style and node.value:
            key, value = node.value[-1]
            return max(_content_end(key), _content_end(value))
        if isinstance(node, SequenceNode) and not node.flow_style and node.value:
            node = node.value[-1]
            continue
        return int(node.end_mark.index)


def _yaml_error(e: yaml.YAMLError, text: str, document: int) -> YamlError:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is None:
        return YamlError(f"invalid YAML: {problem}", document=document)
    message = f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    if _HELM.search(text):
        message += " (this looks like a Helm template: render it first, e.g. `helm template`)"
    return YamlError(message, document=document)


def parse(text: str, *, fast: bool | None = None) -> Stream:
    """Every document of `text` with its slice; YamlError for text that is not YAML.

    `fast` None picks libyaml when present; True/False force one (the tests compare both).
    """
    bom = text.startswith(_BOM)
    if bom:
        text = text[1:]  # libyaml and PyYAML disagree on whether the mark counts in positions
    loader = loader_class(fast)(text)
    docs: list[Document] = []
    start = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            value = loader.construct_document(node)
            docs.append(
                Document(
                    index=len(docs) + 1,
                    value=value,
                    start=start,
                    content=int(node.start_mark.index),
                    content_end=_content_end(node),
                    end=int(node.end_mark.index),
                )
            )
            start = docs[-1].end
    except yaml.YAMLError as e:
        raise _yaml_error(e, text, len(docs) + 1) from None
    except RecursionError:
        raise YamlError("invalid YAML: nested too deeply", document=len(docs) + 1) from None
    finally:
        loader.dispose()
    if docs:
        docs[-1].end = len(text)
    return Stream(text=text, documents=docs, bom=bom)


def load_all(text: str, *, fast: bool | None = None) -> list[Any]:
    """The documents' values only (empty documents included, as None)."""
    return [d.value for d in parse(text, fast=fast).documents]


def dump(value: Any, *, fast: bool | None = None) -> str:
    """One document as block YAML: keys in their order, Unicode kept, no line folding, no aliases."""
    text: str = yaml.dump(
        value,
        Dumper=dumper_class(fast),
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 30,
    )
    return text


def _lines(text: str) -> Iterator[str]:
    for line in text.splitlines():
        yield line.rstrip("\r")


def _frame_only(text: str) -> bool:
    return all(_FRAME_LINE.fullmatch(line) for line in _lines(text))


def has_marker(stream: Stream, doc: Document) -> bool:
    """Whether the document's slice opens it with `---` (so no separator need be added)."""
    head = stream.text[doc.start : doc.content]
    return any(line.startswith("---") for line in _lines(head))


def replaced(stream: Stream, doc: Document, value: Any, *, fast: bool | None = None) -> str:
    """The document's slice with its content replaced by `value`, dumped.

    The lines before the content (its `---`, directives, comments) and the comment lines after
    it are kept; comments inside the content are lost (PyYAML does not keep them).
    """
    text = stream.text
    line_start = text.rfind("\n", doc.start, doc.content) + 1 if doc.content > doc.start else doc.start
    line_start = max(line_start, doc.start)
    head = text[doc.start : line_start]
    same_line = text[line_start : doc.content]
    if same_line.strip() and _MARKER_LINE.fullmatch(same_line.rstrip()):
        head += "---\n"
    elif same_line.strip():
        head = ""  # content after something that is not a marker on its line: start afresh
    if not _frame_only(head):
        head = "---\n" if doc.index > 1 else ""
    newline = text.find("\n", doc.content_end, doc.end)
    tail = "" if newline < 0 else text[newline + 1 : doc.end]
    if not _frame_only(tail):
        tail = ""
    return head + dump(value, fast=fast) + tail
