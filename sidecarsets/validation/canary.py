"""Validation of canary SidecarSets (Kruise's sidecarset-canary and sidecarset-base annotations).

A canary replaces its base in the pods it selects, only at injection, so Kruise keeps the pair
simple: the base must exist and must not be a canary itself (one level only), the base a canary
names never changes (pods injected by either would otherwise be counted by the wrong one), and a
canary is never rolled out (`updateStrategy.type: NotUpdate`): it is tried on new pods, then
promoted by changing the base.

The messages are Kruise's; the fields are named more precisely than Kruise's `metadata`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kuberuntime.jsontypes import mapping, resolve
from sidecarsets.spec import names
from sidecarsets.spec.enums import UpdateType
from sidecarsets.validation.base import Errors, invalid

BASE_FIELD = f"metadata.annotations[{names.ANN_BASE}]"


def canary_base(obj: Mapping[str, Any]) -> str | None:
    """The base SidecarSet named by the canary `obj`, or None if `obj` is not a canary."""
    annotations = mapping(obj, "metadata", "annotations")
    base = annotations.get(names.ANN_BASE)
    if annotations.get(names.ANN_CANARY) == "true" and isinstance(base, str) and base:
        return base
    return None


def _name(obj: Mapping[str, Any]) -> Any:
    return resolve(obj, "metadata", "name")


def validate_canary(obj: Mapping[str, Any], old: Mapping[str, Any] | None, others: Iterable[Any], errs: Errors) -> None:
    """`obj` is defaulted; `others` are the stored SidecarSets (the base is looked up among them)."""
    base = canary_base(obj)
    if base is None:
        return
    if base == _name(obj):
        errs.append(invalid(BASE_FIELD, base, "base sidecarSet cannot be itself"))
    if old is not None:
        old_base = resolve(old, "metadata", "annotations", names.ANN_BASE)
        if (old_base or "") != base:
            errs.append(invalid(BASE_FIELD, base, f"annotations[{names.ANN_BASE}] is immutable"))
    found = next((o for o in others if isinstance(o, Mapping) and _name(o) == base), None)
    if found is None:
        detail = f'fetch base sidecarSet[{base}] failed: {names.PLURAL}.{names.GROUP} "{base}" not found'
        errs.append(invalid(BASE_FIELD, base, detail))
    elif canary_base(found) is not None:
        errs.append(invalid(BASE_FIELD, base, "base sidecarSet cannot be canary"))
    kind = resolve(obj, "spec", "updateStrategy", "type")
    if kind != UpdateType.NOT_UPDATE:
        errs.append(invalid("spec.updateStrategy.type", kind, "RollingUpdate is not supported for canary sidecarSet"))
