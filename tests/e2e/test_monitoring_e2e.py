"""The monitoring Component as kubectl renders it, and the dashboard's metrics on a running manager.

- `kubectl kustomize` of an install written the way users write it (`resources: [config/default]`,
  `components: [config/monitoring]`) gives config/default's objects unchanged plus exactly the
  ServiceMonitor of config/monitoring and the dashboard ConfigMap, under its fixed name, holding the
  JSON file byte for byte. Only rendered: this API server has no monitoring.coreos.com CRDs, so a
  server-side dry run of the ServiceMonitor cannot be accepted;
- after a SidecarSet and an injected pod exist, the session manager's /metrics has every family the
  dashboard queries, with the type the dashboard assumes.

Which families can be asserted as series and which only as declared: the session manager serves
prometheus_client's default registry, which writes `# HELP`/`# TYPE` for every registered family,
labelled ones with no series yet included. A labelled family gets a series only from its event
(a refused request, a closed connection, a watch restart, a caBundle conflict, a missed pod
evicted...), and most of those need a fault this test does not cause. So every queried family is
asserted present by its TYPE line, and series are asserted for the families that always have one
(unlabelled gauges, the Lease, the certificate expiries) and for those the SidecarSet and the pod
produce here (admissions and their latency through the webhook, reconciles, the per-SidecarSet
gauges). That every name the dashboard uses is registered at all is tests/unit/install/test_monitoring.py.
In a real install the supervisor serves prometheus_client's multiprocess files, where a labelled
family is absent until its first series: those panels show "No data" until the event happens.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from sidecarsets.spec import names
from tests.e2e.helpers import create_ready_pods, kubectl, wait_injecting, wait_status
from tests.e2e.test_metrics_e2e import Scrape, scrape
from tests.kube.client import Kube
from tests.kube.controlplane import REPO, ControlPlane
from tests.kube.managerharness import RunningManager
from tests.unit.install.test_alerts import prometheus_rule
from tests.unit.install.test_manifests import MANAGER_NS, key
from tests.unit.install.test_monitoring import (
    SUPERVISOR_FAMILIES,
    expected_dashboard_configmap,
    queried_families,
    service_monitor,
)

CONFIG = REPO / "config"

Obj = dict[str, Any]


def kustomize(cp: ControlPlane, directory: Path) -> dict[tuple[str, str, str], Obj]:
    proc = kubectl(cp, "kustomize", str(directory))
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed ({proc.returncode}):\n{proc.stderr}"
    return {key(d): d for d in yaml.load_all(proc.stdout, yaml.CSafeLoader) if d}


# ---------------------------------------------------------------------------------------------
# Rendering


def test_an_install_with_the_component_adds_the_servicemonitor_and_the_dashboard(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    user = tmp_path / "install"
    user.mkdir()
    (user / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # Relative paths, as an overlay kept next to a checkout of this repository has them.
                "resources": [os.path.relpath(CONFIG / "default", user)],
                "components": [os.path.relpath(CONFIG / "monitoring", user)],
            }
        )
    )
    base = kustomize(control_plane, CONFIG / "default")
    with_monitoring = kustomize(control_plane, user)
    sm, cm = service_monitor(), expected_dashboard_configmap()
    assert set(with_monitoring) - set(base) == {key(sm), key(cm)}
    assert {k: with_monitoring[k] for k in base} == base, "the Component changes no object of the install"
    assert with_monitoring[key(sm)] == sm
    assert with_monitoring[key(cm)] == cm, "the ConfigMap is named without a hash and holds the file as it is"

    service = with_monitoring[("Service", MANAGER_NS, "sidecarctl-metrics")]
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in [p["name"] for p in service["spec"]["ports"]]


def test_the_alerts_component_adds_the_prometheusrule(control_plane: ControlPlane, tmp_path: Path) -> None:
    user = tmp_path / "install"
    user.mkdir()
    components = [os.path.relpath(CONFIG / c, user) for c in ("monitoring", "alerts")]
    (user / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(CONFIG / "default", user)],
                "components": components,
            }
        )
    )
    base = kustomize(control_plane, CONFIG / "default")
    rendered = kustomize(control_plane, user)
    rule = prometheus_rule()
    added = {key(service_monitor()), key(expected_dashboard_configmap()), key(rule)}
    assert set(rendered) - set(base) == added
    assert rendered[key(rule)] == rule, "the PrometheusRule is the file as it is"


# ---------------------------------------------------------------------------------------------
# The running manager's /metrics


def _series(s: Scrape, name: str, **labels: str) -> bool:
    """Some series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return any(n == name and want <= ls for n, ls in s.samples)


def test_the_manager_exposes_every_family_the_dashboard_queries(
    kube: Kube, injected_ns: str, manager: RunningManager, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    # Through the webhook, so that the admission counters move (under --injection=auto a policy
    # could take the pod over).
    ss = sidecarsets("monitoring", initContainers=[], metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}})
    name = ss["metadata"]["name"]
    wait_injecting(kube, injected_ns, "monitoring", lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    create_ready_pods(kube, injected_ns, "monitoring", 1)
    wait_status(kube, name, matchedPods=1, updatedPods=1, readyPods=1)
    s = scrape(manager)

    # Less the families the supervisor of `sidecarctl run` serves from its own state, which this
    # one-process manager has not: tests/reliability/test_workers.py reads those from a real one.
    wanted = {f: t for f, t in queried_families().items() if f not in SUPERVISOR_FAMILIES}
    assert len(wanted) >= 20
    absent = sorted(f for f in wanted if f not in s.types)
    assert not absent, f"/metrics does not declare {absent}"
    mistyped = {f: (t, s.types[f]) for f, t in wanted.items() if s.types[f] != t}
    assert not mistyped, f"declared with another type than the dashboard reads them as: {mistyped}"

    lease = f"{manager.opts.namespace}/{manager.opts.leader.lease_name}"
    expected_series: list[tuple[str, dict[str, str]]] = [
        ("sidecarctl_leader", {"lease": lease}),
        ("sidecarctl_tracked_pods", {}),
        ("sidecarctl_webhook_open_connections", {}),
        ("sidecarctl_serving_cert_expiry_timestamp_seconds", {}),
        ("sidecarctl_ca_cert_expiry_timestamp_seconds", {}),
        ("sidecarctl_cert_reloads_total", {}),
        ("sidecarctl_cabundle_writes_total", {"configuration": names.MUTATING_WEBHOOK_CONFIG}),
        ("sidecarctl_admissions_total", {"webhook": "inject", "result": "injected"}),
        ("sidecarctl_admission_duration_seconds_bucket", {"webhook": "inject", "le": "+Inf"}),
        ("sidecarctl_reconciles_total", {}),
        ("sidecarctl_rollout_stalled", {"sidecarset": name}),
        ("sidecarctl_pods_not_upgradable", {"sidecarset": name}),
    ]
    missing = [(n, ls) for n, ls in expected_series if not _series(s, n, **ls)]
    assert not missing, f"no series for {missing}"
    assert s.value("sidecarctl_leader", lease=lease) == 1, "the dashboard finds the leader by sidecarctl_leader == 1"
    assert s.value("sidecarctl_rollout_stalled", sidecarset=name) == 0
    assert s.value("sidecarctl_tracked_pods") >= 1
