"""ControllerRevision history of SidecarSets, with Kruise's semantics.

Why keep history at all: `injectionStrategy.revision` lets new pods get an *older* sidecar spec
(pin by `revisionName` or by `customVersion` label) while a new one is rolled out gradually, and
pods record the `controllerRevision` they were injected or upgraded with. Both need the old specs
stored somewhere the webhook can read them: one ControllerRevision per distinct spec, in the
manager's namespace, owned by the (cluster-scoped) SidecarSet so garbage collection removes them
with it.

The rules (Kruise `registerLatestRevision` / `truncateHistory`):
- A revision stores `{"spec": {"$patch": "replace", volumes, containers, initContainers,
  imagePullSecrets, patchPodMetadata}}` — only the fields injection uses; editing the selector or
  the update strategy makes no new revision.
- Same data as the newest revision → reuse it. Same data as an older one → roll back: that
  revision's `.revision` becomes newest + 1 (no new object). Otherwise create `<ss>-<hash>` with
  `.revision` = newest + 1; a name taken by different data bumps `collisionCount` and rehashes.
- Keep at most `max(1, revisionHistoryLimit)` (default 10), deleting the oldest first, but never
  the newest, a revision a pod still records, or the one `injectionStrategy.revision` pins.

The planning is pure (`plan_history`) so every branch is tested without a cluster;
`sidecarsets.controller.history.sync_history` only carries the plan out.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from kuberuntime.jsontypes import JsonObj, mapping, resolve
from sidecarsets.spec import selectors
from sidecarsets.spec.enums import RevisionPolicy
from sidecarsets.spec.hashing import spec_hash, spec_hash_without_image
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.names import (
    API_VERSION,
    API_VERSION_V1BETA1,
    REVISION_LABEL_SIDECARSET,
    SS_ANN_HASH,
    SS_ANN_HASH_WITHOUT_IMAGE,
    SS_LABEL_CUSTOM_VERSION,
)
from sidecarsets.spec.strategies import RevisionPin
from sidecarsets.values import intorpercent

log = logging.getLogger("sidecarsets.revisions")

REVISION_FIELDS = ("volumes", "containers", "initContainers", "imagePullSecrets", "patchPodMetadata")
DEFAULT_HISTORY_LIMIT = 10
HASH_LENGTH = 10
# The alphabet of hashing.py (Kruise's SafeEncodeString): no vowels, so no words in names.
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_NOT_COPIED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
MAX_COLLISIONS = 1000


class RevisionError(ValueError):
    """A SidecarSet or ControllerRevision that cannot be used; the message names the field."""


class PinnedRevisionNotFound(RevisionError):
    """`injectionStrategy.revision` names a revision that does not exist (pod creation must fail)."""


def owner_name(ss: SidecarSet) -> str:
    """The name its revisions carry: metadata.name (a NamespacedSidecarSet's live in its own namespace,
    where that name is unique)."""
    name = ss.object_name or ss.name
    if not name:
        raise RevisionError("metadata.name is required")
    return name


def _require(ss: SidecarSet, *fields: str, exact: bool = False) -> None:
    """Raise RevisionError naming the field when the SidecarSet has a problem on one of `fields`."""
    problem = ss.problem(*fields, exact=exact)
    if problem is not None:
        raise RevisionError(problem.message)


def revision_data(ss: SidecarSet) -> JsonObj:
    """What a ControllerRevision stores for this SidecarSet: the injected fields that are present."""
    spec = ss.spec
    stored: JsonObj = {"$patch": "replace"}
    for key in REVISION_FIELDS:
        if spec.get(key) is not None:
            stored[key] = copy.deepcopy(spec[key])
    return {"spec": stored}


def revision_hash(data: Mapping[str, Any], collision_count: int = 0) -> str:
    """A short, stable name suffix for `data`; a different `collision_count` gives a different one."""
    raw = orjson.dumps(data, option=orjson.OPT_SORT_KEYS) + str(int(collision_count)).encode()
    digest = hashlib.sha256(raw).hexdigest()
    return "".join(_ALPHABET[ord(c) % len(_ALPHABET)] for c in digest[:HASH_LENGTH])


def revision_name(ss_name: str, hash: str) -> str:
    return f"{ss_name}-{hash}"


def revision_number(revision: Mapping[str, Any]) -> int:
    value = revision.get("revision")
    if isinstance(value, bool) or not isinstance(value, int):
        name = resolve(revision, "metadata", "name")
        raise RevisionError(f"ControllerRevision {name}: revision must be an integer, got {value!r}")
    return value


def sort_revisions(revisions: Iterable[Mapping[str, Any]]) -> list[JsonObj]:
    """Oldest first: by `.revision`, then creation time, then name (client-go's order)."""
    return sorted(
        (dict(r) for r in revisions),
        key=lambda r: (
            revision_number(r),
            str(resolve(r, "metadata", "creationTimestamp") or ""),
            str(resolve(r, "metadata", "name")),
        ),
    )


def history_limit(ss: SidecarSet) -> int:
    _require(ss, "spec.revisionHistoryLimit")
    return ss.revision_history_limit


def collision_count(ss: SidecarSet) -> int:
    _require(ss, "status.collisionCount")
    return ss.collision_count


def owner_reference(ss: SidecarSet) -> JsonObj:
    """The SidecarSet as controller owner; no blockOwnerDeletion, so no finalizer RBAC is needed."""
    uid = ss.uid
    if not uid:
        raise RevisionError("metadata.uid is required to own ControllerRevisions (is the SidecarSet stored?)")
    api_version = API_VERSION_V1BETA1 if ss.namespaced else API_VERSION
    return {"apiVersion": api_version, "kind": ss.kind, "name": owner_name(ss), "uid": str(uid), "controller": True}


def new_revision(ss: SidecarSet, *, name: str, number: int) -> JsonObj:
    """The ControllerRevision object for the SidecarSet's current spec (namespace left to the caller)."""
    ss_name = owner_name(ss)
    labels = {**ss.labels, REVISION_LABEL_SIDECARSET: ss_name}
    if ss.custom_version:
        labels[SS_LABEL_CUSTOM_VERSION] = ss.custom_version
    annotations = {k: v for k, v in ss.annotations.items() if k not in _NOT_COPIED_ANNOTATIONS}
    annotations[SS_ANN_HASH] = ss.hash
    annotations[SS_ANN_HASH_WITHOUT_IMAGE] = ss.hash_without_image
    metadata: JsonObj = {"name": name, "labels": labels, "annotations": annotations}
    if ss.uid:
        metadata["ownerReferences"] = [owner_reference(ss)]
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": metadata,
        "data": revision_data(ss),
        "revision": number,
    }


