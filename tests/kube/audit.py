"""The API server's audit log as tests read it: one record per request, and the pod patches in it
(who wrote to a pod how often is what "one patch per pod per rollout" is measured by)."""

from __future__ import annotations

import json
from typing import Any

from tests.kube.controlplane import ControlPlane


def audit_events(cp: ControlPlane, start: int) -> list[dict[str, Any]]:
    """The audit log's events written after byte `start`, one per request (ResponseComplete)."""
    with cp.audit_log.open("rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    out = []
    for line in lines:
        if line.strip():
            event = json.loads(line)
            if event.get("stage") == "ResponseComplete":
                out.append(event)
    return out


def pod_patches(cp: ControlPlane, start: int, namespace: str) -> dict[str, int]:
    """Successful patches of pods in `namespace` (not their status) after byte `start`, per pod."""
    counts: dict[str, int] = {}
    for e in audit_events(cp, start):
        ref = e.get("objectRef") or {}
        if (
            e["verb"] == "patch"
            and ref.get("resource") == "pods"
            and not ref.get("subresource")
            and ref.get("namespace") == namespace
            and (e.get("responseStatus") or {}).get("code", 0) < 300
        ):
            counts[ref["name"]] = counts.get(ref["name"], 0) + 1
    return counts
