"""`sidecarctl preview -f FILE`: what the controller would do if this SidecarSet were applied now.

Reads the cluster (GET and LIST only: the stored SidecarSet of that name and the others, the
injected pods, the namespaces, the ControllerRevisions) and answers with the manager's own code:
the planner, pass after pass, on copies of the pods (sidecarsets.rollout.preview), and the injection engine
on a representative new pod of each label set (injector.manifests.newpods). Nothing is written.

Exit status 0 with the preview printed (whatever it says), 1 when the file or the cluster cannot be
read, or when the API server would refuse the SidecarSet, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import clusterread, injectinputs
from sidecarctl.cli.clierror import CliError
from sidecarctl.cli.previewtext import render
from sidecarsets import validation
from sidecarsets.pods.projection import project
from sidecarsets.spec import conversion, names
from sidecarsets.spec.defaults import apply_defaults
from sidecarsets.spec.model import ModelError, SidecarSet, namespace_of, object_key

if TYPE_CHECKING:
    from injector.manifests import newpods
    from kuberuntime import kubeapi
    from sidecarsets.rollout import rolloutsim

_HELP = "show what applying a SidecarSet would do: rollout batches, pods left behind, what new pods get"
_EPILOG = f"""\
The preview is computed with the manager's own planner and injection engine from what the cluster
holds now (GET and LIST requests only; nothing is written):

  changes      each sidecar container of the stored SidecarSet against the file's (image, other fields)
  rollout      the batches the controller would upgrade in place, in order, honouring partition,
               maxUnavailable, updateStrategy.selector, priorityStrategy and scatterStrategy; each
               batch is assumed to come back ready before the next (a real rollout whose pods come
               back one by one plans more often, in smaller batches)
  left behind  pods that cannot be upgraded in place and the fields why, pods outside the update
               selector, pods the new spec no longer owns, pods it selects but never injected
  new pods     what the webhook would inject into a new pod of each label set it selects

