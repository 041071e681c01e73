"""Prometheus collectors of the admission side.

Result labels follow Istio's injector (injected / skipped / denied / error) so dashboards
written for it translate directly.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

ADMISSIONS = Counter(
    "sidecarctl_admissions_total",
    "Admission requests answered, by webhook and result (injected, skipped, allowed, denied, error, bad_request).",
    ["webhook", "result"],
)
ADMISSION_LATENCY = Histogram(
    "sidecarctl_admission_duration_seconds",
    "Time to answer one admission request, from body received to response built.",
    ["webhook"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
