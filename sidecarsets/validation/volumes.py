"""Validation of what a SidecarSet adds to the pod besides containers: volumes and pull secrets.

These are merged into the pod by name at injection; a nameless or doubly-defined volume would
make the merged pod invalid, so names are checked here. The volume sources themselves are left
to the API server's pod validation (the CRD schema already checks their structure).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarsets.validation.base import (
    Errors,
    FieldError,
    dns1123_label_problem,
    is_int,
    list_field,
    objects,
)


def validate_volumes(spec: Mapping[str, Any], errs: Errors) -> None:
    seen: dict[str, str] = {}
    for _, path, volume in objects(list_field(spec, "volumes", "spec.volumes", errs), "spec.volumes", errs):
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            errs.append(FieldError(f"{path}.name", "volume name is required"))
            continue
        problem = dns1123_label_problem(name)
        if problem:
            errs.append(FieldError(f"{path}.name", problem))
        if name in seen:
            errs.append(FieldError(f"{path}.name", f"duplicate volume name {name!r}: already used by {seen[name]}"))
        else:
            seen[name] = path
        sources = [key for key, value in volume.items() if key != "name" and value is not None]
        if len(sources) > 1:
            errs.append(FieldError(path, f"may not specify more than 1 volume type, got {', '.join(sorted(sources))}"))


def validate_pull_secrets(spec: Mapping[str, Any], errs: Errors) -> None:
    path = "spec.imagePullSecrets"
    for _, item_path, item in objects(list_field(spec, "imagePullSecrets", path, errs), path, errs):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            errs.append(FieldError(f"{item_path}.name", "secret name is required"))


def validate_revision_history_limit(spec: Mapping[str, Any], errs: Errors) -> None:
    limit = spec.get("revisionHistoryLimit")
    if limit is not None and (not is_int(limit) or limit < 0):
        errs.append(FieldError("spec.revisionHistoryLimit", f"must be an integer >= 0, not {limit!r}"))