Pods are read with the label {names.POD_INJECTED_LABEL}=true, as the controller reads them.
Both {names.API_VERSION} and {names.KRUISE_API_VERSION} (and v1beta1) SidecarSets are accepted, and a
{names.NAMESPACED_KIND} ({names.API_VERSION_V1BETA1}, metadata.namespace set): then only its namespace is
read (its pods, sets and revisions), with the cluster SidecarSets where they may be read.
Exit status: 0 preview shown, 1 bad file, cluster not readable or SidecarSet refused, 2 bad command line.
"""


def add_preview(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "preview",
        help=_HELP,
        description=_HELP,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f",
        "--filename",
        required=True,
        metavar="FILE|-",
        help="the SidecarSet manifest (YAML or JSON, one SidecarSet; - for stdin)",
    )
    clusterread.add_cluster_flags(parser)
    parser.set_defaults(func=clusterread.main_of("preview", run_preview))


@dataclass
class Inputs:
    stored: JsonObj | None
    sidecarsets: list[JsonObj]
    pods: list[JsonObj]
    namespaces: list[JsonObj]
    revisions: list[JsonObj]


def read_file(path: str) -> tuple[JsonObj, str]:
    """The one SidecarSet of the file, as written, and where it is (for messages)."""
    name = injectinputs.display(path)
    found = [
        (where, obj)
        for where, obj in injectinputs.stream_objects(name, injectinputs.parse_file(path))
        if obj.get("kind") in (names.KIND, names.NAMESPACED_KIND)
    ]
    if not found:
        raise CliError(f"{name}: no SidecarSet in it")
    if len(found) > 1:
        raise CliError(f"{name}: {len(found)} SidecarSets in it ({found[1][0]}); preview takes one")
    where, obj = found[0]
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise CliError(f"{where}: SidecarSet: metadata.name must be a non-empty string")
    if obj.get("kind") == names.NAMESPACED_KIND and not meta.get("namespace"):
        raise CliError(f"{where}: {names.NAMESPACED_KIND} {meta['name']}: metadata.namespace is required")
    return obj, where


def as_stored(obj: JsonObj, where: str) -> JsonObj:
    """The file's SidecarSet as the API server would store it: v1alpha1 of our group (a
    NamespacedSidecarSet: v1beta1, its one version), defaults applied."""
    if obj.get("kind") == names.NAMESPACED_KIND:
        if obj.get("apiVersion") not in (None, names.API_VERSION_V1BETA1):
            raise CliError(f"{where}: a {names.NAMESPACED_KIND} is {names.API_VERSION_V1BETA1} only")
        tenant = {**obj, "apiVersion": names.API_VERSION_V1BETA1}
        tenant.pop("status", None)
        return apply_defaults(tenant)
    try:
        converted = conversion.convert(obj, names.API_VERSION)
    except conversion.ConversionError as e:
        raise CliError(f"{where}: SidecarSet {obj['metadata']['name']}: {e}") from None
    converted.pop("status", None)
    return apply_defaults(converted)


async def gather(client: kubeapi.KubeClient, name: str, manager_namespace: str, namespace: str = "") -> Inputs:
    """The cluster as the controller would read it. For a NamespacedSidecarSet (`namespace`), its
    namespace's pods, sets and revisions, and the cluster SidecarSets where they may be read (its
    names must not take theirs)."""
    import asyncio

    if namespace:
        stored, cluster, own, (pods, namespaces) = await asyncio.gather(
            clusterread.get_or_none(client, f"{clusterread.tenant_path(namespace)}/{name}"),
            clusterread.list_optional(client, clusterread.SS_PATH),
            clusterread.list_optional(client, clusterread.tenant_path(namespace)),
            clusterread.pods_and_namespaces(client, namespace),
        )
        sidecarsets = [*(cluster or []), *(own or [])]
    else:
        stored, sidecarsets, (pods, namespaces) = await asyncio.gather(
            clusterread.get_or_none(client, f"{clusterread.SS_PATH}/{name}"),
            clusterread.sidecarsets(client, None, None),
            clusterread.pods_and_namespaces(client, None),
        )
    revs = await clusterread.revisions_of(client, sidecarsets, manager_namespace)
    return Inputs(stored, sidecarsets, pods, namespaces, revs)


def target_object(file_obj: JsonObj, stored: JsonObj | None, *, now: str) -> JsonObj:
    """The object the controller would read after the apply: the file's spec and metadata, the
    stored object's identity, generation (one more when the spec changes) and status."""
    out = dict(file_obj)
    meta = dict(file_obj.get("metadata") or {})
    if stored is None:
        meta.update(generation=1, creationTimestamp=now)
        out["metadata"] = meta
        return out
    old_meta = stored.get("metadata") or {}
    generation = old_meta.get("generation") or 0
    if apply_defaults({"spec": stored.get("spec") or {}})["spec"] != file_obj.get("spec"):
        generation += 1
    meta.update(
        uid=old_meta.get("uid"),
        creationTimestamp=old_meta.get("creationTimestamp"),
        resourceVersion=old_meta.get("resourceVersion"),
        generation=generation,
    )
    out["metadata"] = meta
    out["status"] = stored.get("status") or {}
    return out


def build(file_obj: JsonObj, where: str, inputs: Inputs, *, now: str, manager_namespace: str) -> JsonObj:
    """The preview document (see `_EPILOG`); its keys are stable, for tools."""
    from sidecarsets.pods import podkeys
    from sidecarsets.rollout import preview, resize, rolloutsim, specdiff

    name = object_key(file_obj)
    stored_obj = inputs.stored
    others = [o for o in inputs.sidecarsets if object_key(o) != name]
    errors = validation.validate_sidecarset(file_obj, old=stored_obj, others=others)
    if errors:
        kind = file_obj.get("kind") or names.KIND
        raise CliError(f"{where}: the API server would refuse {kind} {name}: {'; '.join(map(str, errors))}")
    try:
        target = SidecarSet.from_object(target_object(file_obj, stored_obj, now=now))
    except ModelError as e:
        raise CliError(f"{where}: SidecarSet {name}: {e}") from None
    stored = None if stored_obj is None else SidecarSet.from_object(stored_obj, tolerant=True)
    ns_labels = clusterread.namespace_labels(inputs.namespaces)
    projections = [project(p) for p in inputs.pods]
    raw_by_key = {podkeys.pod_key(p): p for p in inputs.pods}
    dropped, never = preview.unowned_pods(target, projections, ns_labels)
    doc: JsonObj = {
        "kind": target.kind,
        "sidecarSet": name,
        "file": where,
        "new": stored is None,
        "generation": {"stored": None if stored is None else stored.generation, "applied": target.generation},
        "inPlace": stored is not None and stored.hash_without_image == target.hash_without_image,
        # only images and CPU/memory change: running pods are resized in place too (pods/resize)
        "resizedInPlace": stored is not None
        and stored.hash_without_image != target.hash_without_image
        and stored.hash_without_resources == target.hash_without_resources,
        "changes": {
            "containers": [
                c.as_json() for c in specdiff.container_changes(None if stored is None else stored.spec, target.spec)
            ],
            "otherFields": list(specdiff.spec_field_changes(None if stored is None else stored.spec, target.spec)),
        },
        "rollout": None,
        "notUpgradable": [],
        "excludedByUpdateSelector": [],
        "noLongerMatched": [u.as_json() for u in dropped],
        "neverInjected": [u.as_json() for u in never],
        "newPods": [
            p.as_json() for p in _new_pods(target, inputs, ns_labels, now=now, manager_namespace=manager_namespace)
        ],
    }
    if stored is None:
        return doc
    mine = clusterread.revisions_for(target, inputs.revisions, manager_namespace)
    revision = preview.would_be_revision(target, mine)
    specs = specdiff.known_specs(stored, mine)
    resizable = resize.resizable_hashes(target, [spec for _, spec in specs])
    rollout = rolloutsim.simulate_rollout(
        target, inputs.pods, ns_labels, revision=revision, now=now, resizable=resizable
    )
    doc["rollout"] = _rollout_json(rollout, revision)
    doc["notUpgradable"] = [
        specdiff.why_not_upgradable(target, raw_by_key[k], specs).as_json() for k in rollout.not_upgradable
    ]
    doc["excludedByUpdateSelector"] = list(rollout.excluded_by_selector)
    return doc


