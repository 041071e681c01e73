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
