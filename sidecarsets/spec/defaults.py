"""Kruise's SidecarSet defaults, as one table, applied to a plain JSON SidecarSet.

The table is read by `apply_defaults`, by the model (through `apply_defaults`), by the CRD
generator (tools/gen_crd.py puts every `schema` row into the structural schema) and by the schema
test, so a default is written once.

Why defaults are applied outside the API server too: not everything reaches the API server (the
CLI reads manifests from files), and one default cannot be expressed in the schema:
`podInjectPolicy` is BeforeAppContainer for `containers` and AfterAppContainer for
`initContainers`, while both lists share one SidecarContainer type whose schema can carry only one
default. So an object gives the same result whether or not the API server has seen it, and
validation judges an omitted field and its default alike.

Rules of the table: a row sets its field only when the field's parent object exists (rows whose
value is `{}` create the objects later rows fill in, exactly where the schema defaults an object);
as in Kruise (whose Go structs cannot tell an empty string from an absent one), an empty string
counts as unset for the enumerated string fields. Values of the wrong type are left alone for
validation to report; nothing here raises.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec.enums import InjectPolicy, PatchPolicy, RevisionPolicy, SharePolicy, UpdateType, UpgradeType


@dataclass(frozen=True)
class Default:
    """`path` is dotted; `[]` after a name means every item of that list."""

    path: str
    value: Any
    empty_is_unset: bool = True
    schema: bool = True  # the CRD schema carries it (False: only this module can apply it)


def _sidecar_rows(key: str, inject_policy: InjectPolicy) -> tuple[Default, ...]:
    item = f"spec.{key}[]"
    return (
        Default(f"{item}.podInjectPolicy", inject_policy.value, schema=False),
        Default(f"{item}.upgradeStrategy", {}, empty_is_unset=False),
        Default(f"{item}.upgradeStrategy.upgradeType", UpgradeType.COLD.value),
        Default(f"{item}.shareVolumePolicy", {}, empty_is_unset=False),
        Default(f"{item}.shareVolumePolicy.type", SharePolicy.DISABLED.value),
        Default(f"{item}.shareVolumeDevicePolicy.type", SharePolicy.DISABLED.value),
        # An explicit empty regex stays: Kruise rejects it rather than defaulting it.
        Default(f"{item}.resourcesPolicy.targetContainersNameRegex", ".*", empty_is_unset=False),
    )


DEFAULTS: tuple[Default, ...] = (
    *_sidecar_rows("containers", InjectPolicy.BEFORE_APP),
    *_sidecar_rows("initContainers", InjectPolicy.AFTER_APP),
    Default("spec.updateStrategy", {}, empty_is_unset=False),
    Default("spec.updateStrategy.type", UpdateType.ROLLING_UPDATE.value),
    Default("spec.updateStrategy.partition", 0, empty_is_unset=False),
    Default("spec.updateStrategy.maxUnavailable", 1, empty_is_unset=False),
    Default("spec.injectionStrategy.revision.policy", RevisionPolicy.ALWAYS.value),
    Default("spec.revisionHistoryLimit", 10, empty_is_unset=False),
    Default("spec.patchPodMetadata[].patchPolicy", PatchPolicy.RETAIN.value),
)


def value_of(path: str) -> Any:
    """The default of the field at `path` (a table path, e.g. `spec.updateStrategy.maxUnavailable`)."""
    for row in DEFAULTS:
        if row.path == path:
            return copy.deepcopy(row.value)
    raise KeyError(path)


def _parents(obj: Any, parts: list[str]) -> list[dict[str, Any]]:
    """The objects that hold the last part of the path, walking `[]` into every list item."""
    current: list[Any] = [obj]
    for part in parts:
        key, many = (part[:-2], True) if part.endswith("[]") else (part, False)
        step: list[Any] = []
        for node in current:
            child = node.get(key) if isinstance(node, dict) else None
            if many:
                step.extend(child if isinstance(child, list) else [])
            else:
                step.append(child)
        current = step
    return [node for node in current if isinstance(node, dict)]


def _apply(obj: dict[str, Any], row: Default) -> None:
    *parents, key = row.path.split(".")
    for parent in _parents(obj, parents):
        current = parent.get(key)
        if current is None or (row.empty_is_unset and current == ""):
            parent[key] = copy.deepcopy(row.value)


def apply_defaults(obj: JsonObj) -> JsonObj:
    """A defaulted deep copy of the SidecarSet `obj`; `obj` itself is never modified."""
    out = copy.deepcopy(obj)
    if isinstance(out, dict) and isinstance(out.get("spec"), dict):
        for row in DEFAULTS:
            _apply(out, row)
    return out


__all__ = ["DEFAULTS", "Default", "apply_defaults", "value_of"]