def _rollout_json(r: rolloutsim.Rollout, revision: str) -> JsonObj:
    return {
        "revision": revision,
        "matched": len(r.matched),
        "alreadyUpdated": len(r.already_updated),
        "notReadyBefore": [{"pod": k, "reason": why} for k, why in r.not_ready_before],
        "unavailableBefore": r.unavailable_before,
        "maxUnavailable": r.max_unavailable,
        "partition": r.partition,
        "batches": [{"batch": b.number, "pods": list(b.pods)} for b in r.batches],
        "upgraded": len(r.upgraded),
        "resized": list(r.resized),
        "hotUpgradeFlips": r.flips,
        "kept": list(r.kept),
        "waitingOn": [{"pod": k, "reason": why} for k, why in r.waiting_on],
        "end": {"stage": r.stage.value, "reason": r.reason},
        "done": r.done,
    }


def _new_pods(
    target: SidecarSet,
    inputs: Inputs,
    ns_labels: Mapping[str, Mapping[str, str]],
    *,
    now: str,
    manager_namespace: str,
) -> list[newpods.NewPod]:
    from injector.manifests import newpods
    from sidecarsets.pods import podkeys

    others = [SidecarSet.from_object(o, tolerant=True) for o in inputs.sidecarsets if object_key(o) != target.name]
    revisions = {str((r.get("metadata") or {}).get("name")): r for r in inputs.revisions}
    examples: list[tuple[JsonObj, str, int]] = [
        (newpods.as_submitted(pod), podkeys.pod_key(pod), count)
        for pod, count in newpods.representatives(target, inputs.pods, ns_labels)
    ]
    if not examples:
        synthetic = newpods.synthetic_pod(target, ns_labels)
        if synthetic is not None:
            examples.append((synthetic, "", 0))
    return [
        newpods.new_pod(
            pod,
            target=target,
            others=others,
            namespace_labels=ns_labels,
            revisions=revisions,
            now=now,
            manager_namespace=manager_namespace,
            example=example,
            count=count,
        )
        for pod, example, count in examples
    ]


def run_preview(args: argparse.Namespace) -> str:
    from kuberuntime.clock import now_rfc3339

    file_obj, where = read_file(args.filename)
    target = as_stored(file_obj, where)
    name, namespace = str(target["metadata"]["name"]), namespace_of(target)
    try:
        SidecarSet.from_object(target)  # a file the engine cannot read is refused before the cluster is asked
    except ModelError as e:
        raise CliError(f"{where}: {target.get('kind') or names.KIND} {object_key(target)}: {e}") from None
    inputs = clusterread.run_against(args, "preview", lambda c: gather(c, name, args.manager_namespace, namespace))
    doc = build(target, where, inputs, now=now_rfc3339(), manager_namespace=args.manager_namespace)
    return clusterread.to_json(doc) if args.output == "json" else render(doc)