def _injection_revision(ss: SidecarSet) -> RevisionPin | None:
    """`injectionStrategy.revision`, or None when not pinned; RevisionError when it cannot be read."""
    _require(ss, "spec.injectionStrategy", exact=True)
    _require(ss, "spec.injectionStrategy.revision")
    return ss.injection_revision


def _pinned(ss: SidecarSet, revisions: Iterable[Mapping[str, Any]]) -> tuple[str, JsonObj | None] | None:
    pin = _injection_revision(ss)
    if pin is None:
        return None
    name, version = pin.revision_name, pin.custom_version
    revs = list(revisions)
    if name:
        found = next((r for r in revs if resolve(r, "metadata", "name") == name), None)
        return f"revisionName {name!r}", (dict(found) if found is not None else None)
    ss_name = owner_name(ss)
    matching = [
        r
        for r in revs
        if mapping(r, "metadata", "labels").get(SS_LABEL_CUSTOM_VERSION) == version
        and mapping(r, "metadata", "labels").get(REVISION_LABEL_SIDECARSET, ss_name) == ss_name
    ]
    return f"customVersion {version!r}", (sort_revisions(matching)[-1] if matching else None)


def resolve_pinned(ss: SidecarSet, revisions: Iterable[Mapping[str, Any]]) -> JsonObj | None:
    """The revision `injectionStrategy.revision` pins, or None when nothing is pinned.

    `revisionName` picks that revision; `customVersion` the highest `.revision` labelled with it.
    Raises PinnedRevisionNotFound when a pin is set but nothing matches: Kruise then refuses to
    create the pod rather than silently injecting another spec.
    """
    pinned = _pinned(ss, revisions)
    if pinned is None:
        return None
    what, found = pinned
    if found is None:
        raise PinnedRevisionNotFound(
            f"spec.injectionStrategy.revision: no ControllerRevision of SidecarSet {owner_name(ss)!r} matches {what}"
        )
    return found


def _pinned_name(ss: SidecarSet, revisions: Iterable[Mapping[str, Any]]) -> str | None:
    pin = _injection_revision(ss)
    if pin is None:
        return None
    if pin.revision_name:
        return pin.revision_name  # kept even if not listed: it may be created later under that name
    pinned = _pinned(ss, revisions)
    found = pinned[1] if pinned else None
    return str(resolve(found, "metadata", "name")) if found is not None else None


def apply_revision(ss: SidecarSet, revision: Mapping[str, Any]) -> JsonObj:
    """A copy of the SidecarSet whose injected fields are the revision's (the webhook injects it).

    Only the revision's fields are replaced (absent ones removed); selector and strategies stay the
    current ones. The hash annotations and `status.latestRevision` describe the revision, so pods
    injected from it record the right hash and `controllerRevision`.
    """
    stored = resolve(revision, "data", "spec")
    rev_name = str(resolve(revision, "metadata", "name") or "")
    if not isinstance(stored, Mapping):
        raise RevisionError(f"ControllerRevision {rev_name}: data.spec must be an object")
    out: JsonObj = copy.deepcopy(dict(ss.obj))
    spec = dict(mapping(out, "spec"))
    for key in REVISION_FIELDS:
        if stored.get(key) is not None:
            spec[key] = copy.deepcopy(stored[key])
        else:
            spec.pop(key, None)
    out["spec"] = spec
    meta = dict(mapping(out, "metadata"))
    annotations = dict(meta.get("annotations") or {})
    rev_annotations = mapping(revision, "metadata", "annotations")
    annotations[SS_ANN_HASH] = str(rev_annotations.get(SS_ANN_HASH) or spec_hash(spec))
    annotations[SS_ANN_HASH_WITHOUT_IMAGE] = str(
        rev_annotations.get(SS_ANN_HASH_WITHOUT_IMAGE) or spec_hash_without_image(spec)
    )
    meta["annotations"] = annotations
    out["metadata"] = meta
    status = dict(out.get("status") or {})
    status["latestRevision"] = rev_name
    out["status"] = status
    return out


