"""Tolerant reads of the few SidecarSet fields that status and upgrade planning depend on.

Status and planning run on the raw SidecarSet JSON (validated at admission, but an object
written before validation existed, or edited past it, must not crash the controller), so
every read here falls back to an empty value instead of raising.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarsets.names import NS_NAME_LABEL

HOT_UPGRADE = "HotUpgrade"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def name(ss: Mapping[str, Any]) -> str:
    value = _map(ss.get("metadata")).get("name")
    return value if isinstance(value, str) else ""


def spec(ss: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(ss.get("spec"))


def update_strategy(ss: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(spec(ss).get("updateStrategy"))


def pod_selector(ss: Mapping[str, Any]) -> Mapping[str, Any] | None:
    sel = spec(ss).get("selector")
    return sel if isinstance(sel, Mapping) else None


def namespace_selector(ss: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """`spec.namespace` pins one namespace and overrides `namespaceSelector`; None means all."""
    ns = spec(ss).get("namespace")
    if isinstance(ns, str) and ns:
        return {"matchLabels": {NS_NAME_LABEL: ns}}
    sel = spec(ss).get("namespaceSelector")
    return sel if isinstance(sel, Mapping) else None


def _named(items: Any) -> list[Mapping[str, Any]]:
    if not isinstance(items, list):
        return []
    return [c for c in items if isinstance(c, Mapping) and isinstance(c.get("name"), str) and c["name"]]


def containers(ss: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return _named(spec(ss).get("containers"))


def is_hot(container: Mapping[str, Any]) -> bool:
    return _map(container.get("upgradeStrategy")).get("upgradeType") == HOT_UPGRADE


def cold_containers(ss: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in containers(ss) if not is_hot(c)]


def hot_names(ss: Mapping[str, Any]) -> list[str]:
    return [c["name"] for c in containers(ss) if is_hot(c)]


def native_init_names(ss: Mapping[str, Any]) -> list[str]:
    """Init containers with `restartPolicy: Always` run for the pod's lifetime (native sidecars)."""
    return [c["name"] for c in _named(spec(ss).get("initContainers")) if c.get("restartPolicy") == "Always"]


def sidecar_list(ss: Mapping[str, Any]) -> list[str]:
    """Sorted logical sidecar names, as recorded in the pod's hash annotation."""
    return sorted({c["name"] for c in containers(ss)} | set(native_init_names(ss)))
