"""An informer's objects grouped by the value of one label, kept as events arrive.

Why: the controller reads a SidecarSet's ControllerRevisions on every reconcile, and walking the
whole watch cache for them made each reconcile cost as much as every SidecarSet's history together
(a burst of 600 SidecarSets spent 12 % of the control process's CPU in that walk). Grouped by the
revision's SidecarSet label, a reconcile reads its own few.
"""

from __future__ import annotations

from kuberuntime.jsontypes import JsonObj


def _key(obj: JsonObj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _label(obj: JsonObj | None, label: str) -> str | None:
    if obj is None:
        return None
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
    return None if value is None else str(value)


class LabelIndex:
    """`handle` is an informer's handler (of untransformed objects); `of(value)` the objects whose
    `label` has that value now. An object whose label changes moves between groups."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._groups: dict[str, dict[str, JsonObj]] = {}

    def handle(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        before, after = _label(old, self.label), _label(None if kind == "DELETED" else new, self.label)
        if before is not None and old is not None and before != after:
            group = self._groups.get(before, {})
            group.pop(_key(old), None)
            if not group:
                self._groups.pop(before, None)
        if after is not None and new is not None:
            self._groups.setdefault(after, {})[_key(new)] = new

    def of(self, value: str) -> list[JsonObj]:
        return list(self._groups.get(value, {}).values())
