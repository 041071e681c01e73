"""`sidecarctl status [-n NS] [NAME]`: a SidecarSet's (or NamespacedSidecarSet's) rollout at a glance,
or one line per SidecarSet.

Reads the SidecarSets, the injected pods, the namespaces, the unlabelled pods of the namespaces
labelled for injection and the ControllerRevisions (GET and LIST only), and asks the controller's
own questions of them (sidecarsets.rollout.glance).

Exit status 0 with the status printed, 1 when the cluster cannot be read or NAME does not exist,
2 for a bad command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import clusterread
from sidecarsets.pods.projection import project
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

if TYPE_CHECKING:
    from kuberuntime import kubeapi
    from sidecarsets.rollout.glance import Glance

_HELP = "show a SidecarSet's rollout: counts, the batch upgrading now, blocked and missed pods, conditions"
_EPILOG = f"""\
Without NAME, one line per SidecarSet: matched, updated and ready pods (from its status), where
its rollout stands and how many running pods lack its sidecars.

With NAME: the status counters (and observedGeneration against generation), the pods upgrading
now (patched, new image not yet running and ready), what holds pods back (not upgradable in place
and which fields, the progress deadline, pods not ready, pods outside updateStrategy.selector),
pods in namespaces labelled {names.NS_INJECTION_LABEL}={names.NS_INJECTION_ENABLED} that run without its
sidecars and why, pods whose env overrides ({names.ANN_OVERRIDES}) changed since injection (only a
recreated pod takes them), and the conditions.

