"""Validation of the SidecarSet's own name and of the pod metadata it patches.

The name ends up in pod annotations, ControllerRevision names and labels, hence Kruise's
stricter-than-usual rule (alphanumerics and '-', at most 63 characters).

patchPodMetadata writes annotations into every injected pod. Kruise also gates the keys with a
whitelist ConfigMap; sidecarctl does not: whoever may write a cluster-scoped SidecarSet can
already inject arbitrary containers, so gating annotation keys adds no protection.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from sidecarsets.spec.enums import PatchPolicy, values
from sidecarsets.validation.base import (
    Errors,
    FieldError,
    list_field,
    obj_field,
    objects,
    qualified_name_problem,
    type_name,
)

NAME_MAX = 63
_NAME = re.compile(r"^[a-zA-Z0-9\-]+$")


def validate_name(obj: Mapping[str, Any], errs: Errors) -> None:
    metadata = obj_field(obj, "metadata", "metadata", errs)
    name = None if metadata is None else metadata.get("name")
    if name is None or name == "":
        errs.append(FieldError("metadata.name", "name is required"))
        return
    if not isinstance(name, str):
        errs.append(FieldError("metadata.name", f"must be a string, not {type_name(name)}"))
        return
    if not _NAME.match(name):
        errs.append(FieldError("metadata.name", "sidecarset name must consist of alphanumeric characters or '-'"))
    if len(name) > NAME_MAX:
        errs.append(FieldError("metadata.name", f"must be no more than {NAME_MAX} characters"))


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def validate_patch_pod_metadata(spec: Mapping[str, Any], errs: Errors) -> None:
    base = "spec.patchPodMetadata"
    owner: dict[str, str] = {}
    for _, path, patch in objects(list_field(spec, "patchPodMetadata", base, errs), base, errs):
        policy = patch.get("patchPolicy")
        if policy not in values(PatchPolicy):
            errs.append(
                FieldError(
                    f"{path}.patchPolicy", f"unsupported patchPolicy {policy!r}: use {', '.join(values(PatchPolicy))}"
                )
            )
        annotations = obj_field(patch, "annotations", f"{path}.annotations", errs)
        if not annotations:
            if patch.get("annotations") is None or annotations is not None:
                errs.append(FieldError(f"{path}.annotations", "no annotations defined for SidecarSet"))
            continue
        for key, value in annotations.items():
            kpath = f"{path}.annotations[{key}]"
            problem = qualified_name_problem(str(key).lower())
            if problem:
                errs.append(FieldError(kpath, problem))
            if not isinstance(value, str):
                errs.append(FieldError(kpath, f"annotation values must be strings, not {type_name(value)}"))
            elif policy == PatchPolicy.MERGE_PATCH_JSON and not _is_json_object(value):
                errs.append(FieldError(kpath, "must be a JSON object for patchPolicy MergePatchJson"))
            if key in owner:
                errs.append(FieldError(kpath, f"patch annotation {key} already exists in {owner[key]}"))
            else:
                owner[key] = path
