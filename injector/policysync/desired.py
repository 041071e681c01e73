"""The policies, bindings and parameter objects the sync stores: the plan's objects with a generation
time and owners.

The generation time is what a reader of a policy wants to know (when did this version of the
SidecarSets reach the API server); it must not change when nothing did, or every pass would write
again. So the plan is generated with a placeholder, hashed, and the stored time is kept when the
stored policy came from the same text (a hand edit put back keeps its time; a changed SidecarSet
gets a new one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import orjson

from injector.policy.generate import Generated
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec.model import SidecarSet

ANN_GENERATED_AT = "sidecarctl.io/generated-at"
ANN_SOURCE = "sidecarctl.io/source-hash"
ANN_DIGESTS = "sidecarctl.io/group-digests"  # each group's digest: a rewrite widens the webhook for changed groups only
# Stands in for the generation time while the policies are compared with the stored ones.
STAMP = "0000-00-00T00:00:00Z"
_SS_API = "sidecarctl.io/v1alpha1"


def objects(
    generated: tuple[Generated, ...],
    *,
    stored: Mapping[str, JsonObj],
    stored_params: Mapping[str, JsonObj],
    models: Mapping[str, SidecarSet],
    clock: Callable[[], str],
) -> tuple[dict[str, JsonObj], dict[str, JsonObj], dict[str, JsonObj]]:
    """The policies, bindings and parameter objects to store, by name, with their generation time
    settled (the parameter object's is the time its pods' bookkeeping entries record)."""
    policies: dict[str, JsonObj] = {}
    bindings: dict[str, JsonObj] = {}
    params: dict[str, JsonObj] = {}
    for g in generated:
        policy = _stamped(g.policy, stored.get(g.name), clock)
        policy["metadata"]["annotations"][ANN_DIGESTS] = orjson.dumps(g.digests, option=orjson.OPT_SORT_KEYS).decode()
        owned_by = owners(g, models)
        policy["metadata"]["ownerReferences"] = owned_by
        binding = dict(g.binding)
        binding["metadata"] = {**g.binding["metadata"], "ownerReferences": owned_by}
        policies[g.name], bindings[g.name] = policy, binding
        params[g.name] = _stamped(g.params, stored_params.get(g.name), clock)
    return policies, bindings, params


def _stamped(generated: JsonObj, stored: JsonObj | None, clock: Callable[[], str]) -> JsonObj:
    """`generated` with STAMP replaced by a time: the stored object's when it came from the same text."""
    text = orjson.dumps(generated).decode()
    source = hashlib.sha256(text.encode()).hexdigest()[:16]
    annotations = ((stored or {}).get("metadata") or {}).get("annotations") or {}
    stamp = annotations.get(ANN_GENERATED_AT) if annotations.get(ANN_SOURCE) == source else None
    stamp = stamp or clock()
    obj: JsonObj = orjson.loads(text.replace(STAMP, stamp))
    meta = obj["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), ANN_GENERATED_AT: stamp, ANN_SOURCE: source}
    return obj


def owners(g: Generated, models: Mapping[str, SidecarSet]) -> list[JsonObj]:
    """Every member owns the objects: deleting the last one lets the garbage collector remove them."""
    found = []
    for name in g.members:
        ss = models.get(name)
        if ss is not None and ss.uid:
            found.append({"apiVersion": _SS_API, "kind": "SidecarSet", "name": name, "uid": ss.uid})
    return found
