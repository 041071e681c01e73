"""Pod creation through the real API server: no mutation, a minimal policy, sidecarctl's generated
policy, and sidecarctl's webhook, side by side.

One private control plane (etcd + kube-apiserver) and the real `sidecarctl run --injection=auto`
(supervisor, control process, the default admission workers). Two SidecarSets with the same
spec (two sidecars, one with shareVolumePolicy, transferEnv by name, a volume): `bench-gen`
selects `app: gen` pods and is served by its generated MutatingAdmissionPolicy; `bench-hook`
selects `app: hook` pods and carries `sidecarctl.io/injection-path: webhook`, so the webhook
serves it. Four variants, each run by 8 concurrent clients (one child process) for a few seconds,
interleaved over several rounds:

- stored: the pod the engine injects, created in a namespace nothing mutates (the limit);
- minimal: a hand-written JSONPatch policy appending one container (what a user would write);
- flat: a policy of constants writing exactly the webhook's patch for this pod (the cost of the
  output alone, without the logic that makes it right for any pod);
- generated: the raw pod through the generated policy (the webhook is not called);
- webhook: the raw pod through /inject.

The controller is not running while the variants are measured (the manager follows a Lease held
elsewhere): it watches every injected pod, which the minimal policy's pods are not, and its status
writes would load the API server unevenly. The webhook and the stored policies are what is measured.

Printed: pods/s (median of rounds), create latency p50/p99 (all rounds), kube-apiserver and etcd
CPU per pod, the manager's CPU per pod, and the ratios the goals are stated in.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from kuberuntime import api, kubeapi, kubeconfig
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

VARIANTS = ("stored", "minimal", "flat", "generated", "webhook")
POLICIES = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
NAMESPACES = {
    "stored": "b-stored",
    "minimal": "b-minimal",
    "flat": "b-flat",
    "generated": "b-inject",
    "webhook": "b-inject",
}


def sidecarset(name: str, app: str, **meta: Any) -> JsonObj:
    """Two sidecars: a proxy with transferEnv, a log agent sharing the app's volumes; one volume."""
    return builders.sidecarset(
        name,
        app=app,
        metadata=meta,
        containers=[
            builders.container(
                "proxy",
                "docker.io/envoyproxy/envoy:v1.30.1",
                podInjectPolicy="BeforeAppContainer",
                args=["--config-path", "/etc/envoy/envoy.yaml"],
                env=[{"name": "ISTIO_META_CLUSTER_ID", "value": "Kubernetes"}],
                transferEnv=[{"sourceContainerName": "app", "envNames": ["LOG_LEVEL", "REGION"]}],
                resources={"requests": {"cpu": "50m", "memory": "64Mi"}},
                volumeMounts=[{"name": "envoy-config", "mountPath": "/etc/envoy"}],
            ),
            builders.container(
                "log-agent",
                "docker.io/fluent/fluent-bit:3.0.4",
                podInjectPolicy="AfterAppContainer",
                shareVolumePolicy={"type": "enabled"},
                resources={"requests": {"cpu": "20m", "memory": "32Mi"}},
            ),
        ],
        volumes=[{"name": "envoy-config", "configMap": {"name": "envoy"}}],
    )


