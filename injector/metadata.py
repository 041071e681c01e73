"""Pod annotations written at injection: the SidecarSet bookkeeping and `patchPodMetadata`.

The bookkeeping annotations have Kruise's JSON shapes so that the controller (and anyone used to
Kruise) can read them: a map from SidecarSet name to
`{"updateTimestamp", "hash", "sidecarSetName", "sidecarList", "controllerRevision"?}`, merged with
the entries other SidecarSets wrote earlier, and a sorted comma-joined list of SidecarSet names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sidecarsets.jsontypes import JsonObj
from sidecarsets.model import MetadataPatch, SidecarSet


def _dumps(value: Any, *, sort_keys: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)


def read_hash_map(raw: str | None) -> tuple[dict[str, Any], str | None]:
    """Parse a hash annotation; an unreadable one is replaced (with a warning) rather than fatal."""
    if not raw:
        return {}, None
    try:
        value = json.loads(raw)
    except ValueError:
        return {}, "annotation is not JSON; it is rewritten"
    if not isinstance(value, dict):
        return {}, "annotation is not a JSON object; it is rewritten"
    return value, None


def recorded_hash(hash_map: Mapping[str, Any], sidecarset: str) -> str | None:
    """The hash recorded for a SidecarSet: the entry's `hash`, or the legacy `{"ss": "hash"}` value."""
    entry = hash_map.get(sidecarset)
    if isinstance(entry, str):
        return entry
    if isinstance(entry, Mapping) and isinstance(entry.get("hash"), str):
        return str(entry["hash"])
    return None


def with_entries(
    hash_map: Mapping[str, Any], sidecarsets: Sequence[SidecarSet], *, now: str, without_image: bool
) -> str:
    """The hash annotation after recording `sidecarsets`; other SidecarSets' entries are kept."""
    out = dict(hash_map)
    for ss in sidecarsets:
        entry: JsonObj = {
            "updateTimestamp": now,
            "hash": ss.hash_without_image if without_image else ss.hash,
            "sidecarSetName": ss.name,
            "sidecarList": sorted(ss.container_names),
        }
        if not without_image and ss.latest_revision:
            entry["controllerRevision"] = ss.latest_revision
        out[ss.name] = entry
    return _dumps({k: out[k] for k in sorted(out)})


def with_injected_list(raw: str | None, sidecarsets: Sequence[str]) -> str:
    """The injected-list annotation with `sidecarsets` added: sorted, comma-joined, no duplicates."""
    current = {s.strip() for s in (raw or "").split(",") if s.strip()}
    return ",".join(sorted(current | set(sidecarsets)))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def apply_patch_pod_metadata(
    annotations: dict[str, str], patches: Sequence[MetadataPatch], *, sidecarset: str
) -> list[str]:
    """Apply one SidecarSet's `patchPodMetadata` to `annotations` in place; return warnings.

    Retain adds a key only when absent, Overwrite always sets it, MergePatchJson merges the value
    into the existing JSON (an existing value that is not JSON is left alone, with a warning).
    """
    warnings: list[str] = []
    for patch in patches:
        for key, value in patch.annotations:
            if key not in annotations or patch.policy == "Overwrite":
                annotations[key] = value
                continue
            if patch.policy == "Retain":
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
            annotations[key] = _dumps(merge_patch(current, update), sort_keys=True)
    return warnings
