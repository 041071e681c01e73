"""Validation of `spec.overrides`: what pods may change of a sidecar by the `sidecarctl.io/overrides`
annotation, and within which bounds.

A bound that cannot be read allows nothing when pods are injected (sidecarsets.spec.sidecar), so
every pod that asks is refused: the mistake is cheaper to see here, once, on the one edit that
made it. Checked: each entry names a sidecar of this SidecarSet (a container or an init container)
once; only `cpu` and `memory` take a range, and each end is a non-negative quantity with `min` not
above `max`; env names are names a container can carry, each listed once; an entry allows something.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarsets.spec.sidecar import OVERRIDABLE_RESOURCES
from sidecarsets.validation.base import (
    Errors,
    FieldError,
    duplicate,
    invalid,
    list_field,
    not_found,
    obj_field,
    objects,
    required,
    str_field,
    unsupported,
)
from sidecarsets.validation.containers import env_name_problem
from sidecarsets.validation.podrules import quantity_value


def _sidecar_names(spec: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        for c in items if isinstance(items, list) else ():
            if isinstance(c, Mapping) and isinstance(c.get("name"), str):
                found.add(c["name"])
    return found


def validate_overrides(spec: Mapping[str, Any], errs: Errors) -> None:
    path = "spec.overrides"
    sidecars = _sidecar_names(spec)
    seen: set[str] = set()
    for _, item_path, item in objects(list_field(spec, "overrides", path, errs), path, errs):
        name = str_field(item, "containerName", f"{item_path}.containerName", errs)
        if name is None:
            if item.get("containerName") is None:
                errs.append(required(f"{item_path}.containerName"))
        elif name in seen:
            errs.append(duplicate(f"{item_path}.containerName", name))
        elif name not in sidecars:
            errs.append(not_found(f"{item_path}.containerName", name))
        if name is not None:
            seen.add(name)
        resources = obj_field(item, "resources", f"{item_path}.resources", errs)
        env = list_field(item, "env", f"{item_path}.env", errs)
        if not resources and not env:
            detail = "an entry must allow resources or env (or both) to be overridden"
            errs.append(invalid(item_path, dict(item), detail))
        if resources:
            _resources(resources, f"{item_path}.resources", errs)
        _env(env, f"{item_path}.env", errs)


def _resources(resources: Mapping[str, Any], path: str, errs: Errors) -> None:
    for resource in resources:
        where = f"{path}.{resource}"
        if resource not in OVERRIDABLE_RESOURCES:
            errs.append(unsupported(path, resource, OVERRIDABLE_RESOURCES))
            continue
        section = obj_field(resources, resource, where, errs)
        if section is None:
            continue
        if section.get("min") is None and section.get("max") is None:
            errs.append(FieldError(where, "Required value: min or max (or both)"))
            continue
        ends = {end: quantity_value(section[end], f"{where}.{end}", errs) for end in ("min", "max") if end in section}
        for end, q in ends.items():
            if q is not None and q.sign() < 0:
                errs.append(invalid(f"{where}.{end}", str(section[end]), "must be greater than or equal to 0"))
        low, high = ends.get("min"), ends.get("max")
        if low is not None and high is not None and low.cmp(high) > 0:
            detail = f"must be less than or equal to max ({section['max']})"
            errs.append(invalid(f"{where}.min", str(section["min"]), detail))


def _env(env: list[Any], path: str, errs: Errors) -> None:
    seen: set[str] = set()
    for i, name in enumerate(env):
        where = f"{path}[{i}]"
        problem = env_name_problem(name)
        if problem is not None:
            errs.append(FieldError(where, problem))
        elif name in seen:
            errs.append(duplicate(where, name))
        else:
            seen.add(name)
