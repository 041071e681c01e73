"""The PyYAML loader and dumper classes behind sidecarctl.cli.manifestio, and the error they raise.

Kept apart from the document slicing (sidecarctl.cli.manifestio): this is how values are read and
written, tuned for speed and for the same bytes from both PyYAML builds; the slicing decides which
text is kept and which is dumped again.

libyaml's C parser and emitter do the work where PyYAML was built with them; the pure-Python
ones are the fallback and give the same documents and the same bytes (the pure emitter is told
the few rules in which libyaml differs: which characters are printable, and which keys are simple).
Scalars are read as Kubernetes reads them (YAML 1.1 types, as `kubectl` does), except that
timestamps stay strings: the API server sees the text, never a date.
"""

from __future__ import annotations

import re
from typing import Any, cast

import yaml
from yaml.emitter import Emitter, ScalarAnalysis
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_STR_TAG = "tag:yaml.org,2002:str"
_OTHER_BREAKS = re.compile("[\r\x85\u2028\u2029]")
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_SIMPLE_SCALARS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "timestamp"))
# Aliases may make a document far larger than its text ("billion laughs"); past this many nodes
# once expanded, it is refused rather than written out.
MAX_EXPANDED_NODES = 2_000_000


def _timestamp_as_text(loader: yaml.SafeLoader, node: Node) -> str:
    return loader.construct_scalar(cast(ScalarNode, node))


# Resolver.resolve, remembered: manifests repeat the same keys and values thousands of times and
# each scalar is resolved once on reading and twice on writing. A plain function set on the
# instance (the C parser and emitter call `self.resolve`) with the answers of the safe schema's
# implicit resolvers (shared and never changed here; no path resolvers) kept per scalar.
_RESOLVER = yaml.resolver.Resolver()
_RESOLVED: dict[tuple[str, Any], str] = {}
_MAX_RESOLVED = 100_000
_MAX_RESOLVED_LENGTH = 256


def _resolve(kind: Any, value: Any, implicit: Any) -> str:
    if kind is ScalarNode:
        key = (value, implicit)
        tag = _RESOLVED.get(key)
        if tag is None:
            tag = _RESOLVER.resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
            if len(value) <= _MAX_RESOLVED_LENGTH:
                if len(_RESOLVED) >= _MAX_RESOLVED:
                    _RESOLVED.clear()
                _RESOLVED[key] = tag
        return tag
    return _MAP_TAG if kind is MappingNode else _SEQ_TAG


class _CachedResolver:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resolve = _resolve


class _FastConstructor(_CachedResolver):
    """SafeConstructor's results for plain JSON-like documents, without its per-node machinery.

    Mappings, sequences and the scalar types of the safe schema are built directly; anything else
    (merge keys, !!set, !!binary, unknown tags: errors as usual) goes to the usual constructor.
    An alias gives the same object, as with PyYAML; a document whose aliases expand it past
    MAX_EXPANDED_NODES is refused.
    """

    constructed_objects: dict[Node, Any]  # the usual constructor's state, reset after each document
    recursive_objects: dict[Node, Any]

    def construct_document(self, node: Node) -> Any:
        self._built: dict[Node, Any] = {}
        self._aliased = False
        try:
            value = self._build(node)
            if self._aliased:
                _check_expansion(node)
            return value
        finally:
            self._built = {}
            self.constructed_objects = {}
            self.recursive_objects = {}

    def _build(self, node: Node) -> Any:
        built = self._built
        if node in built:
            self._aliased = True
            return built[node]
        cls = type(node)
        tag = node.tag
        if cls is ScalarNode:
            if tag == _STR_TAG:
                value: Any = node.value
            elif tag in _SIMPLE_SCALARS:
                value = self.yaml_constructors[tag](self, node)  # type: ignore[attr-defined]
            else:
                value = self._usual(node)
        elif cls is MappingNode and tag == _MAP_TAG and not any(k.tag == _MERGE_TAG for k, _ in node.value):
            value = built[node] = {}
            for key_node, value_node in node.value:
                key = self._build(key_node)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
                    ) from None
                value[key] = self._build(value_node)
            return value
        elif cls is SequenceNode and tag == _SEQ_TAG:
            value = built[node] = []
            for item in node.value:
                value.append(self._build(item))
            return value
        else:
            value = self._usual(node)
        built[node] = value
        return value

    def _usual(self, node: Node) -> Any:
        return yaml.constructor.BaseConstructor.construct_object(self, node, deep=True)  # type: ignore[arg-type]


