"""RFC 6902 operations emitted directly from what injection adds, never from a diff of two pods.

Diffing whole pods is slow on large pods and yields index-wise patches that break when another
webhook has reordered containers; emitting the operations keeps every op tied to its intent.
Paths refer to the pod as the webhook received it and the ops apply in order:

* lists (containers, initContainers): same-named entries are replaced at their index first, then
  the "before the app" block is inserted at indices 0..n-1 (so it keeps its order), then the
  "after the app" entries are appended with `-`; an absent or empty list is added whole;
* volumes, imagePullSecrets: appended with `-`, or added whole when absent or empty;
* maps (annotations, labels): one `add` per new or changed key, or the whole map when absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kuberuntime.jsontypes import JsonObj


def escape(key: str) -> str:
    """A map key as one JSON Pointer reference token (RFC 6901: `~` → `~0`, `/` → `~1`)."""
    return key.replace("~", "~0").replace("/", "~1")


def list_ops(
    path: str,
    original: Sequence[Any] | None,
    *,
    replace: Mapping[int, JsonObj],
    before: Sequence[JsonObj],
    after: Sequence[JsonObj],
) -> list[JsonObj]:
    """Ops that replace entries in place, prepend `before` as a block and append `after`."""
    if not original:
        items = [*before, *after]
        return [{"op": "add", "path": path, "value": items}] if items else []
    ops: list[JsonObj] = [{"op": "replace", "path": f"{path}/{i}", "value": v} for i, v in sorted(replace.items())]
    ops.extend({"op": "add", "path": f"{path}/{i}", "value": v} for i, v in enumerate(before))
    ops.extend({"op": "add", "path": f"{path}/-", "value": v} for v in after)
    return ops


def append_ops(path: str, original: Sequence[Any] | None, additions: Sequence[JsonObj]) -> list[JsonObj]:
    """Ops that append `additions` to a list that may be absent."""
    return list_ops(path, original, replace={}, before=(), after=additions)


def map_ops(path: str, original: Mapping[str, Any] | None, updated: Mapping[str, Any]) -> list[JsonObj]:
    """Ops that turn `original` into `updated`, which only adds or changes keys."""
    if original is None:
        return [{"op": "add", "path": path, "value": dict(updated)}] if updated else []
    return [
        {"op": "add", "path": f"{path}/{escape(k)}", "value": v}
        for k, v in updated.items()
        if k not in original or original[k] != v
    ]
