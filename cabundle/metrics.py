"""Prometheus collectors for caBundle writes.

Module-level so that every syncer in the process adds to the same series the manager's `/metrics`
exposes; conflicts counted apart show two writers that disagree.
"""

from __future__ import annotations

from prometheus_client import Counter

CABUNDLE_WRITES = Counter(
    "sidecarctl_cabundle_writes_total",
    "Successful caBundle patches to a webhook configuration.",
    ["configuration"],
)
CABUNDLE_CONFLICTS = Counter(
    "sidecarctl_cabundle_conflicts_total",
    "caBundle patches refused because the configuration changed underneath (resourceVersion test).",
    ["configuration"],
)