def _check_expansion(root: Node) -> None:
    sizes: dict[Node, int] = {}
    active: set[Node] = set()

    def size(node: Node) -> int:
        known = sizes.get(node)
        if known is not None:
            return known
        if node in active:
            raise YamlError("invalid YAML: an alias refers to a node that contains it")
        active.add(node)
        total = 1
        if isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, SequenceNode):
            total += sum(size(item) for item in node.value)
        active.discard(node)
        sizes[node] = total
        if total > MAX_EXPANDED_NODES:
            raise YamlError(f"invalid YAML: its aliases expand it to more than {MAX_EXPANDED_NODES:,} nodes")
        return total

    size(root)


class _PureLoader(_FastConstructor, yaml.SafeLoader):
    pass


_PureLoader.add_constructor(_TIMESTAMP_TAG, _timestamp_as_text)

_CLoader: type[Any] | None = getattr(yaml, "CSafeLoader", None)
_CDumper: type[Any] | None = getattr(yaml, "CSafeDumper", None)

if _CLoader is not None:

    class _FastLoader(_FastConstructor, _CLoader):  # type: ignore[misc, valid-type]
        pass

    _FastLoader.add_constructor(_TIMESTAMP_TAG, _timestamp_as_text)


class _LibyamlEmitter(Emitter):
    """PyYAML's emitter with libyaml's rules where the two differ, so both write the same bytes.

    libyaml treats NEL and characters beyond the Basic Multilingual Plane as unprintable (it
    escapes them in double quotes), counts a carriage return as a line break, and measures
    simple keys in UTF-8 bytes, up to 128, empty ones included.
    """

    def analyze_scalar(self, scalar: str) -> ScalarAnalysis:
        analysis = super().analyze_scalar(scalar)
        if scalar and any(ch == "\x85" or ch > "\uffff" for ch in scalar):
            analysis.allow_flow_plain = analysis.allow_block_plain = False
            analysis.allow_single_quoted = analysis.allow_block = False
        if "\r" in scalar:
            analysis.multiline = True
        return analysis

    def check_simple_key(self) -> bool:
        event = self.event
        if isinstance(event, yaml.AliasEvent):
            return True
        if isinstance(event, yaml.ScalarEvent):
            if self.analysis is None:
                self.analysis = self.analyze_scalar(event.value)
            return not self.analysis.multiline and len(event.value.encode("utf-8")) <= 128
        return bool(self.check_empty_sequence() or self.check_empty_mapping())


def _str_node(data: str) -> ScalarNode:
    # Scripts and config files embedded in manifests stay readable as literal blocks. Only the
    # clip (`|`) and strip (`|-`) forms: a kept trailing break (`|+`) ends a document "open", and
    # the two emitters mark that differently.
    if "\n" in data and not data.endswith("\n\n") and data.strip("\n") and not _OTHER_BREAKS.search(data):
        return ScalarNode(_STR_TAG, data, style="|")
    return ScalarNode(_STR_TAG, data)


class _FastRepresenter(_CachedResolver):
    """SafeRepresenter's nodes for JSON-like values, built directly (block style, no aliases: an
    object shared through a YAML alias is written out in full wherever it is used)."""

    def represent_data(self, data: Any) -> Node:
        cls = type(data)
        if cls is str:
            return _str_node(data)
        if cls is dict:
            represent = self.represent_data
            return MappingNode(_MAP_TAG, [(represent(k), represent(v)) for k, v in data.items()], flow_style=False)
        if cls is list:
            represent = self.represent_data
            return SequenceNode(_SEQ_TAG, [represent(item) for item in data], flow_style=False)
        if cls is bool:
            return ScalarNode("tag:yaml.org,2002:bool", "true" if data else "false")
        if cls is int:
            return ScalarNode("tag:yaml.org,2002:int", str(data))
        if data is None:
            return ScalarNode("tag:yaml.org,2002:null", "null")
        return super().represent_data(data)  # type: ignore[misc, no-any-return]

    def ignore_aliases(self, data: Any) -> bool:
        return True


class _PureDumper(_FastRepresenter, _LibyamlEmitter, yaml.SafeDumper):
    """SafeDumper with the emitter above (the MRO puts `_LibyamlEmitter` before `Emitter`)."""


if _CDumper is not None:

    class _FastDumper(_FastRepresenter, _CDumper):  # type: ignore[misc, valid-type]
        pass


class YamlError(ValueError):
    """Text that is not YAML; the message has the line and column, `document` the 1-based index."""

    def __init__(self, message: str, *, document: int | None = None) -> None:
        super().__init__(message)
        self.document = document


def pure_python() -> bool:
    """Whether this PyYAML lacks libyaml (the fallback is then used, with the same results)."""
    return _CLoader is None or _CDumper is None


def loader_class(fast: bool | None) -> type[Any]:
    if fast is None:
        fast = _CLoader is not None
    return _FastLoader if fast and _CLoader is not None else _PureLoader


def dumper_class(fast: bool | None) -> type[Any]:
    if fast is None:
        fast = _CDumper is not None
    return _FastDumper if fast and _CDumper is not None else _PureDumper
