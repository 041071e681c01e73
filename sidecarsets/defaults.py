"""Kruise's SidecarSet defaults, applied to a plain JSON SidecarSet.

The CRD schema defaults most fields on the API server, but not everything reaches the API
server (the CLI reads manifests from files) and one default cannot be expressed in the schema:
`podInjectPolicy` is BeforeAppContainer for `containers` and AfterAppContainer for
`initContainers`, while both lists share one SidecarContainer type whose schema can carry only
one default. So the schema leaves it undefaulted and this module fills it in, together with
every default the schema applies, so that an object gives the same result whether or not the
API server has seen it. Validation runs on the defaulted object, so an omitted field and its
default are judged alike.

As in Kruise (whose Go structs cannot tell an empty string from an absent one), an empty
string counts as unset for the enumerated string fields. Values of the wrong type are left
alone for validation to report; nothing here raises.
"""

from __future__ import annotations

import copy
from typing import Any

from kuberuntime.jsontypes import JsonObj

BEFORE_APP_CONTAINER = "BeforeAppContainer"
AFTER_APP_CONTAINER = "AfterAppContainer"
COLD_UPGRADE = "ColdUpgrade"
SHARE_DISABLED = "disabled"
ROLLING_UPDATE = "RollingUpdate"
DEFAULT_PARTITION = 0
DEFAULT_MAX_UNAVAILABLE = 1
DEFAULT_REVISION_HISTORY_LIMIT = 10
PATCH_RETAIN = "Retain"
REVISION_ALWAYS = "Always"
DEFAULT_TARGET_CONTAINERS_REGEX = ".*"


def _set_default(obj: dict[str, Any], key: str, value: Any, *, empty_is_unset: bool = True) -> None:
    current = obj.get(key)
    if current is None or (empty_is_unset and current == ""):
        obj[key] = copy.deepcopy(value)


def _object_field(obj: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The object at `key`, created empty when absent or null; None when it has another type."""
    if obj.get(key) is None:
        obj[key] = {}
    value = obj[key]
    return value if isinstance(value, dict) else None


def _container(container: dict[str, Any], inject_policy: str) -> None:
    _set_default(container, "podInjectPolicy", inject_policy)
    upgrade = _object_field(container, "upgradeStrategy")
    if upgrade is not None:
        _set_default(upgrade, "upgradeType", COLD_UPGRADE)
    share = _object_field(container, "shareVolumePolicy")
    if share is not None:
        _set_default(share, "type", SHARE_DISABLED)
    device_share = container.get("shareVolumeDevicePolicy")
    if isinstance(device_share, dict):
        _set_default(device_share, "type", SHARE_DISABLED)
    resources_policy = container.get("resourcesPolicy")
    if isinstance(resources_policy, dict):
        # An explicit empty regex stays: Kruise rejects it rather than defaulting it.
        _set_default(
            resources_policy, "targetContainersNameRegex", DEFAULT_TARGET_CONTAINERS_REGEX, empty_is_unset=False
        )


def _spec(spec: dict[str, Any]) -> None:
    for key, policy in (("containers", BEFORE_APP_CONTAINER), ("initContainers", AFTER_APP_CONTAINER)):
        items = spec.get(key)
        if isinstance(items, list):
            for container in items:
                if isinstance(container, dict):
                    _container(container, policy)

    strategy = _object_field(spec, "updateStrategy")
    if strategy is not None:
        _set_default(strategy, "type", ROLLING_UPDATE)
        _set_default(strategy, "partition", DEFAULT_PARTITION, empty_is_unset=False)
        _set_default(strategy, "maxUnavailable", DEFAULT_MAX_UNAVAILABLE, empty_is_unset=False)

    injection = spec.get("injectionStrategy")
    if isinstance(injection, dict):
        revision = injection.get("revision")
        if isinstance(revision, dict):
            _set_default(revision, "policy", REVISION_ALWAYS)

    _set_default(spec, "revisionHistoryLimit", DEFAULT_REVISION_HISTORY_LIMIT, empty_is_unset=False)

    patches = spec.get("patchPodMetadata")
    if isinstance(patches, list):
        for patch in patches:
            if isinstance(patch, dict):
                _set_default(patch, "patchPolicy", PATCH_RETAIN)


def apply_defaults(obj: JsonObj) -> JsonObj:
    """A defaulted deep copy of the SidecarSet `obj`; `obj` itself is never modified."""
    out = copy.deepcopy(obj)
    if isinstance(out, dict):
        spec = out.get("spec")
        if isinstance(spec, dict):
            _spec(spec)
    return out


__all__ = ["apply_defaults"]
