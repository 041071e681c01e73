"""The pod condition `SidecarSetUpgradable`: whether each SidecarSet can roll its images into the pod.

Kruise's condition, with its reasons and its message, a JSON map of SidecarSet name to upgradable.
Several SidecarSets share the one condition on a pod, so each controller pass merges its own verdict
into the message and writes only when the result differs from what the pod carries (compared as
JSON, not as text).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods.projection import PodProjection
from sidecarsets.spec.names import POD_CONDITION_UPGRADABLE

REASON_UPGRADABLE = "AllSidecarsetUpgradable"
REASON_NOT_UPGRADABLE = "UpdateImmutableField"


def _message_kv(message: str) -> dict[str, bool] | None:
    """The `{ss: upgradable}` map in a condition message; None when it is not one."""
    try:
        parsed = orjson.loads(message)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    return {k: v for k, v in parsed.items() if isinstance(k, str) and isinstance(v, bool)}


def upgradable_condition(
    pod: PodProjection, not_upgradable_for: Mapping[str, bool], *, now: str | None = None
) -> JsonObj:
    """The pod's `SidecarSetUpgradable` condition after merging in these SidecarSets' verdicts.

    `not_upgradable_for[ss]` is True when that SidecarSet cannot roll its images into the pod.
    Verdicts of other SidecarSets already in the condition's message are kept, so each
    SidecarSet's controller pass only states its own. `now` sets lastTransitionTime when the
    status flips.
    """
    old = pod.upgradable_condition
    kv = (_message_kv(old[2]) if len(old) == 3 else None) or {}
    for ss, not_upgradable in not_upgradable_for.items():
        kv[ss] = not not_upgradable
    ok = all(kv.values())
    status = "True" if ok else "False"
    condition: JsonObj = {
        "type": POD_CONDITION_UPGRADABLE,
        "status": status,
        "reason": REASON_UPGRADABLE if ok else REASON_NOT_UPGRADABLE,
        "message": orjson.dumps({k: kv[k] for k in sorted(kv)}).decode(),
    }
    if now is not None and (len(old) != 3 or old[0] != status):
        condition["lastTransitionTime"] = now
    return condition


def condition_current(pod: PodProjection, condition: Mapping[str, Any]) -> bool:
    """The pod already carries this condition (message compared as JSON), so nothing to write."""
    old = pod.upgradable_condition
    if len(old) != 3:
        return False
    status, reason, message = old
    old_kv = _message_kv(message)
    return (
        old_kv is not None
        and status == condition.get("status")
        and reason == condition.get("reason")
        and old_kv == _message_kv(str(condition.get("message", "")))
    )
