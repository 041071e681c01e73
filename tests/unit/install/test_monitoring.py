"""config/monitoring (the Grafana dashboard, the ServiceMonitor, the kustomize Component) and the
chart values that render the same objects.

- the dashboard is Grafana JSON whose every panel reads the `${datasource}` variable (no datasource
  UID is written in), and every metric name its queries use is one the manager registers, spelled
  as Prometheus stores it: `_total` on counters, `_bucket`/`_sum`/`_count` on histograms, the bare
  name on gauges. The names come from prometheus_client's registry after importing the manager, so a
  renamed or removed metric fails here rather than as an empty panel;
- the ServiceMonitor selects exactly the metrics Service of config/default, names its port, and
  scrapes it the way the Deployment serves it (HTTPS, a token the metrics-reader role covers, the
  certificate checked against the CA Secret and a name the certificate carries);
- the Component generates the dashboard ConfigMap without a hash suffix and with the Grafana
  sidecar's label;
- with monitoring.serviceMonitor.enabled and monitoring.dashboard.enabled, `helm template` renders
  those same two objects (and nothing else changes); the chart's dashboard is config/monitoring's
  file itself, through a symlink.

`kubectl kustomize` of an install that uses the Component is tests/e2e/test_monitoring_e2e.py, as is
the check that the running manager's /metrics exposes every family the dashboard queries.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

import sidecarctl.manager.inprocess  # noqa: F401  (imports every role, so the registry holds what the manager registers)
from cabundle import metrics as cabundle_metrics
from certwatcher import files as certfiles
from certwatcher import metrics as cert_metrics
from injector.http import metrics as injector_metrics
from injector.policysync import adoption as barrier_metrics
from injector.policysync import stored as policy_metrics
from kuberuntime import metrics as runtime_metrics
from sidecarctl.manager.handoff import ConnectionsCollector, Dispatcher
from sidecarsets.controller import metrics as sidecarset_metrics
from tests.kube import helm
from tests.kube.helm import CHART, CONFIG
from tests.unit.install.test_manifests import MANAGER_NS, key, load_docs, manager_args, render

MONITORING = CONFIG / "monitoring"
DASHBOARD = MONITORING / "sidecarctl-dashboard.json"
CHART_DASHBOARD = CHART / "files" / DASHBOARD.name
SERVICE_MONITOR = MONITORING / "servicemonitor.yaml"
METRIC_MODULES = (
    sidecarset_metrics,
    injector_metrics,
    policy_metrics,
    barrier_metrics,
    runtime_metrics,
    cert_metrics,
    cabundle_metrics,
)
# Served by the supervisor from state only it has (sidecarctl.manager.handoff), not from a module.
SUPERVISOR_FAMILIES = {"sidecarctl_webhook_worker_connections"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
METRIC_NAME = re.compile(r"sidecarctl_[a-z_]+")
# The series names a family of each type is stored under, as PromQL names them. `_created` is left
# out on purpose: the manager's supervisor serves /metrics from prometheus_client's multiprocess
# files, which have no `_created` series, so a panel on one would stay empty in a real install.
SERIES_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}
MONITORING_VALUES = ("--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.dashboard.enabled=true")

Obj = dict[str, Any]
Key = tuple[str, str, str]


# ---------------------------------------------------------------------------------------------
# What the manager registers, and what the dashboard asks for


def registered_families() -> dict[str, str]:
    """Every `sidecarctl_` metric family in the default registry, and those the supervisor adds to
    its own /metrics: name (as prometheus_client keeps it, without `_total`) -> type."""
    supervisor = CollectorRegistry()
    with socket.socket() as unbound:
        supervisor.register(ConnectionsCollector(Dispatcher(unbound)))
        families = [*REGISTRY.collect(), *supervisor.collect()]
    return {m.name: m.type for m in families if m.name.startswith("sidecarctl_")}


def module_families() -> dict[str, str]:
    """The families the product's metrics modules define, read from each collector's describe()."""
    out: dict[str, str] = {}
    for module in METRIC_MODULES:
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                for family in value.describe():
                    out[family.name] = family.type
    return out


def series_names(families: Mapping[str, str]) -> dict[str, str]:
    """Each series name PromQL can select -> the family it belongs to."""
    return {f"{name}{suffix}": name for name, kind in families.items() for suffix in SERIES_SUFFIXES[kind]}


def unknown_metrics(expr: str, known: Mapping[str, str]) -> list[str]:
    return [name for name in METRIC_NAME.findall(expr) if name not in known]


def load_dashboard() -> Obj:
    dashboard: Obj = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return dashboard


def all_panels(dashboard: Mapping[str, Any]) -> Iterator[Obj]:
    """Every panel, those inside collapsed rows included."""
    for panel in dashboard.get("panels") or []:
        yield panel
        yield from panel.get("panels") or []


def queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    for panel in all_panels(dashboard):
        for target in panel.get("targets") or []:
            yield f"panel {panel.get('title')!r} target {target.get('refId')}", str(target.get("expr", ""))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], Mapping) else var["query"]
            yield f"variable ${var['name']}", str(query)


def queried_families() -> dict[str, str]:
    """The families the dashboard's queries read: name (as the text-format parser reports it) -> type."""
    families = registered_families()
    known = series_names(families)
    names = {known[n] for _, expr in queries(load_dashboard()) for n in METRIC_NAME.findall(expr) if n in known}
    return {n: families[n] for n in sorted(names)}


