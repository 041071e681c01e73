"""`sidecarctl inject`: manifests in, the same manifests with sidecars out, like `istioctl kube-inject`.

Exit status 0 when the output was written (warnings or not), 1 for bad input or output that could
not be written (one line on stderr naming the file, the document, the object and the field), 2 for
a bad command line (argparse's usage message). Nothing is written unless everything succeeded, so
a failed run never leaves half a manifest behind; with `-o` the file is replaced in one step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from injector.manifests import manifestcontext, manifestpins, manifests
from injector.policy import plan as policy_plan
from sidecarctl.cli import injectinputs, manifestio
from sidecarctl.cli.clierror import CliError
from sidecarctl.cli.injectinputs import InputFile
from sidecarctl.cli.stdout import write_stdout
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

NOW_ENV = "SIDECARCTL_NOW"

_HELP = "print manifests with the sidecars of the given SidecarSets injected (like istioctl kube-inject)"
_EPILOG = f"""\
Pods and the pod templates of Deployment, StatefulSet, DaemonSet, ReplicaSet (apps),
ReplicationController (core), Job and CronJob (batch) are injected, matched by API group and kind;
`kind: List` items and every document of a multi-document file are handled. Add other kinds with
--kind-template (e.g. CloneSet.apps.kruise.io=spec.template, Rollout.argoproj.io=spec.template).
Documents that are not injected are written back exactly as they were, comments included.
Warnings go to stderr, once each.

Unlike the webhook, the namespace label {names.NS_INJECTION_LABEL}={names.NS_INJECTION_ENABLED} is not
required; the pod opt-out label {names.POD_INJECT_LABEL}="false" and the system namespaces still apply.

SidecarSets that select namespaces (spec.namespace, spec.namespaceSelector) are matched using the
labels of the Namespace objects found in the input and in the --sidecarset files, and those given
with --namespace-labels (which win), in one of three forms (repeatable):
  FILE              a YAML file of Namespace objects (or a List of them)
  NAME:k=v,k2=v2    the labels of namespace NAME ("NAME:" for none)
  k=v,k2=v2         the labels of every namespace not described otherwise
A namespace without labels given is unknown: only a selector on {names.NS_NAME_LABEL}
(which spec.namespace is) can match it. An object without metadata.namespace takes -n's; with
neither it is not namespace-scoped: every SidecarSet whose pod selector matches is injected.

The time in the hash annotations is each SidecarSet's last change as its file records it
(creationTimestamp, managedFields), {manifestpins.EPOCH} when it records none, or --timestamp
(also ${NOW_ENV}): the same inputs always give the same output.

