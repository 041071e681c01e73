"""Revision pins and hash-entry timestamps for manual injection: what stands in for the webhook's store and clock.

Everything the webhook would decide from its store is decided the same way here: revision pins
with `sidecarsets.spec.revisions` over the ControllerRevisions given, and the engine itself. Two
things differ, both because the output must be reproducible: a Partial pin's per-pod draw is a
hash of the object and the SidecarSet instead of a random number, and the `updateTimestamp` of a
SidecarSet's hash entry is the SidecarSet's own last change (or the caller's fixed time), never
the clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from injector.manifests.manifestcontext import Context, ManifestError
from kuberuntime.jsontypes import JsonObj, mapping
from sidecarsets.spec import names, revisions
from sidecarsets.spec.model import ModelError, SidecarSet

EPOCH = "1970-01-01T00:00:00Z"
_PIN = "spec.injectionStrategy.revision"


def last_change(obj: Mapping[str, Any]) -> str:
    """The object's last change as written in it: the latest of `creationTimestamp` and the
    `managedFields` times of writes to the object itself (not its status); EPOCH when none.

    Objects exported from a cluster (`kubectl get -o yaml`) carry these; a hand-written file has
    none, and then every run gives the same EPOCH rather than the clock.
    """
    meta = mapping(obj, "metadata")
    times = [meta.get("creationTimestamp")]
    managed = meta.get("managedFields")
    for entry in managed if isinstance(managed, list) else ():
        if isinstance(entry, Mapping) and not entry.get("subresource"):
            times.append(entry.get("time"))
    best: tuple[datetime, str] | None = None
    for text in times:
        if not isinstance(text, str):
            continue
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            continue
        if when.tzinfo is None:
            continue
        if best is None or when > best[0]:
            best = (when, text)
    return best[1] if best else EPOCH


def _draw(where: str, ss: SidecarSet) -> float:
    """A Partial pin's draw in [0, 1), fixed for the object and SidecarSet (the webhook draws at random)."""
    digest = hashlib.sha256(f"{where}\x00{ss.name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pinned_sidecarsets(
    sidecarsets: Sequence[SidecarSet],
    ctx: Context,
    *,
    pod_labels: Mapping[str, str],
    namespace: str,
    ns_labels: Mapping[str, str] | None,
    where: str,
) -> tuple[list[SidecarSet], dict[str, str]]:
    """The SidecarSets with `injectionStrategy.revision` pins resolved as the webhook resolves them
    (sidecarsets.pins), plus the timestamps of the pinned revisions used."""
    out: list[SidecarSet] = []
    stamps: dict[str, str] = {}
    for ss in sidecarsets:
        try:
            use_pin = (
                (ss.injection_revision is not None or ss.problem(_PIN) is not None)
                and ss.matches_pod(pod_labels)
                and ss.matches_namespace(namespace, ns_labels)
                and revisions.should_use_pinned(ss, pod_labels=pod_labels, rand=_draw(where, ss))
            )
            if not use_pin:
                out.append(ss)
                continue
            if ctx.revisions is None:
                pin = ss.injection_revision
                what = "" if pin is None else f" to revisionName {pin.revision_name}"
                if pin is not None and not pin.revision_name:
                    what = f" to customVersion {pin.custom_version}"
                ctx.notes.add(
                    f"SidecarSet {ss.name} pins {_PIN}{what}, but no --revisions were given: "
                    "its current spec was injected instead",
                    where,
                )
                out.append(ss)
                continue
            revision = revisions.resolve_pinned(ss, ctx.revisions.values())
            if revision is None:
                out.append(ss)
                continue
            rev_name = str((revision.get("metadata") or {}).get("name") or "")
            cache_key = (ss.name, rev_name)
            pinned = ctx._pinned.get(cache_key)
            if pinned is None:
                pinned = ctx._pinned[cache_key] = SidecarSet.from_object(revisions.apply_revision(ss, revision))
            out.append(pinned)
            stamp = last_change(revision)
            stamps[ss.name] = stamp if stamp != EPOCH else _stamp_of(ss, ctx)
        except revisions.PinnedRevisionNotFound as e:
            raise ManifestError(f"{where}: SidecarSet {ss.name}: {e} (among the --revisions given)") from None
        except (revisions.RevisionError, ModelError) as e:
            raise ManifestError(f"{where}: SidecarSet {ss.name}: pinned revision is unusable: {e}") from None
    return out, stamps


def _stamp_of(ss: SidecarSet, ctx: Context) -> str:
    found = ctx._stamps.get(ss.name)
    if found is None:
        found = ctx._stamps[ss.name] = last_change(ss.obj)
    return found


def stamp(pod: JsonObj, injected: Sequence[str], pinned: Mapping[str, str], ctx: Context) -> None:
    """Write each injected SidecarSet's own time into its hash entries, in the engine's JSON form."""
    annotations = pod["metadata"]["annotations"]
    for key in (names.ANN_HASH, names.ANN_HASH_WITHOUT_IMAGE):
        entries = json.loads(annotations[key])
        for name in injected:
            entry = entries.get(name)
            ss = ctx.sidecarset(name)
            if isinstance(entry, dict) and ss is not None:
                entry["updateTimestamp"] = pinned.get(name) or _stamp_of(ss, ctx)
        annotations[key] = json.dumps(entries, separators=(",", ":"), ensure_ascii=False)
