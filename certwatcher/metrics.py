"""Prometheus collectors for serving-certificate reloads and expiry.

Module-level so that every reloader in the process adds to the same series the manager's `/metrics`
exposes. Expiry gauges let an alert fire well before a certificate lapses, which is how
cert-manager's one-year CA outage would have been caught.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

CERT_RELOADS = Counter(
    "sidecarctl_cert_reloads_total",
    "Serving certificate pairs loaded and swapped in (the first load counts).",
)
CERT_RELOAD_ERRORS = Counter(
    "sidecarctl_cert_reload_errors_total",
    "Cert directory contents refused; the previous certificate kept serving.",
    ["reason"],
)
CERT_RELOAD_FAILING = Gauge(
    "sidecarctl_cert_reload_failing",
    "1 while the cert directory holds contents the manager refuses (the previous certificate keeps serving); "
    "0 once a pair is served from it again.",
    multiprocess_mode="livemax",
)
SERVING_CERT_EXPIRY = Gauge(
    "sidecarctl_serving_cert_expiry_timestamp_seconds",
    "notAfter of the serving certificate currently in use, as a Unix timestamp.",
    multiprocess_mode="livemax",
)
CA_CERT_EXPIRY = Gauge(
    "sidecarctl_ca_cert_expiry_timestamp_seconds",
    "notAfter of the CA the serving certificate chains to, as a Unix timestamp.",
    multiprocess_mode="livemax",
)
