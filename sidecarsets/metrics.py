"""Prometheus collectors of the SidecarSet side: reconciles, in-place upgrades, tracked pods.

Module-level collectors in the default registry, so `/metrics` exposes them wherever they are
incremented; names follow Prometheus conventions with the `sidecarctl_` prefix.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RECONCILES = Counter(
    "sidecarctl_reconciles_total",
    "SidecarSet reconciles by result (success, error, requeue).",
    ["result"],
)
INPLACE_UPGRADES = Counter(
    "sidecarctl_inplace_upgrades_total",
    "Pod sidecar in-place upgrade patches by result (patched, conflict, gone, error).",
    ["result"],
)
PODS_NOT_UPGRADABLE = Gauge(
    "sidecarctl_pods_not_upgradable",
    "Matched pods whose sidecars differ from their SidecarSet in more than the image.",
    ["sidecarset"],
    multiprocess_mode="livemax",
)
PODS_MISSING_SIDECARS = Gauge(
    "sidecarctl_pods_missing_sidecars",
    "Running pods a SidecarSet selects, in namespaces labelled for injection, that run without its sidecars.",
    ["sidecarset"],
    multiprocess_mode="livemax",
)
ROLLOUT_STALLED = Gauge(
    "sidecarctl_rollout_stalled",
    "1 while a SidecarSet's rollout is stopped by its progress deadline (updateStrategy.progressDeadlineSeconds).",
    ["sidecarset"],
    multiprocess_mode="livemax",
)
MISSED_RECREATED = Counter(
    "sidecarctl_missed_pods_recreated_total",
    "Pods missing their sidecars evicted for their controller to recreate injected, by result "
    "(evicted, blocked, gone, error).",
    ["result"],
)
TRACKED_PODS = Gauge(
    "sidecarctl_tracked_pods", "Injected pods held as projections by the controller.", multiprocess_mode="livemax"
)
