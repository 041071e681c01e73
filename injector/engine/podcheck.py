"""Whether a pod is well formed enough to inject into, with the field named when it is not.

Every env var of every container is checked on every admission, so the common case (all fine)
is answered without a Python-level loop; messages are only built for a list that fails.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from itertools import repeat
from typing import Any

from kuberuntime.jsontypes import is_object


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """Why a pod is too malformed to inject into (the message names the field), or None."""
    meta = pod.get("metadata")
    if meta is not None and not is_object(meta):
        return "metadata must be an object"
    for key in ("labels", "annotations"):
        section = (meta or {}).get(key)
        if section is None:
            continue
        if not is_object(section):
            return f"metadata.{key} must be an object"
        if all(map(isinstance, section.values(), repeat(str))):
            continue
        for k, v in section.items():
            if not isinstance(v, str):
                return f"metadata.{key}[{k}] must be a string"
    spec = pod.get("spec")
    if not is_object(spec):
        return "spec must be an object"
    if not isinstance(spec.get("containers"), list) or not spec["containers"]:
        return "spec.containers must be a non-empty list"
    for list_key in ("containers", "initContainers"):
        problem = _containers_problem(spec.get(list_key), f"spec.{list_key}")
        if problem:
            return problem
    for list_key in ("volumes", "imagePullSecrets"):
        problem = _named_list_problem(spec.get(list_key), f"spec.{list_key}")
        if problem:
            return problem
    return None


_NAME = operator.itemgetter("name")
_CONTAINER_LISTS = ("env", "volumeMounts", "volumeDevices")


def _names_ok(items: Any) -> bool:
    """True when `items` is absent or a list of entries with non-empty string names.

    The quick answer for the common case: every env var of every container is checked on every
    admission, so the entries are read without a Python-level loop. False means "look closer".
    """
    if items is None:
        return True
    if type(items) is not list:
        return False
    try:
        found = list(map(_NAME, items))
        "".join(found)  # raises TypeError unless every name is a string
    except Exception:  # an entry that is not an object, or has no name
        return False
    return "" not in found


def _named_list_problem(items: Any, field: str) -> str | None:
    if _names_ok(items):
        return None
    if not isinstance(items, list):
        return f"{field} must be a list"
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
            return f"{field}[{i}] must be an object with a non-empty string name"
    return None


def _containers_problem(items: Any, field: str) -> str | None:
    problem = _named_list_problem(items, field)
    if problem or items is None:
        return problem
    for i, container in enumerate(items):
        for key in _CONTAINER_LISTS:
            value = container.get(key)
            if not _names_ok(value):  # the message is only worth building for a list that fails
                problem = _named_list_problem(value, f"{field}[{i}].{key}")
                if problem:
                    return problem
    return None