def raw_pod(app: str) -> JsonObj:
    return builders.pod(
        None,
        labels={"app": app, "pod-template-hash": "7d9f8b6c5"},
        metadata={"generateName": f"{app}-"},
        containers=[
            builders.container(
                "app",
                "registry.example.com/shop/app:1.42.0",
                env=[
                    {"name": "LOG_LEVEL", "value": "info"},
                    {"name": "REGION", "value": "eu-west-1"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                ],
                volumeMounts=[{"name": "cache", "mountPath": "/var/cache/app"}],
                resources={"requests": {"cpu": "250m", "memory": "256Mi"}},
            )
        ],
        volumes=[{"name": "cache", "emptyDir": {}}],
    )


def minimal_policy(namespace: str, container: JsonObj) -> tuple[JsonObj, JsonObj]:
    """What a user writes instead: append one container to every pod in a namespace."""
    value = json.dumps(container)
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": "bench-minimal"},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ]
            },
            "mutations": [
                {
                    "patchType": "JSONPatch",
                    "jsonPatch": {
                        "expression": f'[JSONPatch{{op: "add", path: "/spec/containers/-", value: {_cel(value)}}}]'
                    },
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": "bench-minimal"},
        "spec": {
            "policyName": "bench-minimal",
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }
    return policy, binding


def flat_policy(namespace: str, patch: list[JsonObj]) -> tuple[JsonObj, JsonObj]:
    """The webhook's JSON patch for one pod as a policy of constant operations."""
    from injector.policy import cel

    ops = ", ".join(
        f"JSONPatch{{op: {cel.string(op['op'])}, path: {cel.string(op['path'])}"
        + (f", value: {cel.literal(op['value'])}" if "value" in op else "")
        + "}"
        for op in patch
    )
    policy, binding = minimal_policy(namespace, {})
    for obj in (policy, binding):
        obj["metadata"]["name"] = "bench-flat"
    binding["spec"]["policyName"] = "bench-flat"
    policy["spec"]["mutations"][0]["jsonPatch"]["expression"] = f"[{ops}]"
    return policy, binding


def _cel(json_text: str) -> str:
    """A JSON object as a CEL literal (maps and lists of dyn)."""
    from injector.policy import cel

    return cel.literal(json.loads(json_text))


# -- the load (a child process: its CPU is not the harness's) -------------------------------------
def resource_of(body: JsonObj) -> str:
    """The collection a load body is created in: pods, or the ConfigMaps that stand for other writes."""
    return "configmaps" if body.get("kind") == "ConfigMap" else "pods"


async def load(kubeconfig_path: str, namespace: str, body: JsonObj, seconds: float, clients: int) -> JsonObj:
    client = kubeapi.KubeClient(kubeconfig.load_config(kubeconfig_path))
    path = f"/api/v1/namespaces/{namespace}/{resource_of(body)}"
    latencies: list[float] = []
    errors: list[str] = []
    injected_by: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    async def one_client() -> None:
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            try:
                got = await client.create(path, body)
            except api.ApiError as e:
                errors.append(e.message[:200])
                continue
            latencies.append(time.perf_counter() - t0)
            by = (got["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY, "none")
            injected_by[by] = injected_by.get(by, 0) + 1

    start = time.monotonic()
    try:
        await asyncio.gather(*(one_client() for _ in range(clients)))
    finally:
        await client.close()
    return {
        "elapsed": time.monotonic() - start,
        "latencies": latencies,
        "errors": errors[:5],
        "error_count": len(errors),
        "injected_by": injected_by,
        "cpu": time.process_time(),
    }


def run_load(kubeconfig_path: str, namespace: str, body: JsonObj, seconds: float, clients: int) -> JsonObj:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(body, f)
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--load", kubeconfig_path, namespace, f.name, str(seconds), str(clients)],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 120,
        )
    finally:
        os.unlink(f.name)
    result: JsonObj = json.loads(out.stdout)
    return result


# -- the harness ----------------------------------------------------------------------------------
@dataclass
class Figures:
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    apiserver_ms: list[float] = field(default_factory=list)
    etcd_ms: list[float] = field(default_factory=list)
    manager_ms: list[float] = field(default_factory=list)
    paths: dict[str, int] = field(default_factory=dict)
    errors: int = 0


def manager_pids(supervisor: int) -> list[int]:
    """The supervisor and its children (the control process and the admission workers)."""
    pids = [supervisor]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == supervisor:
                    pids.append(int(entry.name))
    return pids


def manager_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += common.process_cpu(pid)
    return total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=common.positive_int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of load per variant and round")
    parser.add_argument("--clients", type=common.positive_int, default=8)
    args = parser.parse_args(argv)
    common.print_machine(
        f"bench_policy: pod creation with {args.clients} clients, {args.rounds} rounds x {args.seconds:g} s per variant"
    )
    from tests.kube.managerharness import MWC_PATH, VWC_PATH, start_process, wait_ready, webhook_configs, write_cert_dir

    with common.cluster() as c:
        for ns, labels in (
            ("b-stored", {}),
            ("b-minimal", {}),
            ("b-flat", {}),
            ("b-inject", ENABLED),
            (names.DEFAULT_MANAGER_NAMESPACE, {}),
        ):
            c.run(c.ensure_namespace(ns, labels))
        gen = sidecarset("bench-gen", "gen")
        hook = sidecarset("bench-hook", "hook", annotations={names.ANN_INJECTION_PATH: "webhook"})
        cert_dir = common.temp_dir("bench-policy-certs-")
        write_cert_dir(cert_dir)
        port = _free_port()
        mwc, vwc = webhook_configs(
            f"https://127.0.0.1:{port}",
            mutating=names.MUTATING_WEBHOOK_CONFIG,
            validating=names.VALIDATING_WEBHOOK_CONFIG,
        )
        c.run(c.client.create(MWC_PATH, mwc))
        c.run(c.client.create(VWC_PATH, vwc))
        manager = start_process(
            c.cp, cert_dir, identity="bench-policy", webhook_port=port, extra=("--log-format=text",)
        )
        try:
            wait_ready(manager, timeout=60)
            for ss in (gen, hook):
                c.run(c.client.create(common.SS_PATH, ss))
            gen_model = SidecarSet.from_object(gen)
            stored_body = common.injected(raw_pod("gen"), [gen_model], namespace="b-inject", labels=ENABLED)
            policy, binding = minimal_policy("b-minimal", gen_model.containers[1].fresh_container())
            flat, flat_binding = flat_policy(
                "b-flat", _webhook_patch(raw_pod("flat"), SidecarSet.from_object(sidecarset("bench-gen", "flat")))
            )
            for obj_path, obj in ((POLICIES, policy), (BINDINGS, binding), (POLICIES, flat), (BINDINGS, flat_binding)):
                c.run(c.client.create(obj_path, obj))
            _wait_paths(c)
            # The controller watches every injected pod; the minimal policy's pods are not injected. So
            # that each variant pays admission only, the manager comes back as a follower (a Lease held
            # elsewhere): the webhook serves, the policies and the narrowed webhook stay, nothing reconciles.
            manager.terminate()
            c.run(_hold_lease(c))
            manager = start_process(
                c.cp, cert_dir, identity="bench-follower", webhook_port=port, extra=("--log-format=text",)
            )
            wait_ready(manager, timeout=60)
            _wait_paths(c, settle=0.0)
            bodies = {
                "stored": stored_body,
                "minimal": raw_pod("min"),
                "flat": raw_pod("flat"),
                "generated": raw_pod("gen"),
                "webhook": raw_pod("hook"),
            }
            server = {name: c.cp.procs[name].pid for name in ("kube-apiserver", "etcd")}
            mpids = manager_pids(manager.proc.pid)
            figures = {v: Figures() for v in VARIANTS}
            kubeconfig_path = str(c.cp.kubeconfig)
            for variant in VARIANTS:  # warm-up
                run_load(kubeconfig_path, NAMESPACES[variant], bodies[variant], 1.0, args.clients)
            for r in range(args.rounds):
                order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    before, mbefore = {n: common.process_cpu(p) for n, p in server.items()}, manager_cpu(mpids)
                    result = run_load(kubeconfig_path, NAMESPACES[variant], bodies[variant], args.seconds, args.clients)
                    after, mafter = {n: common.process_cpu(p) for n, p in server.items()}, manager_cpu(mpids)
                    n = len(result["latencies"])
                    f = figures[variant]
                    f.rates.append(n / result["elapsed"])
                    f.latencies += result["latencies"]
                    f.apiserver_ms.append(1000 * (after["kube-apiserver"] - before["kube-apiserver"]) / max(n, 1))
                    f.etcd_ms.append(1000 * (after["etcd"] - before["etcd"]) / max(n, 1))
                    f.manager_ms.append(1000 * (mafter - mbefore) / max(n, 1))
                    f.errors += result["error_count"]
                    for by, count in result["injected_by"].items():
                        f.paths[by] = f.paths.get(by, 0) + count
                    print(
                        f"  round {r + 1} {variant:9} {n / result['elapsed']:7.0f} pods/s",
                        f"errors {result['error_count']}",
                        flush=True,
                    )
                    c.run(_clear(c, NAMESPACES[variant]))
        finally:
            manager.terminate()
    _report(figures)
    return 0


def _webhook_patch(pod: JsonObj, ss: SidecarSet) -> list[JsonObj]:
    """The engine's patch for `pod` as the API server hands it over (the service account's token
    volume is added before any mutation; the flat policy sees the same)."""
    from injector.engine import engine

    seen = copy.deepcopy(pod)
    seen["spec"].setdefault("volumes", [])
    result = engine.inject(seen, namespace="b-flat", namespace_labels=ENABLED, sidecarsets=[ss], now=common.NOW)
    if not result.patch:
        raise RuntimeError(f"the engine did not inject the flat variant's pod: {result.skipped}")
    return list(result.patch)


def _free_port() -> int:
    from tests.kube.controlplane import free_port

    return free_port()


async def _hold_lease(c: common.Cluster) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{names.DEFAULT_MANAGER_NAMESPACE}/leases/sidecarctl-controller"
    lease = await c.client.get(path)
    lease["spec"].update(
        holderIdentity="bench-holder",
        leaseDurationSeconds=86400,
        renewTime=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    )
    await c.client.update(path, lease)


def _wait_paths(c: common.Cluster, settle: float = 4.0) -> None:
    """Until the generated policy injects `app: gen` pods, the webhook `app: hook` ones, the minimal
    policy its own, and the webhook is narrowed (the manager's settle time of 2 s, then its canary
    barrier, about a second more)."""
    deadline = time.monotonic() + 60
    wants = (("b-inject", "gen", "policy"), ("b-inject", "hook", "webhook"))
    while True:
        got = []
        for ns, app, _ in wants:
            p = c.run(c.client.create(f"/api/v1/namespaces/{ns}/pods", raw_pod(app), params={"dryRun": "All"}))
            got.append((p["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY))
        m = c.run(c.client.create("/api/v1/namespaces/b-minimal/pods", raw_pod("min"), params={"dryRun": "All"}))
        f = c.run(c.client.create("/api/v1/namespaces/b-flat/pods", raw_pod("flat"), params={"dryRun": "All"}))
        if got == [w for _, _, w in wants] and len(m["spec"]["containers"]) == 2 and len(f["spec"]["containers"]) == 3:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the injection paths did not come up: {got}")
        time.sleep(0.2)
    time.sleep(settle)


async def _clear(c: common.Cluster, namespace: str) -> None:
    """Delete the round's pods (unbound pods go at once) so etcd does not grow across rounds."""
    await c.client.delete(f"/api/v1/namespaces/{namespace}/pods")


def _report(figures: dict[str, Figures]) -> None:
    rows = []
    medians = {v: statistics.median(f.rates) for v, f in figures.items()}
    for v, f in figures.items():
        lat = sorted(f.latencies)
        rows.append(
            (
                v,
                f"{medians[v]:.0f}",
                f"{min(f.rates):.0f}-{max(f.rates):.0f}",
                f"{1000 * common.percentile(lat, 50):.1f}",
                f"{1000 * common.percentile(lat, 99):.1f}",
                f"{statistics.median(f.apiserver_ms):.2f}",
                f"{statistics.median(f.etcd_ms):.2f}",
                f"{statistics.median(f.manager_ms):.2f}",
                " ".join(f"{k}:{n}" for k, n in sorted(f.paths.items())),
                str(f.errors),
            )
        )
    print()
    print(
        common.table(
            (
                "variant",
                "pods/s",
                "range",
                "p50 ms",
                "p99 ms",
                "apiserver CPU ms/pod",
                "etcd ms/pod",
                "manager ms/pod",
                "injected-by",
                "errors",
            ),
            rows,
        )
    )
    gen_min = medians["generated"] / medians["minimal"]
    gen_hook = medians["generated"] / medians["webhook"]
    print()
    print(
        common.table(
            ("goal", "measured", "met"),
            [
                (
                    "generated >= 90% of the minimal policy's rate",
                    f"{100 * gen_min:.0f}%",
                    common.verdict(gen_min >= 0.9),
                ),
                ("generated >= 1.8x the webhook's rate", f"{gen_hook:.2f}x", common.verdict(gen_hook >= 1.8)),
                ("minimal policy / stored", f"{100 * medians['minimal'] / medians['stored']:.0f}%", "-"),
                ("webhook / stored", f"{100 * medians['webhook'] / medians['stored']:.0f}%", "-"),
            ],
        )
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        _, _, kc, ns, body_file, secs, n = sys.argv
        result = asyncio.run(load(kc, ns, json.loads(Path(body_file).read_text()), float(secs), int(n)))
        print(json.dumps(result))
        sys.exit(0)
    sys.exit(common.run_main(main, sys.argv[1:]))
