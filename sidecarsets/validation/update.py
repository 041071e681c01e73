"""Validation of a SidecarSet update against the object it replaces.

Pods already carry the old sidecars; the controller can only swap images in place. Changes it
cannot roll out (a new or renamed sidecar, a switch between cold and hot upgrade) are refused
when written, not discovered later as a rollout that never ends. Native-sidecar init containers
(`restartPolicy: Always`) are rolled in place like containers, which Kruise refuses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kuberuntime.jsontypes import resolve
from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation.base import Errors, FieldError


def _upgrade_type(container: Mapping[str, Any]) -> Any:
    return resolve(container, "upgradeStrategy", "upgradeType")


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
    """`spec` is the new, defaulted spec (walked as JSON, so errors name fields by index); `old`
    the object being replaced, read through the model.

    Kruise rejects every native-sidecar init container (restartPolicy: Always) under
    RollingUpdate; here their image changes are rolled in place like the containers'.
    """
    if not isinstance(old.get("spec"), Mapping):
        return
    previous_model = SidecarSet.from_object(old, tolerant=True)
    old_containers = {c.name: c for c in previous_model.containers}
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
        if _upgrade_type(container) != previous.upgrade_type:
            errs.append(FieldError(f"{path}.upgradeStrategy.upgradeType", f"container {name} upgradeType is immutable"))
