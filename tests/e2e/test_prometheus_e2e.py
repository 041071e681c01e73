"""A real Prometheus (built from its Go module, tools/build-prometheus.sh) against a running manager.

A private control plane with a fake kubelet, `sidecarctl run --metrics-secure` leading it, and
Prometheus scraping, every second:
- the manager's secure /metrics over HTTPS, verifying the certificate against the cert dir's CA, with
  a ServiceAccount token bound to config/rbac's sidecarctl-metrics-reader: the target is up;
- the same endpoint with the token of a ServiceAccount bound to nothing: the target is down, its
  error the manager's 403;
- kube-apiserver's /metrics (admin client certificate), for the alert that only it can measure.

Prometheus loads config/alerts' rules as they are, except every `for` set to 0s (a test cannot wait
ten minutes). A scripted workload then injects, rolls (to an image that never becomes ready, past a
5 s progress deadline), makes pods miss their sidecars (one of them owned, so `--recreate-missed`
evicts it), changes a sidecar in a way no in-place upgrade can follow, has pods refused by the
webhook, and sends the webhook a refused request and a connection that closes at once. Then:
- every dashboard panel's PromQL, with its variables substituted, evaluates without error through
  Prometheus's HTTP API, and each returns at least one series except the panels in EVENTLESS, whose
  event this workload cannot cause on demand;
- the alerts for a refusing webhook, a stalled rollout, pods missing sidecars, pods not upgradable
  and the serving certificate's expiry (the test cert dir's certificate lives one day) fire, naming
  their object, and those with nothing to say (no leader, webhook errors, flapping) stay quiet;
- with the manager killed, a pod create fails at the API server and SidecarctlWebhookUnreachable
  fires from kube-apiserver's own counter.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberuntime import api
from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, create_ready_pods, make_pod, make_sidecarset, set_image, wait_injecting
from tests.e2e.policysupport import PolicyCluster, kill_all, private_cluster
from tests.kube import builders, prometheus
from tests.kube.client import eventually
from tests.kube.controlplane import REPO, ControlPlane, free_port
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.unit.install.test_alerts import prometheus_rule
from tests.unit.install.test_monitoring import all_panels, load_dashboard

MANAGER_NS = "sidecarctl-system"
APPS = "prom-apps"
LATE = "prom-late"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
BAD_IMAGE = "proxy:never-ready"
DEADLINE = 5
# Panels whose series need an event this workload cannot cause on demand: none since the namespace
# lookups (a pod admitted before the worker's namespace watch delivered its namespace, a race) share
# a panel with the snapshot waits, whose series are exported from zero.
EVENTLESS: set[str] = set()
SUBSTITUTIONS = {"$namespace": MANAGER_NS, "$sidecarset": ".*", "$__rate_interval": "1m"}

Obj = dict[str, Any]


@dataclass
class Stack:
    cluster: PolicyCluster
    kubelet: FakeKubelet
    prometheus: subprocess.Popen[bytes]
    url: str
    log: Path

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[Obj]:
        result: list[Obj] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def scraped(self, expr: str) -> float | None:
        """The value Prometheus has now for the one series `expr` selects (None before its first scrape)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def firing(self) -> dict[str, list[dict[str, str]]]:
        out: dict[str, list[dict[str, str]]] = {}
        for alert in self.get("/api/v1/alerts")["alerts"]:
            if alert["state"] == "firing":
                out.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return out


def _token(c: PolicyCluster, name: str) -> str:
    c.kube.create(
        f"/api/v1/namespaces/{MANAGER_NS}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
    )
    token: str = c.kube.create(
        f"/api/v1/namespaces/{MANAGER_NS}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    return token


def _grant_metrics(c: PolicyCluster, account: str) -> None:
    role = yaml.safe_load((REPO / "config" / "rbac" / "metrics_reader_clusterrole.yaml").read_text())
    c.kube.apply("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    c.kube.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{account}-metrics"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": MANAGER_NS}],
        },
    )


