"""Kruise's names to ours, the normalisation both sides get, and a field-by-field diff.

What is normalised away is only what the issue and the contract allow: hash values and
`updateTimestamp` (ours hash a canonical form, Kruise hashes its Go structs), the `kruise.io/`
names (ours are `sidecarctl.io/`), and fields the API server defaults on every pod container anyway
(`imagePullPolicy`, `terminationMessagePath`/`Policy`, an empty `resources`), which Kruise's Go
round trip writes out and our patch leaves to the API server. Everything else is a difference,
either documented (`differences.py`) or a failure.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from sidecarsets.spec import names

_POD_ANNOTATIONS = {
    "kruise.io/sidecarset-hash": names.ANN_HASH,
    "kruise.io/sidecarset-hash-without-image": names.ANN_HASH_WITHOUT_IMAGE,
    "kruise.io/sidecarset-injected-list": names.ANN_INJECTED_LIST,
    "kruise.io/sidecarset-inplace-update-state": names.ANN_INPLACE_STATE,
    "kruise.io/sidecarset-working-hotupgrade-container": names.ANN_WORKING_HOT,
}
_PREFIXES = {
    "version.sidecarset.kruise.io/": names.ANN_VERSION_PREFIX,
    "versionalt.sidecarset.kruise.io/": names.ANN_VERSION_ALT_PREFIX,
}
_SS_LABELS = {names.SS_LABEL_CUSTOM_VERSION: "apps.kruise.io/sidecarset-custom-version"}
HASH_ANNOTATIONS = (names.ANN_HASH, names.ANN_HASH_WITHOUT_IMAGE)


def _regroup(obj: dict[str, Any], group: tuple[str, str], labels: dict[str, str]) -> dict[str, Any]:
    """A copy of a SidecarSet moved from group[0] to group[1], its labels renamed by `labels`."""
    out = copy.deepcopy(obj)
    current, _, version = str(out.get("apiVersion", "")).partition("/")
    if current == group[0]:
        out["apiVersion"] = f"{group[1]}/{version}"
    found = (out.get("metadata") or {}).get("labels") or {}
    for old, new in labels.items():
        if old in found:
            found[new] = found.pop(old)
    return out


def to_kruise(obj: dict[str, Any]) -> dict[str, Any]:
    """A SidecarSet under our group as Kruise reads it (apps.kruise.io, its label names)."""
    return _regroup(obj, (names.GROUP, names.KRUISE_GROUP), _SS_LABELS)


def from_kruise(obj: dict[str, Any]) -> dict[str, Any]:
    """A Kruise SidecarSet under our group and label names (the inverse of `to_kruise`)."""
    return _regroup(obj, (names.KRUISE_GROUP, names.GROUP), {v: k for k, v in _SS_LABELS.items()})


def _key(key: str) -> str:
    if key in _POD_ANNOTATIONS:
        return _POD_ANNOTATIONS[key]
    for theirs, ours in _PREFIXES.items():
        if key.startswith(theirs):
            return ours + key[len(theirs) :]
    return key


def to_kruise_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod carrying our annotations (an injected pod re-created, say) as Kruise would see it."""
    theirs_of = {ours: theirs for theirs, ours in _POD_ANNOTATIONS.items()}
    text = json.dumps(pod)
    for theirs, ours in _PREFIXES.items():
        text = text.replace(ours, theirs)
    out: dict[str, Any] = json.loads(text)
    meta = out.get("metadata") or {}
    if meta.get("annotations"):
        meta["annotations"] = {theirs_of.get(k, k): v for k, v in meta["annotations"].items()}
    return out


def from_kruise_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod Kruise's webhook mutated, with Kruise's annotation names turned into ours."""
    text = json.dumps(pod)
    for theirs, ours in _PREFIXES.items():
        text = text.replace(theirs, ours)  # also in the env fieldRefs that name them
    out: dict[str, Any] = json.loads(text)
    meta = out.get("metadata") or {}
    if meta.get("annotations"):
        meta["annotations"] = {_key(k): v for k, v in meta["annotations"].items()}
    return out


def _pull_policy(image: str) -> str:
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail:
        return "IfNotPresent"
    tag = tail.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


_PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _container_defaults(container: dict[str, Any]) -> None:
    """What the API server's pod defaulting writes (Kruise's SidecarSet defaulting writes the same
    into its sidecars, our patch leaves it to the API server)."""
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")
    for env in container.get("env") or []:
        ref = (env.get("valueFrom") or {}).get("fieldRef")
        if isinstance(ref, dict):
            ref.setdefault("apiVersion", "v1")
        resource_ref = (env.get("valueFrom") or {}).get("resourceFieldRef")
        if isinstance(resource_ref, dict) and resource_ref.get("divisor") in ("0", 0):
            del resource_ref["divisor"]  # Go's zero Quantity; a divisor of 0 means 1, as absent
    for mount in container.get("volumeMounts") or []:
        for key in ("subPath", "subPathExpr"):
            if mount.get(key) == "":
                del mount[key]  # Go's omitempty: the API server stores no empty subPath either
    for key in ("livenessProbe", "readinessProbe", "startupProbe"):
        if isinstance(container.get(key), dict) and container[key].get("initialDelaySeconds") == 0:
            del container[key]["initialDelaySeconds"]
    for key in ("volumeMounts", "env", "ports"):
        if container.get(key) == []:
            del container[key]  # the API server stores no empty list (Go's omitempty)
    for key in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(key)
        if isinstance(probe, dict):
            for k, v in _PROBE_DEFAULTS.items():
                probe.setdefault(k, v)
            if isinstance(probe.get("httpGet"), dict):
                probe["httpGet"].setdefault("scheme", "HTTP")
    if "image" in container:
        container.setdefault("imagePullPolicy", _pull_policy(str(container["image"])))
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    if container.get("resources") == {}:
        del container["resources"]


def _volume_defaults(volume: dict[str, Any]) -> None:
    for kind in ("configMap", "secret", "downwardAPI", "projected"):
        if isinstance(volume.get(kind), dict):
            volume[kind].setdefault("defaultMode", 0o644)
    if isinstance(volume.get("hostPath"), dict):
        volume["hostPath"].setdefault("type", "")


def normalize_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod with hash values and times dropped and the API server's container defaults in."""
    out: dict[str, Any] = _drop_nulls(copy.deepcopy(pod))
    meta = out.setdefault("metadata", {})
    meta.pop("creationTimestamp", None)
    if out.get("status") == {}:
        del out["status"]  # Kruise's Go round trip writes an empty status
    annotations = meta.get("annotations") or {}
    for key in HASH_ANNOTATIONS:
        if key in annotations:
            entries = json.loads(annotations[key])
            annotations[key] = {
                name: {k: v for k, v in entry.items() if k not in ("hash", "updateTimestamp")}
                if isinstance(entry, dict)
                else "<hash>"  # Kruise's older form: the hash alone
                for name, entry in entries.items()
            }
    spec = out.get("spec") or {}
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            _container_defaults(container)
    for volume in spec.get("volumes") or []:
        _volume_defaults(volume)
    return out


def diff(ours: Any, theirs: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every path where the two JSON values differ, with both values (`<absent>` when missing)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            yield from diff(ours.get(key, ABSENT), theirs.get(key, ABSENT), f"{path}.{key}" if path else key)
    elif isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            yield from diff(a, b, f"{path}[{i}]")
    elif ours != theirs:
        yield path, ours, theirs


ABSENT = "<absent>"
