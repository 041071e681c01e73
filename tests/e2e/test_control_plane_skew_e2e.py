"""Control planes as they are during an upgrade: two kube-apiserver minors on one etcd, one minor
replaced by the next under a running manager, and an optional API turned off.

Each test runs a control plane of its own (tests/e2e/policysupport.py) and the real `sidecarctl run`
process tree, with discovery read every second so a change is seen within the test's patience.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kuberuntime import kubeapi, kubeconfig
from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, make_pod, make_sidecarset, set_image, status_of, upgradable
from tests.e2e.policysupport import PolicyCluster, policy_holding, private_cluster
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import binaries_dir, supported_versions
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import MWC_PATH

NS = "skew"
FAST_DISCOVERY = ("--discovery-interval=1",)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


NEWEST = _minor(supported_versions()[-1])
PREVIOUS = _minor(supported_versions()[-2])
LAST_WITHOUT_POLICIES = "1.35"  # MutatingAdmissionPolicy v1 is GA from 1.36
OLDEST = _minor(supported_versions()[0])


def _condition(kube: Kube, name: str) -> dict[str, Any] | None:
    conditions = status_of(kube, name).get("conditions") or []
    return next((c for c in conditions if c["type"] == names.CONDITION_POLICY_INJECTION), None)


def _sidecar_names(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod["spec"]["containers"]]


@pytest.fixture
def clients(aloop: BackgroundLoop) -> Iterator[Callable[[PolicyCluster, int], Kube]]:
    """`open(cluster, port)`: a client of the cluster's kube-apiserver on `port` alone (not through
    its balancer), closed after the test."""
    opened: list[kubeapi.KubeClient] = []

    def open_one(c: PolicyCluster, port: int) -> Kube:
        client = kubeapi.KubeClient(kubeconfig.load_config(str(c.cp.kubeconfig_for(f"https://127.0.0.1:{port}"))))
        opened.append(client)
        return Kube(aloop, client)

    yield open_one
    for client in opened:
        aloop.run(client.close())


def _create_through(
    kubes: list[Kube], count: int, app: str, *, change: Callable[[], None] | None = None
) -> list[tuple[float, dict[str, Any]]]:
    """`count` pods created through each kube-apiserver in turn (`change` called after the first
    quarter), with when each create was sent."""
    created: list[tuple[float, dict[str, Any]]] = []
    for i in range(count):
        if change is not None and i == count // 4:
            change()
        sent = time.monotonic()
        created.append(
            (sent, kubes[i % len(kubes)].create(f"/api/v1/namespaces/{NS}/pods", make_pod(f"{app}-{i}", app)))
        )
        time.sleep(0.1)
    return created


def test_two_apiserver_minors_on_one_etcd_inject_every_pod_while_a_sidecarset_changes(
    aloop: BackgroundLoop, clients: Callable[[PolicyCluster, int], Kube]
) -> None:
    """An HA control plane half way through its upgrade: the newest minor and the one before on one
    etcd, the manager talking to both through a load balancer. Pods are created through each while
    the SidecarSet's image changes: every pod is admitted and carries one complete set of sidecars
    (the old image, or the new one once the change has had time to reach both), and the controller
    keeps the status current."""
    peers = (binaries_dir(PREVIOUS),)
    with private_cluster(aloop, binaries_dir(NEWEST), injection="auto", extra=FAST_DISCOVERY, peers=peers) as c:
        (older_port,) = c.cp.peers
        kubes = [clients(c, c.cp.port), clients(c, older_port)]
        assert {k.get("/version")["gitVersion"] for k in kubes} == {c.cp.version, *c.cp.peers.values()}
        c.namespace(NS, {names.NS_INJECTION_LABEL: "enabled"})
        ss = c.kube.create(SS_PATH, make_sidecarset("skew", "skew", initContainers=[]))
        name = ss["metadata"]["name"]
        eventually(lambda: (_condition(c.kube, name) or {}).get("status") == "True", timeout=60, what="policy-served")
        eventually(lambda: _by_policy_through(kubes, "skew"), timeout=30, what="both minors enforce the policy")

        changed: list[float] = []

        def change() -> None:
            set_image(c.kube, name, "proxy:2")
            changed.append(time.monotonic())

        created = _create_through(kubes, 40, "skew", change=change)
        for sent, pod in created:
            assert _sidecar_names(pod) == ["proxy", "app"], pod["metadata"]["name"]
            image = pod["spec"]["containers"][0]["image"]
            assert image in ("proxy:1", "proxy:2"), pod["metadata"]["name"]
            # A change reaches the webhook's store within a second, and the webhook stays widened until the
            # rewritten policy is enforced by both minors: 2 s is that second with room for this machine.
            if sent - changed[0] >= 2.0:
                assert image == "proxy:2", (pod["metadata"]["name"], sent - changed[0])
        assert sum(1 for sent, _ in created if sent - changed[0] >= 2.0) >= 5, "pods created well after the change"

        def counted() -> dict[str, Any] | None:
            st = status_of(c.kube, name)
            return st if st.get("matchedPods") == 40 and st.get("observedGeneration") == 2 else None

        eventually(counted, timeout=30, what="the controller counts all 40 pods at generation 2")


def _by_policy_through(kubes: list[Kube], app: str) -> bool:
    for kube in kubes:
        pod = kube.create(f"/api/v1/namespaces/{NS}/pods", make_pod("probe", app), dryRun="All")
        if pod["metadata"]["annotations"].get(names.ANN_INJECTED_BY) != "policy":
            return False
    return True


def test_while_one_kube_apiserver_lacks_policies_the_webhook_serves_every_pod(
    aloop: BackgroundLoop, clients: Callable[[PolicyCluster, int], Kube]
) -> None:
    """The upgrade to the first minor with MutatingAdmissionPolicy v1 (1.35 to 1.36), part way: one
    kube-apiserver of each behind the load balancer. A pod the 1.35 one admits would get neither a
    policy nor the (narrowed) webhook, so no policy is used: every pod, through either, is injected by
    the webhook. Once the 1.35 one is gone (the upgrade done), the policy is written and used."""
    peers = (binaries_dir(LAST_WITHOUT_POLICIES),)
    with private_cluster(aloop, binaries_dir("1.36"), injection="auto", extra=FAST_DISCOVERY, peers=peers) as c:
        (older_port,) = c.cp.peers
        assert c.balancer is not None and c.manager is not None
        # Three connections of four to the 1.36 server: discovery, on kept connections, often lists the
        # API (it must do so in several reads in a row to count); the canary, asked on a new connection
        # each time, can never get more than three mutated answers in a row. Either keeps policies off.
        c.balancer.upstreams = [c.cp.port] * 3 + [older_port]
        kubes = [clients(c, c.cp.port), clients(c, older_port)]
        c.namespace(NS, {names.NS_INJECTION_LABEL: "enabled"})
        ss = c.kube.create(SS_PATH, make_sidecarset("mixed", "mixed", initContainers=[]))
        name = ss["metadata"]["name"]

        def unsupported() -> dict[str, Any]:
            cond = _condition(c.kube, name)
            assert cond is not None and cond["reason"] == "PolicyUnsupported", status_of(c.kube, name)
            return cond

        eventually(unsupported, timeout=60, what="PolicyInjection False: not every kube-apiserver enforces policies")
        try:
            for _, pod in _create_through(kubes, 20, "mixed"):
                assert _sidecar_names(pod) == ["proxy", "app"], pod["metadata"]["name"]
                assert pod["metadata"]["annotations"][names.ANN_INJECTED_BY] == "webhook", pod["metadata"]["name"]
        except AssertionError:  # a pod with no sidecar: what the manager and the webhook's condition said
            print(f"manager log:\n{c.manager.log_tail(300)}")
            print(f"webhook configuration:\n{c.kube.get(f'{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}')}")
            raise
        assert policy_holding(c.kube, name) is None
        assert (_condition(c.kube, name) or {}).get("reason") == "PolicyUnsupported"

        c.balancer.upstreams = [c.cp.port]  # the 1.35 server leaves the load balancer, then stops
        c.cp.remove_apiserver(older_port, graceful=False)
        eventually(lambda: policy_holding(c.kube, name) is not None, timeout=120, what="the policy written")
        eventually(lambda: _by_policy_through(kubes[:1], "mixed"), timeout=60, what="new pods injected by the policy")


def test_an_upgrade_to_the_first_minor_with_policies_is_adopted_without_a_restart(aloop: BackgroundLoop) -> None:
    """The control plane upgraded from 1.35 (no MutatingAdmissionPolicy v1) to 1.36 under a running
    manager: it injects by webhook and says why, then, with the same processes, sees the new API,
    writes its policy and serves new pods by it; and it says so in its log once."""
    with private_cluster(aloop, binaries_dir(LAST_WITHOUT_POLICIES), injection="auto", extra=FAST_DISCOVERY) as c:
        assert c.manager is not None
        pid = c.manager.proc.pid
        c.namespace(NS, {names.NS_INJECTION_LABEL: "enabled"})
        ss = c.kube.create(SS_PATH, make_sidecarset("upg", "upg", initContainers=[]))
        name = ss["metadata"]["name"]

        def unsupported() -> dict[str, Any]:
            cond = _condition(c.kube, name)
            assert cond is not None and cond["reason"] == "PolicyUnsupported", cond
            return cond

        cond = eventually(unsupported, timeout=30, what="PolicyUnsupported on 1.35")
        assert f"Kubernetes {c.cp.version}" in cond["message"]

        # The condition is the leader's; the admission workers watch the SidecarSet themselves, a moment apart.
        def injected_by_webhook(dry_run: bool) -> bool:
            params = {"dryRun": "All"} if dry_run else {}
            pod = c.kube.create(f"/api/v1/namespaces/{NS}/pods", make_pod("before", "upg"), **params)
            return (pod["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY) == "webhook"

        eventually(lambda: injected_by_webhook(True), timeout=10, what="the webhook injecting on 1.35")
        assert injected_by_webhook(False)

        # Stopped at once: with the manager's watches open a graceful stop takes the whole 10 s.
        c.cp.restart_apiserver(bin_dir=binaries_dir("1.36"), graceful=False)
        assert c.kube.get("/version")["gitVersion"] == c.cp.version and c.cp.version.startswith("v1.36.")

        eventually(lambda: policy_holding(c.kube, name) is not None, timeout=60, what="the policy written after")

        def by_policy() -> bool:
            pod = c.kube.create(f"/api/v1/namespaces/{NS}/pods", make_pod("probe", "upg"), dryRun="All")
            return bool(pod["metadata"]["annotations"].get(names.ANN_INJECTED_BY) == "policy")

        eventually(by_policy, timeout=60, what="new pods injected by the policy")
        assert (_condition(c.kube, name) or {}).get("reason") == "PolicyServed"
        assert c.manager.proc.poll() is None and c.manager.proc.pid == pid, "the same manager, not restarted"
        log = c.manager.log_path.read_text(errors="replace")
        assert log.count(f"API server {c.cp.version}: --injection=auto") == 1, c.manager.log_tail()


def test_without_pods_resize_a_resources_change_is_not_rolled_and_says_why(aloop: BackgroundLoop) -> None:
    """Kubernetes 1.34 with InPlacePodVerticalScaling turned off serves no `pods/resize`: the manager
    starts all the same (its controller does not wait for it), a resources change leaves the pods as
    they are, marks them not upgradable, and the SidecarSet's Event names the missing subresource."""
    gate = ("--feature-gates=InPlacePodVerticalScaling=false",)
    with private_cluster(aloop, binaries_dir(OLDEST), injection="auto", apiserver_flags=gate) as c:
        discovered = c.kube.get("/api/v1")
        assert "pods/resize" not in {r["name"] for r in discovered["resources"]}
        kubelet = FakeKubelet(c.client)
        kubelet.namespaces.add(NS)
        aloop.run(kubelet.start())
        try:
            c.namespace(NS, {names.NS_INJECTION_LABEL: "enabled"})
            proxy = {"name": "proxy", "image": "proxy:1", "resources": {"requests": {"cpu": "100m"}}}
            spec = {"containers": [proxy], "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": "100%"}}
            ss = c.kube.create(SS_PATH, make_sidecarset("nores", "nores", initContainers=[], **spec))
            name = ss["metadata"]["name"]
            eventually(lambda: status_of(c.kube, name).get("latestRevision"), timeout=30, what="first revision")
            for i in range(2):
                c.kube.create(f"/api/v1/namespaces/{NS}/pods", make_pod(f"nores-{i}", "nores"))
            eventually(lambda: status_of(c.kube, name).get("readyPods") == 2, timeout=30, what="2 pods ready")
            c.kube.patch(
                f"{SS_PATH}/{name}",
                [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": "200m"}],
                patch_type="json",
            )

            def refused() -> list[dict[str, Any]]:
                pods = c.kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector="app=nores")["items"]
                assert len(pods) == 2 and all(upgradable(p) == "False" for p in pods), [upgradable(p) for p in pods]
                return list(pods)

            pods = eventually(refused, timeout=30, what="both pods not upgradable")
            for pod in pods:
                assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "100m"

            def said() -> str:
                events = c.kube.get("/api/v1/namespaces/default/events")["items"]
                found = [
                    e["message"]
                    for e in events
                    if e["involvedObject"].get("name") == name and e["reason"] == "NotResizablePods"
                ]
                assert found, [e["reason"] for e in events]
                return str(found[-1])

            message = eventually(said, timeout=20, what="the NotResizablePods Event")
            assert "2 pod(s)" in message and "does not serve pods/resize" in message, message
        finally:
            aloop.run(kubelet.stop())