@pytest.fixture(scope="module")
def dashboard() -> Obj:
    return load_dashboard()


def test_the_metric_modules_are_every_family_the_manager_registers() -> None:
    """The modules named here are the whole set: a new metrics module must be added to METRIC_MODULES."""
    registered = registered_families()
    assert set(registered) >= SUPERVISOR_FAMILIES
    assert module_families() == {name: kind for name, kind in registered.items() if name not in SUPERVISOR_FAMILIES}
    assert len(registered) >= 20


def test_the_dashboard_is_grafana_json_with_a_prometheus_datasource_variable(dashboard: Obj) -> None:
    assert dashboard["schemaVersion"] == 39
    assert dashboard.get("id") is None, "an id is per Grafana instance; provisioning assigns it"
    assert "__inputs" not in dashboard, "the datasource is a variable, not an import-time input"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    assert ds.get("current") in ({}, None), "no datasource of one Grafana is preselected"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]


def test_every_panel_has_a_title_and_reads_the_datasource_variable(dashboard: Obj) -> None:
    """Rows only group panels: they have a title and no query (and so no datasource)."""
    ids = []
    graphs = 0
    for panel in all_panels(dashboard):
        ids.append(panel["id"])
        assert str(panel.get("title", "")).strip(), f"panel {panel['id']} has no title"
        if panel["type"] == "row":
            assert not panel.get("targets"), panel["title"]
            continue
        graphs += 1
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        assert panel.get("targets"), f"{panel['title']!r} queries nothing"
        for target in panel["targets"]:
            assert target.get("datasource") == DATASOURCE, f"{panel['title']!r} target {target.get('refId')}"
            assert str(target.get("expr", "")).strip(), f"{panel['title']!r} target {target.get('refId')}"
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), panel["title"]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert graphs >= 20


def test_panels_fit_the_grid_without_overlapping(dashboard: Obj) -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = panel["title"]


def test_no_datasource_uid_is_written_in(dashboard: Obj) -> None:
    """The one uid of its own is the dashboard's (stable links, and the sidecar replaces it in place)."""

    def walk(node: Any, path: str) -> Iterator[tuple[str, Any]]:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if k == "uid" and path:
                    yield path, v
                yield from walk(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}/{i}")

    hard_coded = [(path, uid) for path, uid in walk(dashboard, "") if uid != "${datasource}"]
    assert not hard_coded
    assert dashboard["uid"] == "sidecarctl-manager"


def test_every_metric_the_dashboard_queries_is_registered_by_the_manager(dashboard: Obj) -> None:
    known = series_names(registered_families())
    found = list(queries(dashboard))
    assert len(found) >= 25
    unknown = {where: bad for where, expr in found if (bad := unknown_metrics(expr, known))}
    assert not unknown, f"queries name series the manager does not expose: {unknown}"
    for where, expr in found:
        if where.startswith("panel"):
            assert METRIC_NAME.search(expr), f"{where} reads no sidecarctl_ metric: {expr}"


@pytest.mark.parametrize(
    "name",
    [
        "sidecarctl_sidecarset_matched_pods",  # no such metric (status.matchedPods is not exported)
        "sidecarctl_reconciles",  # a counter is stored with _total
        "sidecarctl_pods_not_upgradable_total",  # a gauge is not
        "sidecarctl_admission_duration_seconds",  # a histogram has only _bucket, _sum and _count
        "sidecarctl_admissions_total_bucket",
        "sidecarctl_admission_duration_seconds_created",  # not in the multiprocess exposition
    ],
)
def test_the_name_check_refuses_series_the_manager_does_not_expose(name: str) -> None:
    known = series_names(registered_families())
    assert unknown_metrics(f'sum(rate({name}{{namespace=~"$namespace"}}[5m]))', known) == [name]


