"""/metrics of the running manager move by what it did: injections, reconciles, in-place upgrades.

Read from the session manager's probe port before and after real pod creations through the API
server and an in-place upgrade, so each counter is checked against a known number of events.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, create_ready_pods, image_of, pods, ready, set_image, wait_injecting, wait_status
from tests.kube.client import Kube, eventually
from tests.kube.managerharness import ManagerProcess, RunningManager


@dataclass(frozen=True)
class Scrape:
    """One read of /metrics: sample values by (name, labels), and the declared type of each family."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    types: dict[str, str]

    def value(self, name: str, /, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, /, **labels: str) -> float:
        """Sum over every series of `name` whose labels include `labels`."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def has(self, name: str, /, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.samples


def scrape(m: RunningManager | ManagerProcess) -> Scrape:
    with urllib.request.urlopen(m.probe_url + "/metrics", timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return Scrape(samples, types)


def delta(before: Scrape, after: Scrape, name: str, /, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def _all_on(kube: Kube, ns: str, app: str, image: str) -> bool:
    got = pods(kube, ns, app)
    return bool(got) and all(image_of(p, "proxy") == image and ready(p) for p in got)


def test_injection_and_upgrade_move_their_counters_by_the_expected_amount(
    kube: Kube, injected_ns: str, manager: RunningManager, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    # Served by the webhook (these are its counters): under --injection=auto a policy would take the
    # pods over as soon as it is in force, part way through the creations.
    ss = sidecarsets(
        "metrics",
        initContainers=[],
        updateStrategy={"type": "RollingUpdate", "maxUnavailable": "100%"},
        metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}},
    )
    name = ss["metadata"]["name"]
    wait_injecting(kube, injected_ns, "metrics", lambda p: p["spec"]["containers"][0]["name"] == "proxy")

    before = scrape(manager)
    create_ready_pods(kube, injected_ns, "metrics", 2)
    injected = scrape(manager)
    assert delta(before, injected, "sidecarctl_admissions_total", webhook="inject", result="injected") == 2
    # reinvocationPolicy IfNeeded: the API server may call again after the pod changed; that call
    # finds the sidecars already there and is counted as skipped. Every call is timed.
    calls = injected.total("sidecarctl_admissions_total", webhook="inject") - before.total(
        "sidecarctl_admissions_total", webhook="inject"
    )
    assert 2 <= calls <= 4
    assert delta(before, injected, "sidecarctl_admissions_total", webhook="inject", result="skipped") == calls - 2
    assert delta(before, injected, "sidecarctl_admission_duration_seconds_count", webhook="inject") == calls
    assert delta(before, injected, "sidecarctl_admission_duration_seconds_sum", webhook="inject") > 0
    assert injected.value("sidecarctl_admission_duration_seconds_bucket", webhook="inject", le="+Inf") == (
        injected.value("sidecarctl_admission_duration_seconds_count", webhook="inject")
    )
    assert injected.types["sidecarctl_admission_duration_seconds"] == "histogram"

    wait_status(kube, name, matchedPods=2, updatedPods=2, readyPods=2)
    set_image(kube, name, "proxy:2")
    eventually(lambda: _all_on(kube, injected_ns, "metrics", "proxy:2"), timeout=30, what="both pods on proxy:2")
    wait_status(kube, name, updatedPods=2, readyPods=2, updatedReadyPods=2)
    upgraded = scrape(manager)
    assert (
        delta(
            injected,
            upgraded,
            "sidecarctl_inplace_upgrades_total",
            sidecarset_namespace="",
            sidecarset=name,
            result="patched",
        )
        == 2
    )
    assert upgraded.total("sidecarctl_reconciles_total", sidecarset_namespace="", sidecarset=name) > injected.total(
        "sidecarctl_reconciles_total", sidecarset_namespace="", sidecarset=name
    )
    assert delta(injected, upgraded, "sidecarctl_reconcile_duration_seconds_count") >= 1
    assert delta(injected, upgraded, "sidecarctl_workqueue_adds_total", name="sidecarset") >= 1
    assert upgraded.has("sidecarctl_workqueue_depth", name="sidecarset")
    for state in ("matched", "updated", "ready", "updated_ready"):
        assert (
            upgraded.value("sidecarctl_sidecarset_pods", sidecarset_namespace="", sidecarset=name, state=state) == 2
        ), state
    assert upgraded.types["sidecarctl_reconciles"] == "counter"
    assert upgraded.has("sidecarctl_pods_not_upgradable", sidecarset_namespace="", sidecarset=name)
    assert upgraded.value("sidecarctl_pods_not_upgradable", sidecarset_namespace="", sidecarset=name) == 0
    assert upgraded.total("sidecarctl_admissions_total", webhook="inject") == injected.total(
        "sidecarctl_admissions_total", webhook="inject"
    ), "an in-place upgrade patches pods: no pod is created, so no injection call"

    # A change that is not image-only: both pods are reported as not upgradable.
    kube.patch(
        f"{SS_PATH}/{name}",
        [
            {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "MODE", "value": "strict"}]},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:3"},
        ],
        patch_type="json",
    )
    eventually(
        lambda: scrape(manager).value("sidecarctl_pods_not_upgradable", sidecarset_namespace="", sidecarset=name) == 2,
        timeout=20,
        what="sidecarctl_pods_not_upgradable == 2",
    )
    after = scrape(manager)
    assert (
        delta(
            upgraded,
            after,
            "sidecarctl_inplace_upgrades_total",
            sidecarset_namespace="",
            sidecarset=name,
            result="patched",
        )
        == 0
    )
    assert after.value("sidecarctl_sidecarset_pods", sidecarset_namespace="", sidecarset=name, state="matched") == 2
    assert after.value("sidecarctl_sidecarset_pods", sidecarset_namespace="", sidecarset=name, state="updated") == 0


def _expiry(s: Scrape, name: str) -> float:
    value = s.value(name)
    assert value > time.time(), f"{name} = {value} is not in the future"
    return value


def test_watch_leader_and_certificate_metrics_are_exposed(manager: RunningManager) -> None:
    s = scrape(manager)
    assert s.types["sidecarctl_watch_restarts"] == "counter"
    assert s.value("sidecarctl_leader", lease=f"{manager.opts.namespace}/{manager.opts.leader.lease_name}") == 1
    assert s.total("sidecarctl_cert_reloads_total") >= 1
    serving = _expiry(s, "sidecarctl_serving_cert_expiry_timestamp_seconds")
    ca = _expiry(s, "sidecarctl_ca_cert_expiry_timestamp_seconds")
    assert ca >= serving, "the serving certificate cannot outlive its CA"
    for config in (names.MUTATING_WEBHOOK_CONFIG, names.VALIDATING_WEBHOOK_CONFIG):
        assert s.value("sidecarctl_cabundle_writes_total", configuration=config) >= 1, config
    for family in ("sidecarctl_cert_reload_errors", "sidecarctl_cabundle_conflicts", "sidecarctl_tracked_pods"):
        assert family in s.types, family


def test_labels_are_label_sets_not_free_text(manager: RunningManager) -> None:
    """Every sidecarctl_ series uses a bounded label set, so cardinality stays fixed per object kind."""
    allowed: Mapping[str, set[str]] = {
        "sidecarctl_admissions_total": {"webhook", "result"},
        "sidecarctl_admission_duration_seconds": {"webhook", "le"},
        "sidecarctl_watch_restarts_total": {"informer", "cause"},
        "sidecarctl_reconciles_total": {"sidecarset", "result"},
        "sidecarctl_reconcile_duration_seconds": {"le"},
        "sidecarctl_inplace_upgrades_total": {"sidecarset", "result"},
        "sidecarctl_sidecarset_pods": {"sidecarset", "state"},
        "sidecarctl_workqueue_": {"name"},
        "sidecarctl_leader_acquisitions_total": {"lease"},
        "sidecarctl_cached_objects": {"informer"},
        "sidecarctl_leader_catch_up_seconds": set(),  # before "sidecarctl_leader": the first prefix that matches wins
        "sidecarctl_policy_repairs_total": {"kind"},
        "sidecarctl_policy_barriers_total": {"outcome"},
        "sidecarctl_pod_denials_total": {"reason"},
        "sidecarctl_override_refusals_total": {"reason"},
        "sidecarctl_pods_not_upgradable": {"sidecarset"},
        "sidecarctl_pods_missing_sidecars": {"sidecarset"},
        "sidecarctl_rollout_stalled": {"sidecarset"},
        "sidecarctl_missed_pods_recreated_total": {"result"},
        "sidecarctl_cabundle_writes_total": {"configuration"},
        "sidecarctl_cabundle_conflicts_total": {"configuration"},
        "sidecarctl_cert_reload_errors_total": {"reason"},
        "sidecarctl_leader": {"lease"},
        "sidecarctl_webhook_connections_closed_total": {"reason"},
        "sidecarctl_webhook_requests_refused_total": {"reason"},
        "sidecarctl_namespace_lookups_total": {"result"},
        "sidecarctl_webhook_snapshot_waits_total": {"outcome"},
        # bounded: the optional resources the manager asks discovery about, and the server's version
        "sidecarctl_api_served": {"group_version", "resource"},
        "sidecarctl_apiserver_info": {"git_version"},
    }
    s = scrape(manager)
    seen = 0
    for sample_name, labels in s.samples:
        if not sample_name.startswith("sidecarctl_") or sample_name.endswith("_created"):
            continue
        base = next((b for b in allowed if sample_name.startswith(b)), None)
        keys = {k for k, _ in labels}
        assert keys <= (allowed[base] if base else set()), f"{sample_name} has labels {sorted(keys)}"
        seen += 1
    assert seen > 10
