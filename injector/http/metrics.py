"""Prometheus collectors of the admission side.

Result labels follow Istio's injector (injected / skipped / denied / error) so dashboards
written for it translate directly.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from sidecarsets.overrides.annotation import REASONS as OVERRIDE_REASONS

ADMISSIONS = Counter(
    "sidecarctl_admissions_total",
    "Admission requests answered, by webhook and result (injected, skipped, allowed, denied, error, bad_request).",
    ["webhook", "result"],
)
POD_DENIALS = Counter(
    "sidecarctl_pod_denials_total",
    "Pods the inject webhook refused, by reason (namespace_unknown: its labels could not be read, retry; "
    "pinned_revision: a pinned revision that does not exist or cannot be used; cannot_inject: the pod cannot take "
    "a selected SidecarSet's sidecars; overrides: its sidecarctl.io/overrides annotation is refused).",
    ["reason"],
)
for _reason in ("namespace_unknown", "pinned_revision", "cannot_inject", "overrides"):
    POD_DENIALS.labels(_reason)  # from 0, so that the first refusal is an increase a rate sees
OVERRIDE_REFUSALS = Counter(
    "sidecarctl_override_refusals_total",
    "Pods refused for their sidecarctl.io/overrides annotation, by reason (invalid: not JSON of the shape; "
    "not_allowed: a container, resource or env var the SidecarSet does not list; out_of_range: a value outside "
    "its bounds; request_above_limit: a request above its limit after merging).",
    ["reason"],
)
for _reason in OVERRIDE_REASONS:
    OVERRIDE_REFUSALS.labels(_reason)
ADMISSION_LATENCY = Histogram(
    "sidecarctl_admission_duration_seconds",
    "Time to answer one admission request, from body received to response built.",
    ["webhook"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
CONNECTIONS_CLOSED = Counter(
    "sidecarctl_webhook_connections_closed_total",
    "Webhook connections closed by a bound, by reason (max_connections, max_tls_connections, handshake_timeout, "
    "handshake_failed, header_timeout, peer_gone, error; rebalanced: ended after a response so that its client "
    "reconnects to a worker holding fewer).",
    ["reason"],
)
OPEN_CONNECTIONS = Gauge(
    "sidecarctl_webhook_open_connections",
    "Open webhook connections (accepted sockets, TLS or not).",
    multiprocess_mode="livesum",
)
REQUESTS_REFUSED = Counter(
    "sidecarctl_webhook_requests_refused_total",
    "Admission requests refused by a bound before any work, by reason (body_timeout, too_large, too_many_values, "
    "busy).",
    ["reason"],
)
NAMESPACE_LOOKUPS = Counter(
    "sidecarctl_namespace_lookups_total",
    "Namespaces read from the API server because the watch had not delivered them (or their labels) yet, by result "
    "(found, not_found, error).",
    ["result"],
)
SNAPSHOT_WAITS = Counter(
    "sidecarctl_webhook_snapshot_waits_total",
    "Pods that waited for a reconnecting SidecarSet watch before they were decided, by outcome (caught_up: it "
    "was current again within --namespace-lookup-timeout; behind: decided from the snapshot as it was, warned).",
    ["outcome"],
)
for _outcome in ("caught_up", "behind"):
    SNAPSHOT_WAITS.labels(_outcome)
