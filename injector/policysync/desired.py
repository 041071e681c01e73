"""The policies and bindings the sync stores: the plan's objects with a generation time and owners.

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
    models: Mapping[str, SidecarSet],
    clock: Callable[[], str],
) -> tuple[dict[str, JsonObj], dict[str, JsonObj]]:
    """The policies and bindings to store, by name, with their generation time settled."""
    policies: dict[str, JsonObj] = {}
    bindings: dict[str, JsonObj] = {}
    for g in generated:
        text = orjson.dumps(g.policy).decode()
        source = hashlib.sha256(text.encode()).hexdigest()[:16]
        annotations = ((stored.get(g.name) or {}).get("metadata") or {}).get("annotations") or {}
        stamp = annotations.get(ANN_GENERATED_AT) if annotations.get(ANN_SOURCE) == source else None
        stamp = stamp or clock()
        policy: JsonObj = orjson.loads(text.replace(STAMP, stamp))
        meta = policy["metadata"]
        meta["annotations"] = {
            **meta["annotations"],
            ANN_GENERATED_AT: stamp,
            ANN_SOURCE: source,
            ANN_DIGESTS: orjson.dumps(g.digests, option=orjson.OPT_SORT_KEYS).decode(),
        }
        owned_by = owners(g, models)
        meta["ownerReferences"] = owned_by
        binding = dict(g.binding)
        binding["metadata"] = {**g.binding["metadata"], "ownerReferences": owned_by}
        policies[g.name], bindings[g.name] = policy, binding
    return policies, bindings


def owners(g: Generated, models: Mapping[str, SidecarSet]) -> list[JsonObj]:
    """Every member owns the objects: deleting the last one lets the garbage collector remove them."""
    found = []
    for name in g.members:
        ss = models.get(name)
        if ss is not None and ss.uid:
            found.append({"apiVersion": _SS_API, "kind": "SidecarSet", "name": name, "uid": ss.uid})
    return found