def should_use_pinned(ss: SidecarSet, *, pod_labels: Mapping[str, str], rand: float) -> bool:
    """Whether a new pod gets the pinned revision rather than the latest spec.

    No pin → False. `updateStrategy.paused` or policy `Always` → True. `Partial`: a pod outside
    `updateStrategy.selector` keeps the pinned revision; otherwise a percentage `partition` p%
    keeps a random p% of new pods on it (`rand` in [0, 1) is the caller's draw), and no partition
    or a plain number gives the latest. A field it needs that cannot be read raises RevisionError.
    """
    pin = _injection_revision(ss)
    if pin is None:
        return False
    _require(ss, "spec.updateStrategy", exact=True)
    strategy = ss.update_strategy
    if strategy.paused or pin.policy is RevisionPolicy.ALWAYS:
        return True
    _require(ss, "spec.updateStrategy.selector")
    if strategy.selector and not selectors.matches(strategy.selector, pod_labels):
        return True
    _require(ss, "spec.updateStrategy.partition")
    if strategy.partition is None:
        return False
    value, is_percent = intorpercent.parse(strategy.partition)
    return is_percent and rand < value / 100


@dataclass(frozen=True)
class HistoryPlan:
    """What `sync_history` must do. Exactly one of reuse / `renumber` / `create` applies."""

    latest_name: str
    latest_number: int
    collision_count: int
    create: JsonObj | None = None  # a new ControllerRevision (without namespace)
    renumber: str | None = None  # an older equal revision that becomes the newest (rollback)
    custom_version: str | None = None  # label value to set on the latest revision
    delete: tuple[str, ...] = field(default=())  # oldest first
    over_limit: int = 0  # revisions kept beyond the limit because they are in use

    @property
    def action(self) -> str:
        return "create" if self.create is not None else "rollback" if self.renumber else "reuse"


def plan_history(ss: SidecarSet, existing: Iterable[Mapping[str, Any]], *, in_use: set[str]) -> HistoryPlan:
    """Decide the latest revision and the truncation, from the SidecarSet and its revisions.

    `in_use` names revisions that must survive truncation (those pods record); the revision pinned
    by `injectionStrategy.revision` is added here.
    """
    ss_name = owner_name(ss)
    revs = sort_revisions(existing)
    data = revision_data(ss)
    next_number = revision_number(revs[-1]) + 1 if revs else 1
    collisions = collision_count(ss)
    create: JsonObj | None = None
    renumber: str | None = None

    equal = [r for r in revs if r.get("data") == data]
    if equal and equal[-1] is revs[-1]:
        latest = revs[-1]
    elif equal:
        latest = {**equal[-1], "revision": next_number}
        renumber = str(resolve(latest, "metadata", "name"))
        revs = [r for r in revs if r is not equal[-1]] + [latest]
    else:
        taken = {str(resolve(r, "metadata", "name")) for r in revs}
        name = revision_name(ss_name, revision_hash(data, collisions))
        while name in taken:
            collisions += 1
            if collisions > collision_count(ss) + MAX_COLLISIONS:
                raise RevisionError(f"SidecarSet {ss_name}: no free revision name after {MAX_COLLISIONS} tries")
            name = revision_name(ss_name, revision_hash(data, collisions))
        create = latest = new_revision(ss, name=name, number=next_number)
        revs.append(latest)

    latest_name = str(resolve(latest, "metadata", "name"))
    version = ss.custom_version
    relabel = None
    if version and mapping(latest, "metadata", "labels").get(SS_LABEL_CUSTOM_VERSION) != version:
        relabel = version
        meta = dict(mapping(latest, "metadata"))
        meta["labels"] = {**mapping(latest, "metadata", "labels"), SS_LABEL_CUSTOM_VERSION: version}
        revs[-1] = {**latest, "metadata": meta}

    limit = history_limit(ss)
    delete: list[str] = []
    excess = len(revs) - limit
    if excess > 0:
        keep = set(in_use)
        pinned = _pinned_name(ss, revs)
        if pinned:
            keep.add(pinned)
        for r in revs[:-1]:
            if excess == 0:
                break
            name = str(resolve(r, "metadata", "name"))
            if name in keep:
                continue
            delete.append(name)
            excess -= 1
    return HistoryPlan(
        latest_name=latest_name,
        latest_number=revision_number(revs[-1]),
        collision_count=collisions,
        create=create,
        renumber=renumber,
        custom_version=relabel,
        delete=tuple(delete),
        over_limit=max(0, excess),
    )