def _rules(directory: Path) -> Path:
    """config/alerts' groups with every `for` at 0s: the expressions are the shipped ones."""
    groups = prometheus_rule()["spec"]["groups"]
    for group in groups:
        for rule in group["rules"]:
            rule["for"] = "0s"
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def _config(directory: Path, c: PolicyCluster, metrics_port: int, tokens: dict[str, str]) -> Path:
    pki = c.cp.workdir / "pki"
    target = {"targets": [f"127.0.0.1:{metrics_port}"], "labels": {"namespace": MANAGER_NS, "pod": "sidecarctl-0"}}
    jobs: list[Obj] = []
    for job, token in tokens.items():
        (directory / f"{job}.token").write_text(token)
        jobs.append(
            {
                "job_name": job,
                "scheme": "https",
                "authorization": {"credentials_file": str(directory / f"{job}.token")},
                "tls_config": {"ca_file": str(c.cert_dir / "ca.crt"), "server_name": "127.0.0.1"},
                "static_configs": [target],
            }
        )
    apiserver = urllib.parse.urlsplit(c.cp.url).netloc
    jobs.append(
        {
            "job_name": "apiserver",
            "scheme": "https",
            "tls_config": {
                "ca_file": str(pki / "serving-ca.crt"),
                "cert_file": str(pki / "admin.crt"),
                "key_file": str(pki / "admin.key"),
            },
            "static_configs": [{"targets": [apiserver]}],
        }
    )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(_rules(directory))],
        "scrape_configs": jobs,
    }
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _start_prometheus(directory: Path, config: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log = directory / "prometheus.log"
    out = open(log, "wb")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        [
            str(prometheus.binaries() / "prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            assert proc.poll() is None, f"prometheus exited:\n{log.read_text()[-3000:]}"
            return False

    eventually(ready, timeout=30, what="Prometheus ready")
    return proc, url, log


@pytest.fixture(scope="module")
def stack(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[Stack]:
    prometheus.binaries()  # skip (or fail under CI) before starting a cluster for nothing
    metrics_port = free_port()
    extra = (
        f"--metrics-bind=127.0.0.1:{metrics_port}",
        "--metrics-secure",
        "--missed-scan-interval=1",
        "--recreate-missed",
        "--recreate-missed-per-minute=60",
    )
    directory = Path(tempfile.mkdtemp(prefix="sidecarctl-prometheus-"))
    with private_cluster(aloop, control_plane.bin_dir, injection="webhook", extra=extra) as c:
        kubelet = FakeKubelet(c.client, node="prom-node", restart_delay=0.1)
        aloop.run(kubelet.start())
        kubelet.namespaces |= {APPS, LATE}
        kubelet.bad_images.add(BAD_IMAGE)
        proc: subprocess.Popen[bytes] | None = None
        try:
            _grant_metrics(c, "prometheus")
            tokens = {"sidecarctl": _token(c, "prometheus"), "sidecarctl-refused": _token(c, "stranger")}
            proc, url, log = _start_prometheus(directory, _config(directory, c, metrics_port, tokens))
            yield Stack(c, kubelet, proc, url, log)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=20)
            aloop.run(kubelet.stop())


# ---------------------------------------------------------------------------------------------
# The workload


def _denied_pod(c: PolicyCluster) -> str:
    try:
        c.kube.create(f"/api/v1/namespaces/{APPS}/pods", make_pod(f"deny-{time.monotonic_ns()}", "deny"))
    except api.ApiError as e:
        return e.message
    raise AssertionError("the webhook admitted a pod its SidecarSet cannot be injected into")


def _bad_requests(c: PolicyCluster) -> None:
    """A request over the body limit (refused: too_large), a review without a request (bad_request)
    and a connection closed at once."""
    ctx = ssl.create_default_context(cafile=str(c.cert_dir / "ca.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", c.port, context=ctx, timeout=5)
    conn.putrequest("POST", "/inject")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(64 * 1024 * 1024))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    conn = http.client.HTTPSConnection("127.0.0.1", c.port, context=ctx, timeout=5)
    conn.request("POST", "/inject", body=b'{"kind": "AdmissionReview"}', headers={"Content-Type": "application/json"})
    assert conn.getresponse().status == 400
    conn.close()
    socket.create_connection(("127.0.0.1", c.port), timeout=5).close()


def _wait_scraped(s: Stack, expr: str, value: float) -> None:
    eventually(lambda: s.scraped(expr) == value, timeout=20, what=f"Prometheus has {expr} = {value}")


def _workload(s: Stack) -> None:
    c = s.cluster
    c.namespace(APPS, ENABLED)
    c.namespace(LATE, {})
    # Missed: pods run in LATE before it is labelled; the owned one is evicted, the other stays.
    owner = c.kube.create(
        f"/apis/apps/v1/namespaces/{LATE}/replicasets",
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "late"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "mesh", "tier": "rs"}},
                "template": {**make_pod("x", "mesh", tier="rs"), "metadata": {"labels": {"app": "mesh", "tier": "rs"}}},
            },
        },
    )
    owned = make_pod("late-owned", "mesh")
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "late",
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
    ]
    c.kube.create(f"/api/v1/namespaces/{LATE}/pods", owned)
    c.kube.create(f"/api/v1/namespaces/{LATE}/pods", make_pod("late-bare", "mesh"))

    strategy = {"type": "RollingUpdate", "maxUnavailable": "100%", "progressDeadlineSeconds": DEADLINE}
    c.kube.create(SS_PATH, make_sidecarset("prom-mesh", "mesh", initContainers=[], updateStrategy=strategy))
    c.kube.create(SS_PATH, make_sidecarset("prom-env", "env", initContainers=[]))
    refuse = builders.container("proxy", "proxy:1")
    refuse["resourcesPolicy"] = {
        "targetContainersMode": "sum",
        "targetContainersNameRegex": "^no-such-container$",
        "resourcesExpr": {"limits": {"cpu": "cpu*50%"}},
    }
    c.kube.create(SS_PATH, make_sidecarset("prom-deny", "deny", initContainers=[], containers=[refuse]))
    wait_injecting(c.kube, APPS, "mesh", lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    wait_injecting(c.kube, APPS, "env", lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    create_ready_pods(c.kube, APPS, "mesh", 2)
    create_ready_pods(c.kube, APPS, "env", 1)
    c.namespace(LATE, ENABLED)

    # Refused pods and requests, each seen by a scrape before the next: a rate needs two samples
    # that differ (a series first scraped at its final value has a rate of 0 until it moves again).
    for i in range(1, 3):
        assert "resourcesPolicy" in _denied_pod(c)
        _bad_requests(c)
        _wait_scraped(s, 'sidecarctl_pod_denials_total{reason="cannot_inject"}', i)
    # Roll mesh to an image that never becomes ready: patched in place, then stalled at the deadline.
    set_image(c.kube, "prom-mesh", BAD_IMAGE)
    # A change no in-place upgrade can follow: env's pod becomes not upgradable.
    c.kube.patch(
        f"{SS_PATH}/prom-env",
        [
            {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "MODE", "value": "strict"}]},
            {"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:2"},
        ],
        patch_type="json",
    )


