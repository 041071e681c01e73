"""The `sidecarctl` command line.

Each subcommand is registered by a small `_add_<name>` function, so commands stay independent
and `main` only parses and dispatches. Bad input ends with one line on stderr and exit status 1,
never a traceback; output is written only once everything has succeeded, so a failed run never
leaves half a manifest behind.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from injector import manifests
from kuberuntime.clock import now_rfc3339
from sidecarctl.runcmd import add_run
from sidecarsets import names, validation
from sidecarsets.model import ModelError, SidecarSet

NOW_ENV = "SIDECARCTL_NOW"
_SIDECARSET_SUFFIXES = (".yaml", ".yml", ".json")


class CliError(Exception):
    """Bad input: the message (one line, naming the file and the reason) is shown as is."""


# ---------------------------------------------------------------------------------------------
# `sidecarctl inject`

_INJECT_HELP = "print manifests with the sidecars of the given SidecarSets injected (like istioctl kube-inject)"
_INJECT_EPILOG = f"""\
Pods and the pod templates of Deployment, StatefulSet, DaemonSet, ReplicaSet,
ReplicationController, Job and CronJob are injected; `kind: List` items and every document of a
multi-document file are handled; any other kind is printed unchanged. Warnings go to stderr.

Unlike the webhook, the namespace label {names.NS_INJECTION_LABEL}={names.NS_INJECTION_ENABLED} is not
required; the pod opt-out label {names.POD_INJECT_LABEL}="false" and the system namespaces still apply.

SidecarSets that select namespaces (spec.namespace, spec.namespaceSelector) are matched against the
object's metadata.namespace using the labels given with --namespace-labels, in one of three forms
(repeatable):
  FILE              a YAML file of Namespace objects (or a List of them)
  NAME:k=v,k2=v2    the labels of namespace NAME ("NAME:" for none)
  k=v,k2=v2         the labels of every namespace not described otherwise
A namespace without labels given is unknown: only a selector on {names.NS_NAME_LABEL}
(which spec.namespace is) can match it. An object without metadata.namespace is not
namespace-scoped: every SidecarSet whose pod selector matches is injected.

Both {names.API_VERSION} and {names.KRUISE_API_VERSION} SidecarSets are accepted.
"""


def _add_inject(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inject",
        help=_INJECT_HELP,
        description=_INJECT_HELP,
        epilog=_INJECT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-f", "--filename", required=True, metavar="FILE", help="manifests to inject, or - for stdin")
    parser.add_argument(
        "--sidecarset",
        action="append",
        default=[],
        metavar="FILE|DIR",
        help="SidecarSet manifests: a file, or a directory of .yaml/.yml/.json files (repeatable)",
    )
    parser.add_argument(
        "--namespace-labels",
        action="append",
        default=[],
        metavar="SPEC",
        help="namespace labels: FILE, NAME:k=v,... or k=v,... (see below; repeatable)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write the result to FILE instead of stdout")
    parser.add_argument(
        "--manager-namespace",
        default=names.DEFAULT_MANAGER_NAMESPACE,
        metavar="NS",
        help=f"the manager's namespace, never injected (default {names.DEFAULT_MANAGER_NAMESPACE})",
    )
    parser.add_argument(
        "--no-validate",
        action="store_true",
        help="do not validate the SidecarSets (conflicts are then resolved as the webhook resolves them)",
    )
    # Fixed time for the hash annotations, for reproducible output (also $SIDECARCTL_NOW).
    parser.add_argument("--timestamp", help=argparse.SUPPRESS)
    parser.set_defaults(func=_run_inject)


def _run_inject(args: argparse.Namespace) -> int:
    now = _timestamp(args.timestamp or os.environ.get(NOW_ENV))
    if not args.sidecarset:
        raise CliError("no SidecarSet given: use --sidecarset FILE|DIR")
    sidecarsets = _load_sidecarsets(args.sidecarset)
    if not args.no_validate:
        _validate(sidecarsets)
    namespace_labels, default_labels = _load_namespace_labels(args.namespace_labels)
    ctx = manifests.Context(
        sidecarsets=[ss for ss, _ in sidecarsets],
        now=now,
        namespace_labels=namespace_labels,
        default_labels=default_labels,
        manager_namespace=args.manager_namespace,
    )
    source = "stdin" if args.filename == "-" else args.filename
    docs = _load_yaml(source, _read(args.filename))
    out: list[Any] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        try:
            injected, warnings = manifests.inject_document(doc, ctx)
        except manifests.ManifestError as e:
            raise CliError(f"{source}: document {i + 1}: {e}") from None
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        out.append(injected)
    text = yaml.safe_dump_all(out, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 30)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise CliError(f"{args.output}: cannot write: {e.strerror or e}") from None
    else:
        sys.stdout.write(text)
    return 0


def _timestamp(value: str | None) -> str:
    if not value:
        return now_rfc3339()
    try:
        datetime.fromisoformat(value)
    except ValueError:
        raise CliError(f"timestamp {value!r} is not an RFC 3339 time such as 2024-01-31T12:00:00Z") from None
    return value


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CliError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise CliError(f"{path}: cannot read: {e.strerror or e}") from None


def _load_yaml(source: str, text: str) -> list[Any]:
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise CliError(f"{source}: invalid YAML{where}: {problem}") from None


def _objects(source: str, docs: Sequence[Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every object of a file, `kind: List` items flattened, each with a position for messages."""
    out: list[tuple[str, dict[str, Any]]] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        where = f"{source}: document {i + 1}"
        if not isinstance(doc, dict):
            raise CliError(f"{where}: not an object")
        if doc.get("kind") == "List":
            items = doc.get("items") or []
            if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
                raise CliError(f"{where}: items must be a list of objects")
            out += [(f"{where}, item {j + 1}", item) for j, item in enumerate(items)]
        else:
            out.append((where, doc))
    return out