{names.NAMESPACED_KIND}s are listed as namespace/name beside the SidecarSets. With -n NS, NAME is
the {names.NAMESPACED_KIND} of namespace NS (without NAME: that namespace's, one line each), and only
that namespace is read (its pods, the namespace, its ControllerRevisions): what its admins may read.

Exit status: 0 shown, 1 cluster not readable or no such SidecarSet, 2 bad command line.
"""


def add_status(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help=_HELP,
        description=_HELP,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="the SidecarSet (default: all of them, one line each)")
    parser.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help=f"the {names.NAMESPACED_KIND} NAME of this namespace (without NAME: that namespace's, one line each);"
        " reads that namespace only",
    )
    clusterread.add_cluster_flags(parser)
    parser.set_defaults(func=clusterread.main_of("status", run_status))


@dataclass
class Inputs:
    sidecarsets: list[JsonObj]
    pods: list[JsonObj]
    namespaces: list[JsonObj]
    unlabelled: list[JsonObj]
    revisions: list[JsonObj]


async def gather(
    client: kubeapi.KubeClient, name: str | None, manager_namespace: str, namespace: str | None = None
) -> Inputs:
    """What `build` reads. With `namespace` (a NamespacedSidecarSet's), that namespace alone: its
    pods, the namespace and its revisions, which its admins may read without any cluster-wide right."""
    import asyncio

    from sidecarsets.rollout import glance

    sets, (pods, namespaces) = await asyncio.gather(
        clusterread.sidecarsets(client, name, namespace), clusterread.pods_and_namespaces(client, namespace)
    )
    revs = await clusterread.revisions_of(client, sets, manager_namespace)
    labelled = glance.labelled_namespaces(clusterread.namespace_labels(namespaces), manager_namespace=manager_namespace)
    lists = await asyncio.gather(
        *(
            clusterread.list_all(
                client, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"!{names.POD_INJECTED_LABEL}"}
            )
            for ns in labelled
        )
    )
    return Inputs(sets, pods, namespaces, [p for group in lists for p in group], revs)


def build(inputs: Inputs, *, now: str, manager_namespace: str) -> list[Glance]:
    from sidecarsets.pods import podkeys
    from sidecarsets.rollout import glance

    models = [SidecarSet.from_object(o, tolerant=True) for o in inputs.sidecarsets]
    models.sort(key=lambda ss: ss.name)
    ns_labels = clusterread.namespace_labels(inputs.namespaces)
    projections = [project(p) for p in inputs.pods]
    raw = {podkeys.pod_key(p): p for p in inputs.pods}
    missing = glance.missing_pods(
        models, inputs.pods, inputs.unlabelled, inputs.namespaces, ns_labels, manager_namespace=manager_namespace
    )
    return [
        glance.of(
            ss,
            projections,
            raw,
            ns_labels,
            stored_revisions=clusterread.revisions_for(ss, inputs.revisions, manager_namespace),
            missing=missing.get(ss.name, []),
            now=now,
        )
        for ss in models
    ]


def run_status(args: argparse.Namespace) -> str:
    from kuberuntime.clock import now_rfc3339

    inputs = clusterread.run_against(
        args, "status", lambda c: gather(c, args.name, args.manager_namespace, args.namespace)
    )
    glances = build(inputs, now=now_rfc3339(), manager_namespace=args.manager_namespace)
    if args.output == "json":
        if args.name is not None:
            return clusterread.to_json(glances[0].as_json())
        return clusterread.to_json({"sidecarSets": [g.as_json() for g in glances]})
    return render_one(glances[0]) if args.name is not None else render_table(glances)


# ---------------------------------------------------------------------------------------------
# Text


def render_table(glances: Sequence[Glance]) -> str:
    if not glances:
        return "No SidecarSets.\n"
    rows = [("NAME", "MATCHED", "UPDATED", "READY", "ROLLOUT", "MISSING")]
    for g in glances:
        c = g.counts
        rows.append(
            (g.name, str(c["matchedPods"]), str(c["updatedPods"]), str(c["readyPods"]), g.summary, str(len(g.missing)))
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows)


def _pairs(items: Sequence[tuple[str, str]], short: clusterread.PodNames) -> list[str]:
    return [f"  {short(k)} ({why})" for k, why in items]


def _condition(c: Mapping[str, Any]) -> str:
    text = f"  {c.get('type')}={c.get('status')}"
    if c.get("reason"):
        text += f" {c.get('reason')}"
    if c.get("message"):
        text += f": {c.get('message')}"
    return text


def render_one(g: Glance) -> str:
    c, live = g.counts, g.live
    short = clusterread.PodNames(
        [k for k, _ in (*g.upgrading, *g.not_ready, *g.recreate)]
        + [b.pod for b in g.not_upgradable]
        + list(g.excluded_by_selector)
        + [m.key for m in g.missing]
    )
    lines = [f"{g.kind} {g.name}"]
    observed = "not yet observed" if g.observed_generation is None else f"observed {g.observed_generation}"
    behind = "" if g.observed_generation == g.generation else " (the controller has not caught up yet)"
    lines.append(f"  generation {g.generation}, {observed}{behind}")
    if short.namespace is not None:
        lines.append(f"  pods of namespace {short.namespace}")
    lines.append(
        f"  matched {c['matchedPods']}, updated {c['updatedPods']}, ready {c['readyPods']}, "
        f"updated and ready {c['updatedReadyPods']}"
    )
    if dict(live) != dict(c):
        lines.append(
            f"  (the pods now: matched {live['matchedPods']}, updated {live['updatedPods']}, "
            f"ready {live['readyPods']}, updated and ready {live['updatedReadyPods']})"
        )
    if not g.stopped:
        lines.append(f"  rollout: {g.reason}")
    else:
        lines.append(f"  {g.reason}" if g.reason.startswith("rollout stopped") else f"  rollout stopped: {g.reason}")
    if g.upgrading:
        lines.append(f"Upgrading now ({len(g.upgrading)}):")
        lines += _pairs(g.upgrading, short)
    if g.not_upgradable:
        lines.append(f"Not upgradable in place ({len(g.not_upgradable)}); recreate them to pick up the change:")
        lines += [
            f"  {short(b.pod)}: {'; '.join(b.fields)} (compared with {b.compared_with})" for b in g.not_upgradable
        ]
    if g.not_ready:
        lines.append(f"Not ready ({len(g.not_ready)}):")
        lines += _pairs(g.not_ready, short)
    if g.excluded_by_selector:
        lines.append(f"Outside updateStrategy.selector ({len(g.excluded_by_selector)}):")
        lines.append("  " + short.join(g.excluded_by_selector))
    if g.recreate:
        lines.append(f"Env overrides changed since injection ({len(g.recreate)}); recreate them to pick them up:")
        lines += _pairs(g.recreate, short)
    if g.missing:
        lines.append(f"Running without its sidecars ({len(g.missing)}):")
        lines += [
            f"  {short(m.key)}: {m.reason}{'' if m.owned else ' (no controller recreates it)'}" for m in g.missing
        ]
    if g.conditions:
        lines.append("Conditions:")
        lines += [_condition(cond) for cond in g.conditions]
    return "\n".join(lines) + "\n"
