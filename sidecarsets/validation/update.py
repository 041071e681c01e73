"""Validation of a SidecarSet update against the object it replaces.

Pods already carry the old sidecars; the controller can only swap images in place. Changes it
cannot roll out (a new or renamed sidecar, a switch between cold and hot upgrade, an in-place
upgrade of a native-sidecar init container) are refused when written, not discovered later as
a rollout that never ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarsets.enums import UpdateType
from sidecarsets.validation.base import Errors, FieldError


def _by_name(spec: Mapping[str, Any], key: str) -> dict[str, Mapping[str, Any]]:
    items = spec.get(key)
    if not isinstance(items, list):
        return {}
    return {c["name"]: c for c in items if isinstance(c, Mapping) and isinstance(c.get("name"), str)}


def _upgrade_type(container: Mapping[str, Any]) -> Any:
    strategy = container.get("upgradeStrategy")
    return strategy.get("upgradeType") if isinstance(strategy, Mapping) else None


def _indexed(spec: Mapping[str, Any], key: str) -> list[tuple[str, Mapping[str, Any], str]]:
    items = spec.get(key)
    if not isinstance(items, list):
        return []
    return [
        (f"spec.{key}[{i}]", c, c["name"])
        for i, c in enumerate(items)
        if isinstance(c, Mapping) and isinstance(c.get("name"), str)
    ]


def validate_update(spec: Mapping[str, Any], old: Mapping[str, Any], errs: Errors) -> None:
    """`spec` is the new, defaulted spec; `old` the defaulted object being replaced.

    Kruise rejects every native-sidecar init container (restartPolicy: Always) under
    RollingUpdate, which makes native sidecars unusable with the default strategy. We reject
    only what needs the unsupported upgrade: under RollingUpdate, an update that changes the
    image of such an init container. Creating one, or changing other fields, is accepted.
    """
    old_spec = old.get("spec")
    if not isinstance(old_spec, Mapping):
        return
    old_containers = _by_name(old_spec, "containers")
    for path, container, name in _indexed(spec, "containers"):
        previous = old_containers.get(name)
        if previous is None:
            errs.append(
                FieldError(
                    f"{path}.name",
                    f"container {name} is not found: containers cannot be added or renamed on update",
                )
            )
            continue
        before, after = _upgrade_type(previous), _upgrade_type(container)
        if before not in (None, "") and after != before:
            errs.append(FieldError(f"{path}.upgradeStrategy.upgradeType", f"container {name} upgradeType is immutable"))

    strategy = spec.get("updateStrategy")
    if not isinstance(strategy, Mapping) or strategy.get("type") != UpdateType.ROLLING_UPDATE:
        return
    old_inits = _by_name(old_spec, "initContainers")
    for path, container, name in _indexed(spec, "initContainers"):
        previous = old_inits.get(name)
        native = container.get("restartPolicy") == "Always"
        if native and previous is not None and previous.get("image") != container.get("image"):
            errs.append(
                FieldError(
                    f"{path}.image",
                    "The initContainer in-place upgrade is not currently supported: changing the image of "
                    "an init container with restartPolicy Always needs updateStrategy.type NotUpdate",
                )
            )
