"""Prometheus collectors of the SidecarSet side: reconciles, in-place upgrades, tracked pods.

Module-level collectors in the default registry, so `/metrics` exposes them wherever they are
incremented; names follow Prometheus conventions with the `sidecarctl_` prefix.

The per-SidecarSet gauges describe what the leader sees now, so their series are dropped
(`forget`) when a SidecarSet is deleted and when a replica stops leading: a former leader must
not go on exporting a stalled rollout or missing sidecars that the new leader has since cleared.
"""

from __future__ import annotations

import os

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
POD_SECURITY_VIOLATIONS = Gauge(
    "sidecarctl_pod_security_violations",
    "Selected namespaces whose Pod Security level (enforce, warn or audit) a SidecarSet's sidecars violate.",
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

PER_SIDECARSET: tuple[Gauge, ...] = (
    PODS_NOT_UPGRADABLE,
    PODS_MISSING_SIDECARS,
    ROLLOUT_STALLED,
    POD_SECURITY_VIOLATIONS,
)


def _multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))  # what `sidecarctl run` sets for its children


def series(gauge: Gauge) -> set[str]:
    """The SidecarSets this process has a series of `gauge` for."""
    return {
        name
        for family in gauge.collect()
        for sample in family.samples
        if (name := sample.labels.get("sidecarset")) is not None
    }


def forget(name: str | None = None) -> None:
    """Drop SidecarSet `name`'s series from the per-SidecarSet gauges, every SidecarSet's (and the
    tracked-pods count) when `name` is None.

    prometheus-client cannot remove a series in multiprocess mode (`sidecarctl run`): the value
    stays in the process's file and the supervisor's /metrics goes on reading it. There the
    series is set to 0 instead, which is what a deleted SidecarSet or a non-leader has (the
    gauges aggregate with livemax, so the leader's value is the one shown).
    """
    zero = _multiprocess()
    for gauge in PER_SIDECARSET:
        for ss in series(gauge) if name is None else series(gauge) & {name}:
            if zero:
                gauge.labels(ss).set(0)
            else:
                gauge.remove(ss)
    if name is None:
        TRACKED_PODS.set(0)