Both {names.API_VERSION} and {names.KRUISE_API_VERSION} SidecarSets are accepted.
Exit status: 0 done, 1 bad input or output not written, 2 bad command line.
"""


def _timestamp(value: str) -> str:
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None or "T" not in value.upper():
        raise argparse.ArgumentTypeError(f"{value!r} is not an RFC 3339 time such as 2024-01-31T12:00:00Z")
    return value


def add_inject(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inject",
        help=_HELP,
        description=_HELP,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE|DIR|-",
        help="manifests to inject: a file, a directory of .yaml/.yml/.json files, or - for stdin (repeatable)",
    )
    parser.add_argument(
        "--sidecarset",
        action="append",
        required=True,
        metavar="FILE|DIR",
        help="SidecarSet manifests (a file or directory; Namespace objects there give namespace labels, "
        "other kinds are ignored; repeatable)",
    )
    parser.add_argument(
        "--revisions",
        action="append",
        default=[],
        metavar="FILE|DIR",
        help="ControllerRevisions of the SidecarSets (kubectl get controllerrevisions -n NS -o yaml), "
        "so that injectionStrategy.revision pins are honoured (repeatable)",
    )
    parser.add_argument(
        "--namespace-labels",
        action="append",
        default=[],
        type=injectinputs.label_spec,
        metavar="SPEC",
        help="namespace labels: FILE, NAME:k=v,... or k=v,... (see below; repeatable)",
    )
    parser.add_argument(
        "-n", "--namespace", metavar="NS", help="the namespace of objects that name none (as kubectl apply -n)"
    )
    parser.add_argument(
        "--kind-template",
        action="append",
        default=[],
        type=injectinputs.kind_template,
        metavar="KIND.GROUP=PATH",
        help="inject another kind too, at the pod template under PATH (repeatable)",
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
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also say on stderr, for each SidecarSet, whether a MutatingAdmissionPolicy injects it "
        "(run --injection=auto) or the webhook does, and why (stdout is unchanged)",
    )
    parser.add_argument(
        "--timestamp",
        type=_timestamp,
        metavar="TIME",
        help=f"the time recorded in the hash annotations (RFC 3339; also ${NOW_ENV})",
    )
    parser.set_defaults(func=run_inject, parser=parser)


def run_inject(args: argparse.Namespace) -> int:
    if args.filename.count(injectinputs.STDIN) > 1:
        args.parser.error("argument -f/--filename: - (standard input) can be given only once")
    for flag, paths in (("--sidecarset", args.sidecarset), ("--revisions", args.revisions)):
        if injectinputs.STDIN in paths:
            args.parser.error(f"argument {flag}: - (standard input) is read by -f only")
    now = args.timestamp
    if now is None and os.environ.get(NOW_ENV):
        try:
            now = _timestamp(os.environ[NOW_ENV])
        except argparse.ArgumentTypeError as e:
            args.parser.error(f"${NOW_ENV}: {e}")
    try:
        text, notes = _inject(args, now)
        for line in notes.lines():
            _stderr(line)
        _write(text.encode("utf-8"), args.output)
    except CliError as e:
        _stderr(f"sidecarctl inject: error: {e}")
        return 1
    return 0


def _inject(args: argparse.Namespace, now: str | None) -> tuple[str, manifestcontext.Notes]:
    notes = manifestcontext.Notes()
    inputs = injectinputs.read_inputs(args.filename)
    cluster = injectinputs.load_cluster(
        args.sidecarset, args.revisions, manager_namespace=args.manager_namespace, notes=notes
    )
    if not args.no_validate:
        injectinputs.validate(cluster.sidecarsets)
    if args.explain:
        for line in explain([ss for ss, _ in cluster.sidecarsets], manager_namespace=args.manager_namespace):
            _stderr(line)
    given, default_labels = injectinputs.load_label_specs(args.namespace_labels)
    templates = dict(manifestcontext.WORKLOAD_TEMPLATES)
    templates.update(args.kind_template)
    ctx = manifestcontext.Context(
        sidecarsets=[ss for ss, _ in cluster.sidecarsets],
        now=now,
        namespace_labels={**injectinputs.input_namespaces(inputs), **cluster.namespaces, **given},
        default_labels=default_labels,
        manager_namespace=args.manager_namespace,
        default_namespace=args.namespace or None,
        templates=templates,
        revisions=cluster.revisions if args.revisions else None,
        notes=notes,
    )
    total = manifestcontext.Stats()
    out = [_inject_file(f, ctx, total) for f in inputs]
    if total.pods == 0 and any(d.value is not None for f in inputs for d in f.stream.documents):
        notes.add("nothing to inject: no Pod, and no workload with a pod template, in the input")
    return _joined(inputs, out), notes


def explain(sidecarsets: list[SidecarSet], *, manager_namespace: str) -> list[str]:
    """One line per SidecarSet: the path that injects it under --injection=auto (an API server
    that enforces MutatingAdmissionPolicies), or the feature that needs the webhook."""
    p = policy_plan.plan(
        sidecarsets, mode=policy_plan.Mode.AUTO, manager_namespace=manager_namespace, timestamp=_EXPLAIN_TIME
    )
    by_name = {ss.name: ss for ss in sidecarsets}
    on_webhook = [by_name[n] for n in p.webhook_served() if n in by_name]
    lines = []
    for name in sorted(p.routes):
        route = p.routes[name]
        if route.path is policy_plan.Path.POLICY:
            # Which of the manager's policies holds it depends on the cluster (injector.policy.bundle).
            how = "injected by a MutatingAdmissionPolicy (no webhook call)"
            near = sorted(w.name for w in on_webhook if policy_plan.may_share_pods(w, by_name[name]))
            if near:
                how += f"; pods that {', '.join(near)} also select(s) go to the webhook, whole"
        elif route.path is policy_plan.Path.WEBHOOK:
            how = f"injected by the webhook: {route.message}"
        else:
            how = f"not injected: {route.message}"
        lines.append(f"explain: SidecarSet {name}: {how}")
    return lines


_EXPLAIN_TIME = "1970-01-01T00:00:00Z"


def _inject_file(f: InputFile, ctx: manifestcontext.Context, total: manifestcontext.Stats) -> str:
    """The file's text with each injected document replaced; the others as they were."""
    stream = f.stream
    stats = manifestcontext.Stats()
    parts: list[str] = []
    for doc in stream.documents:
        if doc.value is None:
            parts.append(stream.original(doc))
            continue
        try:
            value, doc_stats = manifests.inject_document(doc.value, ctx)
        except manifestcontext.ManifestError as e:
            raise CliError(f"{f.name}: document {doc.index}: {e}") from None
        stats.add(doc_stats)
        parts.append(stream.original(doc) if value is doc.value else manifestio.replaced(stream, doc, value))
    total.add(stats)
    if not any(d.value is not None for d in stream.documents):
        ctx.notes.add("no objects in it (empty input)", f.name)
    elif stats.injected == 0 and stats.already == 0 and stats.unmatched:
        ctx.notes.add(f"no SidecarSet matched any pod or pod template in it ({stats.pods} looked at)", f.name)
    return "".join(parts) if stream.documents else stream.text


def _joined(inputs: Sequence[InputFile], texts: Sequence[str]) -> str:
    """The files one after the other, a `---` between two where the second does not start with one."""
    out: list[str] = []
    previous_has_documents = False
    for i, (f, text) in enumerate(zip(inputs, texts, strict=True)):
        docs = f.stream.documents
        if i == 0 and f.stream.bom:
            text = "\ufeff" + text
        if out and not out[-1].endswith("\n"):
            out.append("\n")
        if previous_has_documents and docs and not manifestio.has_marker(f.stream, docs[0]):
            out.append("---\n")
        out.append(text)
        previous_has_documents = previous_has_documents or bool(docs)
    return "".join(out)


def _stderr(line: str) -> None:
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def _write(data: bytes, output: str | None) -> None:
    if output:
        _write_file(Path(output), data)
        return
    write_stdout(data)


def _write_file(path: Path, data: bytes) -> None:
    """Replace `path` in one step: a full disk or a crash leaves the old file, never half a new one."""
    if path.exists() and not path.is_file():  # a device or a pipe (/dev/stdout): write to it as it is
        try:
            with path.open("wb") as out:
                out.write(data)
        except OSError as e:
            raise CliError(f"{path}: cannot write: {e.strerror or e}") from None
        return
    import tempfile  # only here: it imports random, which costs every other run its start-up time

    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise CliError(f"{path}: cannot write: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