def test_the_dashboard_shows_every_family_the_manager_exports() -> None:
    """A metric nobody can see on the dashboard is one nobody watches: a new one gets a panel."""
    missing = sorted(set(registered_families()) - set(queried_families()))
    assert not missing, f"no panel queries {missing}"


def test_counters_are_read_as_rates_and_gauges_as_values(dashboard: Obj) -> None:
    """A raw counter only ever grows (and resets on restart); rate() or increase() makes it readable."""
    families = registered_families()
    for where, expr in queries(dashboard):
        if not where.startswith("panel"):
            continue
        for name in METRIC_NAME.findall(expr):
            if name.endswith(("_total", "_bucket")):
                assert re.search(rf"(rate|increase)\({name}\b", expr), f"{where}: {name} is not rated"
            elif families.get(name) == "gauge":
                assert not re.search(rf"(rate|increase)\({name}\b", expr), f"{where}: rate() of gauge {name}"


# ---------------------------------------------------------------------------------------------
# The ServiceMonitor against config/default


@pytest.fixture(scope="module")
def default() -> dict[Key, Obj]:
    return {key(o): o for o in render(CONFIG / "default")}


def service_monitor() -> Obj:
    (sm,) = load_docs(SERVICE_MONITOR)
    return sm


def test_the_servicemonitor_selects_the_metrics_service_only_and_names_its_port(default: dict[Key, Obj]) -> None:
    sm = service_monitor()
    assert (sm["apiVersion"], sm["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    selector = sm["spec"]["selector"]
    assert set(selector) == {"matchLabels"}
    want = selector["matchLabels"].items()
    ns = sm["metadata"]["namespace"]
    assert "namespaceSelector" not in sm["spec"], "without one, the ServiceMonitor's own namespace is searched"
    selected = [
        k for k, o in default.items() if k[0] == "Service" and k[1] == ns and want <= o["metadata"]["labels"].items()
    ]
    assert selected == [("Service", MANAGER_NS, "sidecarctl-metrics")]
    service = default[selected[0]]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]


def test_the_servicemonitor_scrapes_the_way_the_manager_serves(
    default: dict[Key, Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    (endpoint,) = service_monitor()["spec"]["endpoints"]
    args = manager_args(default[("Deployment", MANAGER_NS, "sidecarctl")], monkeypatch)
    assert args.metrics_secure and args.metrics_bind, "/metrics is served over HTTPS on its own port"
    assert endpoint["scheme"] == "https"
    assert endpoint["path"] == "/metrics"
    reader = default[("ClusterRole", "", "sidecarctl-metrics-reader")]
    assert {"nonResourceURLs": [endpoint["path"]], "verbs": ["get"]} in reader["rules"]
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    tls = endpoint["tlsConfig"]
    assert tls["insecureSkipVerify"] is False
    assert tls["serverName"] in args.extra_dns, "the name checked must be one the serving certificate holds"
    assert tls["serverName"] == f"sidecarctl-metrics.{MANAGER_NS}.svc"
    assert args.self_signed
    assert tls["ca"] == {"secret": {"name": args.secret_name, "key": certfiles.CA_FILE}}
    assert not {"caFile", "certFile", "keyFile"} & set(tls), "files in Prometheus's pod are not ours to name"


# ---------------------------------------------------------------------------------------------
# The Component


def component() -> Obj:
    found: Obj = yaml.safe_load((MONITORING / "kustomization.yaml").read_text(encoding="utf-8"))
    return found


def expected_dashboard_configmap() -> Obj:
    """The ConfigMap the Component's configMapGenerator makes (and the chart must render)."""
    (gen,) = component()["configMapGenerator"]
    (file,) = gen["files"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": gen["name"], "namespace": gen["namespace"], "labels": gen["options"]["labels"]},
        "data": {Path(file).name: (MONITORING / file).read_text(encoding="utf-8")},
    }


def test_the_kustomization_is_a_component_with_the_servicemonitor_and_the_dashboard() -> None:
    c = component()
    assert (c["apiVersion"], c["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")
    assert c["resources"] == [SERVICE_MONITOR.name]
    (gen,) = c["configMapGenerator"]
    assert gen["files"] == [DASHBOARD.name]
    assert gen["namespace"] == MANAGER_NS
    assert gen["options"]["disableNameSuffixHash"] is True, "the Grafana sidecar follows one fixed name"
    assert gen["options"]["labels"]["grafana_dashboard"] == "1", "a label value is a string"
    listed = {"kustomization.yaml", *c["resources"], *gen["files"]}
    assert {p.name for p in MONITORING.iterdir()} == listed, "every file of the Component is used"


# ---------------------------------------------------------------------------------------------
# The chart


@pytest.fixture(scope="module")
def chart_helm() -> None:
    helm.require("helm", checking="the chart's monitoring templates")


def keyed(objs: list[Obj]) -> dict[Key, Obj]:
    return {key(o): o for o in objs}


def test_the_chart_dashboard_is_config_monitorings_file() -> None:
    assert CHART_DASHBOARD.is_symlink() and CHART_DASHBOARD.resolve() == DASHBOARD.resolve()


def test_the_chart_renders_config_monitorings_objects_when_asked(chart_helm: None) -> None:
    default = keyed(helm.helm_template())
    on = keyed(helm.helm_template(*MONITORING_VALUES))
    sm, cm = service_monitor(), expected_dashboard_configmap()
    assert set(on) - set(default) == {key(sm), key(cm)}
    assert {k: on[k] for k in default} == default, "the monitoring values change no other object"
    assert on[key(sm)] == sm
    assert on[key(cm)] == cm
    assert not {k[0] for k in default} & {"ServiceMonitor", "ConfigMap"}, "both are off by default"


@pytest.mark.parametrize("value", ["serviceMonitor", "dashboard"])
def test_each_monitoring_value_adds_its_own_object(value: str, chart_helm: None) -> None:
    default = keyed(helm.helm_template())
    added = set(keyed(helm.helm_template("--set", f"monitoring.{value}.enabled=true"))) - set(default)
    obj = service_monitor() if value == "serviceMonitor" else expected_dashboard_configmap()
    assert added == {key(obj)}


def test_monitoring_labels_interval_and_namespace(tmp_path: Path, chart_helm: None) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        json.dumps(
            {
                "monitoring": {
                    "serviceMonitor": {
                        "enabled": True,
                        "labels": {"release": "kube-prometheus-stack"},
                        "interval": "1m",
                    },
                    "dashboard": {"enabled": True, "namespace": "grafana", "labels": {"team": "platform"}},
                }
            }
        )
    )
    objs = keyed(helm.helm_template("-f", str(values)))
    sm = objs[("ServiceMonitor", MANAGER_NS, "sidecarctl-metrics")]
    assert sm["metadata"]["labels"] == {**service_monitor()["metadata"]["labels"], "release": "kube-prometheus-stack"}
    assert sm["spec"]["endpoints"][0]["interval"] == "1m"
    cm = objs[("ConfigMap", "grafana", "sidecarctl-dashboard")]
    assert cm["metadata"]["labels"] == {
        "app.kubernetes.io/name": "sidecarctl",
        "grafana_dashboard": "1",
        "team": "platform",
    }


def test_the_servicemonitor_follows_the_install_namespace(chart_helm: None) -> None:
    args = ("--set", "installation.namespace=mesh-control", *MONITORING_VALUES)
    objs = keyed(helm.helm_template(*args))
    sm = objs[("ServiceMonitor", "mesh-control", "sidecarctl-metrics")]
    assert sm["spec"]["endpoints"][0]["tlsConfig"]["serverName"] == "sidecarctl-metrics.mesh-control.svc"
    deployment = objs[("Deployment", "mesh-control", "sidecarctl")]
    assert (
        "--extra-dns=sidecarctl-metrics.mesh-control.svc"
        in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert ("ConfigMap", "mesh-control", "sidecarctl-dashboard") in objs


def test_a_servicemonitor_with_cert_manager_is_refused(chart_helm: None) -> None:
    """With cert-manager the manager has no HTTPS metrics port: the ServiceMonitor would scrape nothing."""
    mode = ("--set", "certificates.mode=cert-manager")
    proc = helm.run(
        "helm", "template", "sidecarctl", str(CHART), *mode, "--set", "monitoring.serviceMonitor.enabled=true"
    )
    assert proc.returncode != 0
    assert "monitoring.serviceMonitor.enabled needs certificates.mode=self-signed" in proc.stderr
    objs = keyed(helm.helm_template(*mode, "--set", "monitoring.dashboard.enabled=true"))
    assert ("ConfigMap", MANAGER_NS, "sidecarctl-dashboard") in objs


def test_helm_lint_is_clean_with_monitoring_on(chart_helm: None) -> None:
    proc = helm.run("helm", "lint", "--strict", str(CHART), *MONITORING_VALUES)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out