def _sidecarset_files(path: str) -> list[Path]:
    p = Path(path)
    if not p.is_dir():
        return [p]
    try:
        files = sorted(f for f in p.iterdir() if f.suffix in _SIDECARSET_SUFFIXES and f.is_file())
    except OSError as e:
        raise CliError(f"{path}: cannot list: {e.strerror or e}") from None
    if not files:
        raise CliError(f"{path}: no {', '.join(_SIDECARSET_SUFFIXES)} files in this directory")
    return files


def _load_sidecarsets(paths: Sequence[str]) -> list[tuple[SidecarSet, str]]:
    loaded: list[tuple[SidecarSet, str]] = []
    seen: dict[str, str] = {}
    for path in paths:
        for file in _sidecarset_files(path):
            for where, obj in _objects(str(file), _load_yaml(str(file), _read(str(file)))):
                if obj.get("kind") != names.KIND:
                    raise CliError(f"{where}: kind {obj.get('kind')!r} is not {names.KIND}")
                try:
                    ss = SidecarSet.from_object(obj)
                except ModelError as e:
                    raise CliError(f"{where}: SidecarSet is unusable: {e}") from None
                if ss.name in seen:
                    raise CliError(f"{where}: SidecarSet {ss.name} is already defined in {seen[ss.name]}")
                seen[ss.name] = where
                loaded.append((ss, where))
    if not loaded:
        raise CliError(f"no SidecarSet found in {', '.join(paths)}")
    return loaded


def _validate(sidecarsets: Sequence[tuple[SidecarSet, str]]) -> None:
    for ss, where in sidecarsets:
        others = [other.obj for other, _ in sidecarsets if other is not ss]
        errors = validation.validate_sidecarset(ss.obj, old=None, others=others)
        if errors:
            raise CliError(f"{where}: SidecarSet {ss.name} is invalid: {'; '.join(str(e) for e in errors)}")


def _parse_labels(text: str, spec: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise CliError(f"--namespace-labels {spec}: {part!r} is not key=value")
        labels[key] = value
    return labels


def _load_namespace_labels(
    specs: Sequence[str],
) -> tuple[dict[str, dict[str, str]], dict[str, str] | None]:
    by_name: dict[str, dict[str, str]] = {}
    default: dict[str, str] | None = None
    for spec in specs:
        if Path(spec).is_file():
            for where, obj in _objects(spec, _load_yaml(spec, _read(spec))):
                if obj.get("kind") != "Namespace":
                    raise CliError(f"{where}: kind {obj.get('kind')!r} is not Namespace")
                meta = obj.get("metadata")
                name = meta.get("name") if isinstance(meta, dict) else None
                if not isinstance(name, str) or not name:
                    raise CliError(f"{where}: metadata.name must be a non-empty string")
                labels = meta.get("labels") if isinstance(meta, dict) else None
                if labels is not None and (
                    not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values())
                ):
                    raise CliError(f"{where}: metadata.labels must be a map of strings")
                by_name[name] = {str(k): v for k, v in (labels or {}).items()}
        elif ":" in spec:
            name, _, rest = spec.partition(":")
            if not name:
                raise CliError(f"--namespace-labels {spec}: the namespace name before ':' is empty")
            by_name[name] = _parse_labels(rest, spec)
        elif "=" in spec:
            default = _parse_labels(spec, spec)
        else:
            raise CliError(f"--namespace-labels {spec}: no such file, and not NAME:k=v,... or k=v,...")
    return by_name, default


# ---------------------------------------------------------------------------------------------
# Registration. The manager (`sidecarctl run`) registers itself here with its own `_add_run`.

_COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [_add_inject, add_run]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sidecarctl", description="Kubernetes sidecar injector and SidecarSet manager."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `sidecarctl`; return the exit status (argparse usage errors exit 2 on their own)."""
    args = _parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as e:
        print(f"sidecarctl {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
