"""Prometheus collectors of the generic runtime: watch restarts and leadership.

Module-level collectors in the default registry, so `/metrics` exposes them wherever they are
incremented; names follow Prometheus conventions with the `sidecarctl_` prefix.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

WATCH_RESTARTS = Counter(
    "sidecarctl_watch_restarts_total",
    "Watch streams restarted, by informer and cause (gone: relisted after 410; stalled: silent past its timeout; "
    "error: network or API error).",
    ["informer", "cause"],
)
IS_LEADER = Gauge(
    "sidecarctl_leader",
    "1 while this replica holds the Lease (namespace/name).",
    ["lease"],
    multiprocess_mode="livemax",
)
LEADER_ACQUISITIONS = Counter(
    "sidecarctl_leader_acquisitions_total",
    "Times this replica took the Lease (namespace/name); summed over replicas, how often leadership changed hands.",
    ["lease"],
)
LEADER_CATCH_UP = Gauge(
    "sidecarctl_leader_catch_up_seconds",
    "Seconds this replica's last leadership term waited, from winning the Lease, for its caches to reach a "
    "quorum read before it planned.",
    multiprocess_mode="livemax",
)
CACHED_OBJECTS = Gauge(
    "sidecarctl_cached_objects",
    "Objects an informer's cache holds now, by informer: every replica's control process keeps the controller's "
    "(a standby too, so that it can take over without reading them again).",
    ["informer"],
    multiprocess_mode="livemax",
)
WORKQUEUE_DEPTH = Gauge(
    "sidecarctl_workqueue_depth",
    "Keys waiting in a work queue to be handed to a worker (not those being processed or delayed).",
    ["name"],
    multiprocess_mode="livesum",
)
WORKQUEUE_ADDS = Counter(
    "sidecarctl_workqueue_adds_total",
    "Keys queued (a key already waiting is not queued twice), by work queue.",
    ["name"],
)
WORKQUEUE_RETRIES = Counter(
    "sidecarctl_workqueue_retries_total",
    "Keys queued again with backoff after their handler failed, by work queue.",
    ["name"],
)
API_SERVED = Gauge(
    "sidecarctl_api_served",
    "1 while the API server serves this optional resource (group version, resource), 0 while it does not, as "
    "discovery last listed it.",
    ["group_version", "resource"],
    multiprocess_mode="livemax",
)
APISERVER_INFO = Gauge(
    "sidecarctl_apiserver_info",
    "1, labelled with the version (gitVersion) the API server reported when discovery last read it.",
    ["git_version"],
    multiprocess_mode="livemax",
)
