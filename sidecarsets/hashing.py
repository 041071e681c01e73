"""The SidecarSet hashes that decide whether a pod is up to date and whether it is upgradable.

Same inputs and alphabet as Kruise (pkg/control/sidecarcontrol/hash.go): only `containers`
(and `initContainers` when one of them is a native sidecar) are hashed, so editing volumes,
pull secrets or metadata patches never marks pods outdated. The "without image" hash blanks
every image: when it differs between a pod and its SidecarSet, the change is more than an image
and cannot be rolled in place.

Key order follows the object as received (Go marshals struct fields in declaration order, we
keep insertion order), so values are stable for one manifest but only equality is meaningful.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _safe_encode(digest_hex: str) -> str:
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest_hex.encode())


def _has_native_sidecar(init_containers: list[Any]) -> bool:
    return any(isinstance(c, Mapping) and c.get("restartPolicy") == "Always" for c in init_containers)


def _hash_input(spec: Mapping[str, Any], *, blank_images: bool) -> dict[str, Any]:
    def prep(items: list[Any]) -> list[Any]:
        if not blank_images:
            return items
        return [{**c, "image": ""} if isinstance(c, Mapping) else c for c in items]

    data: dict[str, Any] = {"containers": prep(list(spec.get("containers") or []))}
    inits = list(spec.get("initContainers") or [])
    if _has_native_sidecar(inits):
        data["initContainers"] = prep(inits)
    return data


def spec_hash(spec: Mapping[str, Any]) -> str:
    """Hash of the sidecar containers, images included."""
    raw = orjson.dumps(_hash_input(spec, blank_images=False))
    return _safe_encode(hashlib.sha256(raw).hexdigest())


def spec_hash_without_image(spec: Mapping[str, Any]) -> str:
    """Hash of the sidecar containers with every image blanked."""
    raw = orjson.dumps(_hash_input(spec, blank_images=True))
    return _safe_encode(hashlib.sha256(raw).hexdigest())
