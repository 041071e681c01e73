"""Applying the engine's RFC 6902 operations to a document the caller owns, in place.

The webhook sends the operations; manual injection applies them. `jsonpatch` would do it too, but
it deep-copies every value it adds (a whole sidecar container, each time) and resolves every
pointer through a general class: a millisecond per injected pod, most of the CLI's time on a
large manifest. The engine emits only `add`, `replace` and `remove` on paths it built (escaped
keys, list indices, `-`), and its values are the patch's own, so applying them is a few lines.
The golden cases apply the same patches with `jsonpatch` and compare.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kuberuntime.jsontypes import JsonObj


class PatchError(ValueError):
    """An operation that does not fit the document (a bug in the caller, not bad user input)."""


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"path {path!r} does not start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _index(token: str, size: int, *, end_ok: bool) -> int:
    if token.isdigit() and (token == "0" or not token.startswith("0")):
        i = int(token)
        if i < size or (end_ok and i == size):
            return i
    raise PatchError(f"list index {token!r} is out of range (size {size})")


def apply_in_place(doc: JsonObj, ops: Iterable[JsonObj]) -> None:
    """Apply `add`, `replace` and `remove` operations to `doc`; values are inserted as they are."""
    for op in ops:
        kind = op.get("op")
        tokens = _tokens(str(op.get("path")))
        if not tokens:
            raise PatchError("operations on the whole document are not supported")
        parent: Any = doc
        for token in tokens[:-1]:
            if isinstance(parent, list):
                parent = parent[_index(token, len(parent), end_ok=False)]
            elif isinstance(parent, dict) and token in parent:
                parent = parent[token]
            else:
                raise PatchError(f"{op.get('path')}: {token!r} does not exist")
        last = tokens[-1]
        if isinstance(parent, list):
            if kind == "add":
                if last == "-":
                    parent.append(op["value"])
                else:
                    parent.insert(_index(last, len(parent), end_ok=True), op["value"])
            elif kind == "replace":
                parent[_index(last, len(parent), end_ok=False)] = op["value"]
            elif kind == "remove":
                del parent[_index(last, len(parent), end_ok=False)]
            else:
                raise PatchError(f"operation {kind!r} is not supported")
        elif isinstance(parent, dict):
            if kind in ("add", "replace"):
                if kind == "replace" and last not in parent:
                    raise PatchError(f"{op.get('path')}: nothing to replace")
                parent[last] = op["value"]
            elif kind == "remove":
                if last not in parent:
                    raise PatchError(f"{op.get('path')}: nothing to remove")
                del parent[last]
            else:
                raise PatchError(f"operation {kind!r} is not supported")
        else:
            raise PatchError(f"{op.get('path')}: the parent is not an object or a list")
