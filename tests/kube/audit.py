"""The API server's audit log as tests read it: one record per request, and the pod patches in it
(who wrote to a pod how often is what "one patch per pod per rollout" is measured by)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.kube.controlplane import ControlPlane


def audit_lines(path: Path, start: int = 0) -> Iterator[bytes]:
    """The whole lines (one JSON event each) of the audit log at `path` after byte `start`, read one at
    a time (a reliability run's log reaches hundreds of megabytes).

    kube-apiserver appends while the tests read: a size taken as `start` can fall inside a line being
    written, and the log can end in one. A line cut at `start` was written before it and is skipped;
    one without its newline yet is left for a later read (a JSON parse of either failed a test)."""
    with path.open("rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # the rest of a line written before `start`
        for line in f:
            if line.endswith(b"\n") and line.strip():
                yield line.rstrip(b"\n")


def audit_events(cp: ControlPlane, start: int) -> list[dict[str, Any]]:
    """The audit log's events written after byte `start`, one per request (ResponseComplete)."""
    out = []
    for line in audit_lines(cp.audit_log, start):
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
