"""Pod annotations written at injection: the SidecarSet bookkeeping and `patchPodMetadata`
(sidecarsets.spec.podmeta, shared with the in-place upgrade).

The bookkeeping annotations have Kruise's JSON shapes so that the controller (and anyone used to
Kruise) can read them: a map from SidecarSet name to
`{"updateTimestamp", "hash", "sidecarSetName", "sidecarList", "controllerRevision"?}`, merged with
the entries other SidecarSets wrote earlier, and a sorted comma-joined list of SidecarSet names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import podmeta
from sidecarsets.spec.model import SidecarSet

_dumps = podmeta.dumps
# patchPodMetadata at injection is the same function the controller applies on upgrade.
apply_patch_pod_metadata = podmeta.apply
merge_patch = podmeta.merge_patch


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
    ours = {ss.name: ss for ss in sidecarsets}
    stamp = _dumps(now)
    parts: list[str] = []
    for name in sorted({*hash_map, *ours}):
        ss = ours.get(name)
        if ss is None:
            parts.append(f"{_dumps(name)}:{_dumps(hash_map[name])}")
        else:
            head, tail = entry_text(ss, without_image=without_image)
            parts.append(head + stamp + tail)
    # json.dumps of the whole map writes exactly these parts, joined.
    return "{" + ",".join(parts) + "}"


# (without_image, name, hash, container names, revision) → the entry's JSON text around the timestamp
_ENTRY_TEXTS: dict[tuple[object, ...], tuple[str, str]] = {}
_MAX_ENTRY_TEXTS = 4096
_STAMP_PLACEHOLDER = ""


def entry_text(ss: SidecarSet, *, without_image: bool) -> tuple[str, str]:
    """`"name":{"updateTimestamp":` and the rest of the entry, as `_dumps` writes them.

    Only the timestamp differs from pod to pod, so the rest is written once per SidecarSet version.
    """
    revision = None if without_image else ss.latest_revision
    key = (without_image, ss.name, ss.hash_without_image if without_image else ss.hash, ss.container_names, revision)
    found = _ENTRY_TEXTS.get(key)
    if found is not None:
        return found
    entry: JsonObj = {
        "updateTimestamp": _STAMP_PLACEHOLDER,
        "hash": ss.hash_without_image if without_image else ss.hash,
        "sidecarSetName": ss.name,
        "sidecarList": sorted(ss.container_names),
    }
    if revision:
        entry["controllerRevision"] = revision
    opening = '{"updateTimestamp":'
    # Keys are written in insertion order, so the text opens with the placeholder timestamp.
    tail = _dumps(entry)[len(opening) + len(_dumps(_STAMP_PLACEHOLDER)) :]
    found = (f"{_dumps(ss.name)}:{opening}", tail)
    if len(_ENTRY_TEXTS) >= _MAX_ENTRY_TEXTS:
        _ENTRY_TEXTS.clear()
    _ENTRY_TEXTS[key] = found
    return found


def injected_list(raw: str | None) -> set[str]:
    """The SidecarSets the injected-list annotation names."""
    return {s.strip() for s in (raw or "").split(",") if s.strip()}


def with_injected_list(raw: str | None, sidecarsets: Sequence[str], *, drop: frozenset[str] = frozenset()) -> str:
    """The injected-list annotation with `sidecarsets` added and `drop` removed: sorted, comma-joined, no duplicates."""
    return ",".join(sorted((injected_list(raw) - drop) | set(sidecarsets)))
