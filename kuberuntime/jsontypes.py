"""Wire objects are kept as the plain JSON the API server sends.

Generated client models cost memory and time per pod and lose unknown fields; a dict keeps
every field the user wrote and round-trips byte for byte.

The price is that any field may hold anything: a pod's `metadata.labels` edited by hand can be a
string, a SidecarSet's `status` a list. Readers that must not fail on such an object read it
through `mapping` and `resolve` (an annotation holding JSON through `parse_object`), which treat
whatever is not a JSON object as an empty one, as kopf's `resolve` does and as Go's decoder
leaves a mistyped field at its zero value.

One part of an object is not kept, where a reader asks: `loads_without_managed_fields` decodes
pods without their `metadata.managedFields` (see the comment above it for why, and why the cut is
exact).
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


# -- managedFields ----------------------------------------------------------------------------------
# JSON of Kubernetes objects decoded without their `metadata.managedFields`.
#
# Why: kube-apiserver cannot leave managedFields out of a read or a watch event, and they are the
# largest part of a pod's JSON that nobody here reads. Of an injected pod of the benchmarks (32 KB as
# the API server sends it) they are 15.5 KB: an entry per field manager, each a trie of every field
# that manager set, which orjson turns into a dict per node. Measured on 1,000 such watch events, in
# one process on the 2-core VM (2026-12-08): 1,066-1,153 µs to decode one whole, 352-440 µs to cut
# and decode it without them (the cut 36 µs of that): a third of the CPU. A manager decodes every
# injected pod at start (its first state) and again at every change of one, and keeps a projection
# of a few hundred bytes.
#
# How, and why the cut is exact for what kube-apiserver sends: it encodes a built-in object's fields
# in the order of its Go struct, and `managedFields` is the last field of ObjectMeta, so in a pod the
# array ends where the metadata does, right before `"spec"`: the first `]},"spec":` after
# `,"managedFields":[`. That text cannot occur earlier, inside the array: in a JSON string its `"`
# would be escaped, and a managed-fields entry holds no array (manager, operation, apiVersion, time,
# fieldsType, subresource and the fieldsV1 trie, all of whose keys carry an `f:`, `k:`, `v:` or `i:`
# prefix). Anything not in that shape is decoded whole: an array followed by another metadata field
# (`],"`, as in an object whose keys were sorted), a span that reaches another object's `"metadata":`,
# no end found, or a result orjson refuses.

_MF_START = b',"managedFields":['
_MF_END = b']},"spec":'
_MF_FOREIGN = (b'],"', b'"metadata":')  # in a span, either means the array did not end with the metadata


def without_managed_fields(raw: bytes) -> bytes:
    """`raw` with every pod's `"managedFields":[...]` cut out, where the cut is exact (see above)."""
    out: list[bytes] = []
    pos = 0
    while (start := raw.find(_MF_START, pos)) >= 0:
        end = raw.find(_MF_END, start)
        if end < 0 or any(raw.find(marker, start, end) >= 0 for marker in _MF_FOREIGN):
            break
        out.append(raw[pos:start])
        pos = end + 1  # keep the `}` that closes the metadata
    if not out:
        return raw
    out.append(raw[pos:])
    return b"".join(out)


def loads_without_managed_fields(raw: bytes) -> Any:
    """orjson.loads of `raw` without pods' managedFields, or of all of it where a cut does not parse."""
    lean = without_managed_fields(raw)
    if lean is raw:
        return orjson.loads(raw)
    try:
        return orjson.loads(lean)
    except orjson.JSONDecodeError:
        return orjson.loads(raw)
