"""`patchPodMetadata`: the annotations a SidecarSet puts on its pods, at injection and on upgrade.

One implementation for both moments, as Kruise applies the same function at both: `Retain` adds
a key only when the pod lacks it, `Overwrite` always sets it, `MergePatchJson` merges its JSON
into the pod's value (RFC 7386; the result compact, keys sorted) or sets it when the pod has none.
An existing value that is not JSON is left alone with a warning (Kruise fails the pod's update
instead; a warning keeps the pod's sidecars moving and says what was skipped).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kuberuntime.jsontypes import JsonObj, mapping
from sidecarsets.spec.enums import PatchPolicy
from sidecarsets.spec.sidecar import MetadataPatch


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """Compact JSON, as Go's encoding/json writes it (non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(mapping(target))
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def apply(annotations: dict[str, str], patches: Sequence[MetadataPatch], *, sidecarset: str) -> list[str]:
    """Apply one SidecarSet's `patchPodMetadata` to `annotations` in place; return warnings."""
    warnings: list[str] = []
    for patch in patches:
        for key, value in patch.annotations:
            if key not in annotations or patch.policy is PatchPolicy.OVERWRITE:
                annotations[key] = value
                continue
            if patch.policy is PatchPolicy.RETAIN:
                continue
            try:
                current = json.loads(annotations[key])
            except ValueError:
                warnings.append(
                    f"SidecarSet {sidecarset}: annotation {key} is not JSON, so patchPodMetadata "
                    "MergePatchJson cannot merge into it; left unchanged"
                )
                continue
            try:
                update = json.loads(value)
            except ValueError:
                warnings.append(
                    f"SidecarSet {sidecarset}: patchPodMetadata value for annotation {key} is not JSON; left unchanged"
                )
                continue
            annotations[key] = dumps(merge_patch(current, update), sort_keys=True)
    return warnings


def _pointer(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def upgrade_ops(
    annotations: Mapping[str, str], patches: Sequence[MetadataPatch], *, sidecarset: str
) -> tuple[list[JsonObj], list[str]]:
    """JSON Patch operations that bring a pod's `annotations` to what `patches` give (only the keys
    that change), and the warnings; for the patch that upgrades the pod's sidecars in place."""
    after = dict(annotations)
    warnings = apply(after, patches, sidecarset=sidecarset)
    ops: list[JsonObj] = [
        {"op": "add", "path": _pointer(k), "value": v} for k, v in after.items() if annotations.get(k) != v
    ]
    return ops, warnings
