"""The SidecarSet hashes that decide whether a pod is up to date and whether it is upgradable.

Same inputs and alphabet as Kruise (pkg/control/sidecarcontrol/hash.go): only `containers`
(and `initContainers` when one of them is a native sidecar) are hashed, so editing volumes,
pull secrets or metadata patches never marks pods outdated. The "without image" hash blanks
every image: when it differs between a pod and its SidecarSet, the change is more than an image.
A third hash also blanks `resources`: when only it agrees, the change is images and resources,
which a running pod can take too (sidecarsets.rollout.resize).

The input is canonical: SidecarSet defaults applied to the containers and keys sorted, so the
same SidecarSet hashes the same whether it comes from a user's YAML file (`sidecarctl inject`)
or back from the API server with the CRD's defaults filled in. Values therefore differ from
Kruise's own; only equality is meaningful.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import orjson

from sidecarsets.spec.defaults import apply_defaults

_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def _safe_encode(digest_hex: str) -> str:
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest_hex.encode())


def _has_native_sidecar(init_containers: list[Any]) -> bool:
    return any(isinstance(c, Mapping) and c.get("restartPolicy") == "Always" for c in init_containers)


def _hash_input(spec: Mapping[str, Any], *, blank_images: bool, blank_resources: bool = False) -> dict[str, Any]:
    only = {k: spec[k] for k in ("containers", "initContainers") if isinstance(spec.get(k), list)}
    spec = apply_defaults({"spec": only})["spec"]
    blanked = {
        **({"image": ""} if blank_images else {}),
        **({"resources": {}, "resourcesPolicy": {}} if blank_resources else {}),
    }

    def prep(items: list[Any]) -> list[Any]:
        if not blanked:
            return items
        return [{**c, **blanked} if isinstance(c, Mapping) else c for c in items]

    data: dict[str, Any] = {"containers": prep(list(spec.get("containers") or []))}
    inits = list(spec.get("initContainers") or [])
    if _has_native_sidecar(inits):
        data["initContainers"] = prep(inits)
    return data


def _canonical(data: Any) -> bytes:
    try:
        return orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        # orjson refuses integers beyond 64 bits (and non-JSON types from YAML); the API server
        # rejects such specs, but hashing one must not crash the caller that is about to say so.
        return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()


def spec_hash(spec: Mapping[str, Any]) -> str:
    """Hash of the sidecar containers, images included."""
    return _safe_encode(hashlib.sha256(_canonical(_hash_input(spec, blank_images=False))).hexdigest())


def spec_hash_without_image(spec: Mapping[str, Any]) -> str:
    """Hash of the sidecar containers with every image blanked."""
    return _safe_encode(hashlib.sha256(_canonical(_hash_input(spec, blank_images=True))).hexdigest())


def spec_hash_without_image_and_resources(spec: Mapping[str, Any]) -> str:
    """Hash of the sidecar containers with every image, `resources` and `resourcesPolicy` blanked: two specs
    with the same value differ at most in what a running pod can take in place (images by a
    patch, CPU and memory by `pods/resize`; sidecarsets.rollout.resize checks the rest)."""
    return _safe_encode(
        hashlib.sha256(_canonical(_hash_input(spec, blank_images=True, blank_resources=True))).hexdigest()
    )
