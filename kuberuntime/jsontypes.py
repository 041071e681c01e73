"""Wire objects are kept as the plain JSON the API server sends.

Generated client models cost memory and time per pod and lose unknown fields; a dict keeps
every field the user wrote and round-trips byte for byte.

The price is that any field may hold anything: a pod's `metadata.labels` edited by hand can be a
string, a SidecarSet's `status` a list. Readers that must not fail on such an object read it
through `mapping` and `resolve` (an annotation holding JSON through `parse_object`), which treat
whatever is not a JSON object as an empty one, as kopf's `resolve` does and as Go's decoder
leaves a mistyped field at its zero value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

import orjson

JsonObj = dict[str, Any]


def is_object(value: object) -> TypeGuard[Mapping[str, Any]]:
    # Parsed JSON gives plain dicts; the ABC check (much slower) is for other callers' mappings.
    return type(value) is dict or isinstance(value, Mapping)


def resolve(value: object, *path: str) -> Any:
    """The value at `path` below `value` (`value` itself for no path), or None where a key is
    absent or something on the way is not an object."""
    for key in path:
        if not is_object(value):
            return None
        value = value.get(key)
    return value


def mapping(value: object, *path: str) -> Mapping[str, Any]:
    """The JSON object at `path` below `value` (`value` itself for no path), or an empty one where
    it is absent or is not an object. Read only: copy it (`dict(...)`) before changing it."""
    found = resolve(value, *path)
    return found if is_object(found) else {}


def parse_object(text: object) -> Mapping[str, Any]:
    """The JSON object an annotation holds, or an empty one when it is absent, not JSON or not an
    object (for readers that report nothing; the engine warns about such an annotation instead)."""
    if not isinstance(text, str | bytes) or not text:
        return {}
    try:
        return mapping(orjson.loads(text))
    except orjson.JSONDecodeError:
        return {}
