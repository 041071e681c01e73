"""What `sidecarctl inject` reads: manifest files and directories, and the cluster state offline.

A directory stands for its `.yaml`, `.yml` and `.json` files, in name order and not recursively,
as with `kubectl apply -f DIR`. The cluster state that the webhook would read from its store is
read from files instead: SidecarSets and the Namespace objects beside them (`--sidecarset`, which
takes a directory of mixed manifests such as `config/samples/`), ControllerRevisions
(`--revisions`, as `kubectl get controllerrevisions -o yaml` prints them), and namespace labels
(`--namespace-labels`, or Namespace objects in the input itself). Every problem is a `CliError`
naming the file, the document and the object.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from injector.manifests import manifestcontext, manifests
from kuberuntime.jsontypes import JsonObj, resolve
from sidecarctl.cli import manifestio
from sidecarctl.cli.clierror import CliError
from sidecarsets import validation
from sidecarsets.spec import names
from sidecarsets.spec.model import ACCEPTED_API_VERSIONS, ModelError, SidecarSet

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_KIND = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_GROUP = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_PATH_SEGMENT = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True)
class InputFile:
    """One manifest file to inject: its name in messages and its parsed text."""

    name: str
    stream: manifestio.Stream


@dataclass(slots=True)
class ClusterState:
    """What the webhook's store would hold, read from files."""

    sidecarsets: list[tuple[SidecarSet, str]] = field(default_factory=list)
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    revisions: dict[str, JsonObj] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Files


def expand(paths: Iterable[str], *, flag: str) -> list[str]:
    """Files for `paths`: files as given, directories as their manifest files; `-` as is."""
    out: list[str] = []
    for path in paths:
        p = Path(path)
        if path == STDIN or not p.is_dir():
            out.append(path)
            continue
        try:
            files = sorted(f for f in p.iterdir() if f.suffix in MANIFEST_SUFFIXES and f.is_file())
        except OSError as e:
            raise CliError(f"{path}: cannot list: {e.strerror or e}") from None
        if not files:
            raise CliError(f"{flag} {path}: no {', '.join(MANIFEST_SUFFIXES)} files in this directory")
        out += [str(f) for f in files]
    return out