# ---------------------------------------------------------------------------------------------
# The test


def _panel_queries() -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every panel target (the variables' label_values are Grafana's, not PromQL)."""
    for panel in all_panels(load_dashboard()):
        for target in panel.get("targets") or []:
            yield str(panel["title"]), str(target["expr"])


def _labels_of(alerts: list[dict[str, str]], key: str) -> set[str]:
    return {a.get(key, "") for a in alerts}


def test_prometheus_scrapes_evaluates_every_panel_and_fires_the_alerts(stack: Stack) -> None:
    s = stack
    _workload(s)

    def fired() -> dict[str, list[dict[str, str]]] | None:
        got = s.firing()
        want = {
            "SidecarctlInjectionDenied",
            "SidecarctlRolloutStalled",
            "SidecarctlPodsMissingSidecars",
            "SidecarctlPodsNotUpgradable",
            "SidecarctlServingCertificateExpiring",
        }
        return got if want <= set(got) else None

    try:
        alerts = eventually(fired, timeout=60, what="the alerts the workload causes firing")
    except AssertionError as e:
        health = [(t["labels"]["job"], t["health"], t["lastError"]) for t in s.get("/api/v1/targets")["activeTargets"]]
        raise AssertionError(f"{e}: firing {sorted(s.firing())}; targets {health}") from None
    assert _labels_of(alerts["SidecarctlRolloutStalled"], "sidecarset") == {"prom-mesh"}
    assert _labels_of(alerts["SidecarctlPodsMissingSidecars"], "sidecarset") == {"prom-mesh"}
    assert _labels_of(alerts["SidecarctlPodsNotUpgradable"], "sidecarset") == {"prom-env"}
    assert _labels_of(alerts["SidecarctlInjectionDenied"], "reason") == {"cannot_inject"}
    assert _labels_of(alerts["SidecarctlServingCertificateExpiring"], "pod") == {"sidecarctl-0"}
    quiet = {
        "SidecarctlNoLeader",
        "SidecarctlWebhookErrors",
        "SidecarctlLeaderFlapping",
        "SidecarctlWebhookUnreachable",
    }
    assert not quiet & set(alerts), {k: alerts[k] for k in quiet & set(alerts)}

    # The scrapes: the bound token is accepted, the other refused by the manager's authorization.
    targets = {t["labels"]["job"]: t for t in s.get("/api/v1/targets")["activeTargets"]}
    assert targets["sidecarctl"]["health"] == "up", targets["sidecarctl"]
    assert targets["apiserver"]["health"] == "up", targets["apiserver"]
    refused = targets["sidecarctl-refused"]
    assert refused["health"] == "down" and "403" in refused["lastError"], refused

    # Every panel evaluates; all but the eventless ones return series.
    with_series: dict[str, bool] = {}
    evaluated = 0
    for title, expr in _panel_queries():
        for var, value in SUBSTITUTIONS.items():
            expr = expr.replace(var, value)
        assert "$" not in expr, f"{title}: a variable left in {expr}"
        result = s.query(expr)  # an evaluation error fails here (status "error")
        evaluated += 1
        with_series[title] = with_series.get(title, False) or bool(result)
    without = {title for title, has in with_series.items() if not has}
    assert without <= EVENTLESS, f"panels with no series: {sorted(without - EVENTLESS)}"
    print(
        f"\nprometheus e2e: {evaluated} queries of {len(with_series)} panels evaluated, "
        f"{len(with_series) - len(without)} with series (without: {sorted(without)}); "
        f"firing: {sorted(alerts)}; refused scrape: {refused['lastError']}"
    )

    # The manager gone: the API server cannot call the webhook, and only it can say so.
    manager = s.cluster.manager
    assert manager is not None
    kill_all(manager)
    s.cluster.manager = None
    for i in range(3):
        with pytest.raises(api.ApiError, match="failed calling webhook"):
            s.cluster.kube.create(f"/api/v1/namespaces/{APPS}/pods", make_pod(f"unreachable-{i}", "mesh"))
        time.sleep(1.2)
    unreachable = eventually(
        lambda: s.firing().get("SidecarctlWebhookUnreachable"), timeout=30, what="SidecarctlWebhookUnreachable"
    )
    assert _labels_of(unreachable, "name") == {names.MUTATING_WEBHOOK_NAME}
