"""JSON values copied into every injected pod without `copy.deepcopy`.

Each pod must get objects of its own (a caller may change the patch), and a deep copy per pod is
the injection's largest cost.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

# orjson would silently turn these into other JSON values; with these options it refuses them instead.
_EXACT_DUMPS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS


def _shares_nothing(value: Any) -> bool:
    """No dict or list occurs twice in `value` (YAML anchors give shared ones; a JSON round trip splits them)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is not dict and kind is not list:
            continue
        if id(item) in seen:
            return False
        seen.add(id(item))
        stack.extend(item.values() if kind is dict else item)
    return True


class JsonTemplate:
    """A JSON value the engine puts into every injected pod, copied per pod without `copy.deepcopy`.

    Each pod must get objects of its own (a caller may change the patch), and a deep copy per pod
    is the injection's largest cost. The value is serialized on first use; each copy parses the
    bytes again, several times faster. A value the round trip would not reproduce exactly (a YAML
    date or NaN, shared subtrees) keeps the deep copy. The value must not change afterwards.
    """

    __slots__ = ("_raw", "_ready", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self._raw: bytes | None = None
        self._ready = False

    def fresh(self) -> Any:
        """A deep copy of the value, sharing nothing with it or with earlier copies."""
        if not self._ready:  # on first use: SidecarSets read only to be reconciled never pay for it
            self._raw = _exact_json(self.value)
            self._ready = True
        raw = self._raw
        return copy.deepcopy(self.value) if raw is None else orjson.loads(raw)


def _exact_json(value: Any) -> bytes | None:
    """`value` as JSON, when parsing that gives back an equal value with nothing shared; else None."""
    try:
        raw = orjson.dumps(value, option=_EXACT_DUMPS)
    except TypeError:  # orjson.JSONEncodeError: a type or an integer JSON cannot carry
        return None
    return raw if orjson.loads(raw) == value and _shares_nothing(value) else None
