"""Prometheus collectors of the SidecarSet side: reconciles, in-place upgrades, tracked pods.

Module-level collectors in the default registry, so `/metrics` exposes them wherever they are
incremented; names follow Prometheus conventions with the `sidecarctl_` prefix.

Per-SidecarSet series carry two labels, `sidecarset_namespace` and `sidecarset`: a NamespacedSidecarSet
`shop/mesh` is `{sidecarset_namespace="shop", sidecarset="mesh"}`, a SidecarSet `mesh` has an empty
`sidecarset_namespace`, so the two never share a series (and a query can select a tenant's own).
It is not called `namespace`: Prometheus's scrape gives every series the manager pod's namespace
under that name. One series per object, never per pod.

The per-SidecarSet gauges describe what the leader sees now, so their series are dropped
(`forget`) when a SidecarSet is deleted and when a replica stops leading: a former leader must
not go on exporting a stalled rollout or missing sidecars that the new leader has since cleared.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "sidecarctl_reconciles_total",
    "SidecarSet reconciles by SidecarSet and result (success, error, requeue).",
    ["sidecarset_namespace", "sidecarset", "result"],
)
RECONCILE_DURATION = Histogram(
    "sidecarctl_reconcile_duration_seconds",
    "Time one SidecarSet reconcile took (status, revisions, the rollout's plan and its pod patches).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
INPLACE_UPGRADES = Counter(
    "sidecarctl_inplace_upgrades_total",
    "Pod sidecar in-place upgrade patches by SidecarSet and result (patched, resized, conflict, gone, error).",
    ["sidecarset_namespace", "sidecarset", "result"],
)
SIDECARSET_PODS = Gauge(
    "sidecarctl_sidecarset_pods",
    "A SidecarSet's pods as its status counts them, by state: matched, updated (at the latest revision), "
    "ready, updated_ready.",
    ["sidecarset_namespace", "sidecarset", "state"],
    multiprocess_mode="livemax",
)
PODS_NOT_UPGRADABLE = Gauge(
    "sidecarctl_pods_not_upgradable",
    "Matched pods whose sidecars differ from their SidecarSet in more than the image.",
    ["sidecarset_namespace", "sidecarset"],
    multiprocess_mode="livemax",
)
PODS_MISSING_SIDECARS = Gauge(
    "sidecarctl_pods_missing_sidecars",
    "Running pods a SidecarSet selects, in namespaces labelled for injection, that run without its sidecars.",
    ["sidecarset_namespace", "sidecarset"],
    multiprocess_mode="livemax",
)
ROLLOUT_STALLED = Gauge(
    "sidecarctl_rollout_stalled",
    "1 while a SidecarSet's rollout is stopped by its progress deadline (updateStrategy.progressDeadlineSeconds).",
    ["sidecarset_namespace", "sidecarset"],
    multiprocess_mode="livemax",
)
POD_SECURITY_VIOLATIONS = Gauge(
    "sidecarctl_pod_security_violations",
    "Selected namespaces whose Pod Security level (enforce, warn or audit) a SidecarSet's sidecars violate.",
    ["sidecarset_namespace", "sidecarset"],
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
    SIDECARSET_PODS,
    PODS_NOT_UPGRADABLE,
    PODS_MISSING_SIDECARS,
    ROLLOUT_STALLED,
    POD_SECURITY_VIOLATIONS,
)


def _multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))  # what `sidecarctl run` sets for its children


def owner(name: str) -> tuple[str, str]:
    """A SidecarSet's (`mesh`) or NamespacedSidecarSet's (`shop/mesh`) key as its two label values."""
    namespace, _, short = name.rpartition("/")
    return namespace, short


def series(metric: Gauge | Counter) -> set[str]:
    """The SidecarSets (keys as `owner` reads them) this process has a series of `metric` for."""
    return {_key(labels) for labels in _label_sets(metric) if "sidecarset" in labels}


def _key(labels: Mapping[str, str]) -> str:
    namespace, name = labels.get("sidecarset_namespace", ""), labels["sidecarset"]
    return f"{namespace}/{name}" if namespace else name


def _label_sets(metric: Gauge | Counter) -> list[dict[str, str]]:
    return [sample.labels for family in metric.collect() for sample in family.samples]


# sidecarctl_sidecarset_pods's state -> the status field it reports
_POD_STATES = {
    "matched": "matchedPods",
    "updated": "updatedPods",
    "ready": "readyPods",
    "updated_ready": "updatedReadyPods",
}


def set_pod_counts(name: str, status: Mapping[str, Any]) -> None:
    """SidecarSet `name`'s pods by state (`sidecarctl_sidecarset_pods`), from the status just computed."""
    for state, field in _POD_STATES.items():
        SIDECARSET_PODS.labels(*owner(name), state).set(status[field])


def _children(metric: Gauge | Counter, name: str | None) -> set[tuple[str, ...]]:
    """The label values of `metric`'s series for SidecarSet `name` (every SidecarSet's when None),
    in the order the metric declares them (a counter's `_total` and `_created` samples count once).

    One SidecarSet's are picked from the metric's children by their first two label values, not
    from its collected samples: building every sample took 55 ms a deletion at 2,000 SidecarSets,
    and deleting them all held the control process for minutes."""
    if name is None:
        return {tuple(labels.values()) for labels in _label_sets(metric)}
    key = owner(name)
    return {tuple(values) for values in list(metric._metrics) if tuple(values[:2]) == key}


def forget(name: str | None = None) -> None:
    """Drop SidecarSet `name`'s series from the per-SidecarSet gauges, every SidecarSet's (and the
    tracked-pods count) when `name` is None.

    prometheus-client cannot remove a series in multiprocess mode (`sidecarctl run`): the value
    stays in the process's file and the supervisor's /metrics goes on reading it. There the
    series is set to 0 instead, which is what a deleted SidecarSet or a non-leader has (the
    gauges aggregate with livemax, so the leader's value is the one shown), and a deleted
    SidecarSet's counters (reconciles, in-place upgrades) stay, frozen, until the process restarts.
    In one process they are removed with its gauges.
    """
    zero = _multiprocess()
    for gauge in PER_SIDECARSET:
        for values in _children(gauge, name):
            if zero:
                gauge.labels(*values).set(0)
            else:
                gauge.remove(*values)
    if not zero and name is not None:
        for counter in (RECONCILES, INPLACE_UPGRADES):  # a deleted SidecarSet's counters go too
            for values in _children(counter, name):
                counter.remove(*values)
    if name is None:
        TRACKED_PODS.set(0)