def read_text(path: str) -> str:
    """The file's text, exactly (no newline translation), or a CliError."""
    try:
        data = sys.stdin.buffer.read() if path == STDIN else Path(path).read_bytes()
    except OSError as e:
        raise CliError(f"{display(path)}: cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CliError(f"{display(path)}: not UTF-8 text (byte {e.start + 1})") from None


def display(path: str) -> str:
    return "stdin" if path == STDIN else path


def parse_file(path: str) -> manifestio.Stream:
    try:
        return manifestio.parse(read_text(path))
    except manifestio.YamlError as e:
        raise CliError(f"{display(path)}: document {e.document}: {e}" if e.document else f"{path}: {e}") from None


def objects(name: str, docs: Iterable[tuple[int, Any]]) -> list[tuple[str, JsonObj]]:
    """Every object of a file with its position for messages; `kind: List` items flattened."""
    out: list[tuple[str, JsonObj]] = []
    for index, doc in docs:
        if doc is None:
            continue
        where = f"{name}: document {index}"
        if not isinstance(doc, dict):
            raise CliError(f"{where}: not an object (a mapping of apiVersion, kind, metadata, ...)")
        if doc.get("kind") == "List":
            items = doc.get("items") or []
            if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
                raise CliError(f"{where}: {manifests.describe(doc)}: items must be a list of objects")
            out += [(f"{where}, items[{j}]", item) for j, item in enumerate(items)]
        else:
            out.append((where, doc))
    return out


def stream_objects(name: str, stream: manifestio.Stream) -> list[tuple[str, JsonObj]]:
    return objects(name, ((d.index, d.value) for d in stream.documents))


def read_inputs(paths: Sequence[str]) -> list[InputFile]:
    files = expand(paths, flag="-f")
    return [InputFile(display(path), parse_file(path)) for path in files]


# ---------------------------------------------------------------------------------------------
# Cluster state


def _is_sidecarset(obj: Mapping[str, Any]) -> bool:
    """A SidecarSet, or a NamespacedSidecarSet (injected as the webhook does: in its namespace only)."""
    if obj.get("kind") == names.NAMESPACED_KIND:
        return obj.get("apiVersion") in (None, names.API_VERSION_V1BETA1)
    if obj.get("kind") != names.KIND:
        return False
    api_version = obj.get("apiVersion")
    group = manifests.api_group(obj)
    return api_version is None or api_version in ACCEPTED_API_VERSIONS or group in (names.GROUP, "apps.kruise.io")


def _is(obj: Mapping[str, Any], group: str, kind: str) -> bool:
    return manifests.template_key(obj) == (group, kind) or (obj.get("kind") == kind and "apiVersion" not in obj)


def load_cluster(
    sidecarset_paths: Sequence[str],
    revision_paths: Sequence[str],
    *,
    manager_namespace: str,
    notes: manifestcontext.Notes,
) -> ClusterState:
    """SidecarSets and Namespaces from `--sidecarset`, ControllerRevisions from `--revisions`.

    Each file is read once, whichever flags name it; other objects are ignored with a note.
    """
    flags: dict[str, set[str]] = {}
    for flag, paths in (("--sidecarset", sidecarset_paths), ("--revisions", revision_paths)):
        for path in expand(paths, flag=flag):
            flags.setdefault(path, set()).add(flag)
    state = ClusterState()
    seen: dict[str, str] = {}
    revision_seen: dict[str, str] = {}
    for path, used_by in flags.items():
        for where, obj in stream_objects(path, parse_file(path)):
            if "--sidecarset" in used_by and _is_sidecarset(obj):
                ss = load_sidecarset(where, obj)
                if ss.name in seen:
                    raise CliError(f"{where}: SidecarSet {ss.name} is already defined in {seen[ss.name]}")
                seen[ss.name] = where
                state.sidecarsets.append((ss, where))
            elif "--sidecarset" in used_by and _is(obj, "", "Namespace"):
                name, labels = namespace_labels(where, obj)
                state.namespaces[name] = labels
            elif "--revisions" in used_by and _is(obj, "apps", "ControllerRevision"):
                _add_revision(state, where, obj, manager_namespace, revision_seen, notes)
            else:
                wanted = " or ".join(
                    w
                    for f, w in (("--sidecarset", "a SidecarSet or Namespace"), ("--revisions", "a ControllerRevision"))
                    if f in used_by
                )
                notes.add(
                    f"not {wanted}: ignored by {' and '.join(sorted(used_by, reverse=True))}",
                    f"{manifests.describe(obj)} ({path})",
                    level="note",
                )
    if sidecarset_paths and not state.sidecarsets:
        raise CliError(f"--sidecarset: no SidecarSet found in {', '.join(sidecarset_paths)}")
    return state


def _add_revision(
    state: ClusterState,
    where: str,
    obj: JsonObj,
    manager_namespace: str,
    seen: dict[str, str],
    notes: manifestcontext.Notes,
) -> None:
    name = resolve(obj, "metadata", "name")
    if not isinstance(name, str) or not name:
        raise CliError(f"{where}: ControllerRevision: metadata.name must be a non-empty string")
    namespace = resolve(obj, "metadata", "namespace")
    if namespace and namespace != manager_namespace:
        notes.add(
            f"ControllerRevisions outside the manager's namespace ({manager_namespace}, --manager-namespace) "
            "are not the webhook's: ignored",
            f"ControllerRevision {namespace}/{name}",
            level="note",
        )
        return
    if name in seen:
        raise CliError(f"{where}: ControllerRevision {name} is already defined in {seen[name]}")
    seen[name] = where
    state.revisions[name] = obj


def load_sidecarset(where: str, obj: JsonObj) -> SidecarSet:
    meta = obj.get("metadata")
    name = resolve(meta, "name")
    label = f"SidecarSet {name}" if isinstance(name, str) and name else "SidecarSet (unnamed)"
    if meta is None:
        raise CliError(f"{where}: {label}: metadata is missing (a SidecarSet needs metadata.name)")
    if obj.get("kind") == names.NAMESPACED_KIND and not resolve(meta, "namespace"):
        raise CliError(f"{where}: {names.NAMESPACED_KIND} {name}: metadata.namespace is required (its pods' namespace)")
    try:
        return SidecarSet.from_object(obj)
    except ModelError as e:
        raise CliError(f"{where}: {label}: {e}") from None


def validate(sidecarsets: Sequence[tuple[SidecarSet, str]]) -> None:
    for ss, where in sidecarsets:
        others = [other.obj for other, _ in sidecarsets if other is not ss]
        errors = validation.validate_sidecarset(ss.obj, old=None, others=others)
        if errors:
            raise CliError(f"{where}: SidecarSet {ss.name} is invalid: {'; '.join(str(e) for e in errors)}")


def namespace_labels(where: str, obj: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    name = resolve(obj, "metadata", "name")
    if not isinstance(name, str) or not name:
        raise CliError(f"{where}: Namespace: metadata.name must be a non-empty string")
    labels = resolve(obj, "metadata", "labels")
    if labels is not None and (not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values())):
        raise CliError(f"{where}: Namespace {name}: metadata.labels must be a map of strings")
    return name, {str(k): v for k, v in (labels or {}).items()}


def input_namespaces(inputs: Sequence[InputFile]) -> dict[str, dict[str, str]]:
    """Labels of the Namespace objects in the files being injected (`kubectl apply` creates them)."""
    out: dict[str, dict[str, str]] = {}
    for f in inputs:
        for where, obj in _top_objects(f):
            if _is(obj, "", "Namespace"):
                name, labels = namespace_labels(where, obj)
                out[name] = labels
    return out


def _top_objects(f: InputFile) -> Iterable[tuple[str, JsonObj]]:
    for doc in f.stream.documents:
        value = doc.value
        if not isinstance(value, dict):
            continue
        where = f"{f.name}: document {doc.index}"
        if value.get("kind") == "List" and isinstance(value.get("items"), list):
            yield from ((f"{where}, items[{j}]", i) for j, i in enumerate(value["items"]) if isinstance(i, dict))
        else:
            yield where, value


# ---------------------------------------------------------------------------------------------
# Flag values (argparse types: a bad value is a usage error, exit status 2)


@dataclass(frozen=True, slots=True)
class LabelSpec:
    """One `--namespace-labels`: a file of Namespaces, one namespace's labels, or everyone's."""

    path: str | None = None
    namespace: str | None = None
    labels: Mapping[str, str] | None = None


def _labels(text: str, spec: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not _LABEL_KEY.match(key):
            raise argparse.ArgumentTypeError(f"{spec!r}: {part!r} is not KEY=VALUE with a label key")
        labels[key] = value
    return labels


def label_spec(spec: str) -> LabelSpec:
    if Path(spec).is_file():
        return LabelSpec(path=spec)
    head, colon, rest = spec.partition(":")
    if colon and "=" not in head:
        if not head:
            raise argparse.ArgumentTypeError(f"{spec!r}: the namespace name before ':' is empty")
        return LabelSpec(namespace=head, labels=_labels(rest, spec))
    if "=" in spec:
        return LabelSpec(labels=_labels(spec, spec))
    raise argparse.ArgumentTypeError(f"{spec!r}: no such file, and not NAME:KEY=VALUE,... or KEY=VALUE,...")


def load_label_specs(specs: Sequence[LabelSpec]) -> tuple[dict[str, dict[str, str]], dict[str, str] | None]:
    by_name: dict[str, dict[str, str]] = {}
    default: dict[str, str] | None = None
    for spec in specs:
        if spec.path is not None:
            for where, obj in stream_objects(spec.path, parse_file(spec.path)):
                if not _is(obj, "", "Namespace"):
                    raise CliError(f"{where}: --namespace-labels: {manifests.describe(obj)} is not a Namespace")
                name, labels = namespace_labels(where, obj)
                by_name[name] = labels
        elif spec.namespace is not None:
            by_name[spec.namespace] = dict(spec.labels or {})
        else:
            default = dict(spec.labels or {})
    return by_name, default


def kind_template(text: str) -> tuple[manifestcontext.TemplateKey, tuple[str, ...]]:
    """`Kind.group=path.to.template` (`Kind=...` for the core group)."""
    qualified, sep, path = text.partition("=")
    kind, _, group = qualified.partition(".")
    segments = tuple(path.split("."))
    example = "e.g. CloneSet.apps.kruise.io=spec.template"
    if not sep or not _KIND.match(kind) or (group and not _GROUP.match(group)):
        raise argparse.ArgumentTypeError(f"{text!r} is not KIND.GROUP=PATH ({example})")
    if not all(_PATH_SEGMENT.match(s) for s in segments):
        raise argparse.ArgumentTypeError(f"{text!r}: {path!r} is not a dotted path such as spec.template ({example})")
    return (group, kind), segments
