"""Whether the MutatingAdmissionPolicy beta of Kubernetes 1.34 and 1.35 can serve sidecarctl's policies.

The v1 API is GA (and on) from 1.36; 1.34 and 1.35 serve `admissionregistration.k8s.io/v1beta1`
only when an administrator turns it on (`--runtime-config=admissionregistration.k8s.io/v1beta1=true`
and the `MutatingAdmissionPolicy` feature gate on every kube-apiserver). Whether the manager should
use it there is decided by this measurement: the policies generated for a set of SidecarSets (the
samples of config/samples, the benchmark's, and ones with transferEnv, shared volumes, a native
sidecar, patchPodMetadata and several on one pod) are written, in v1beta1, to kube-apiserver 1.34
and 1.35 with the beta on, and in v1 to 1.37; then the same pods are created (dry run) on each.
Printed per version: the policies the API server took (or its refusal), how long each write took,
and how many pods came out as on 1.37.

    .venv/bin/python bench/bench_policy_beta.py
"""

from __future__ import annotations

import copy
import json
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.bench_policy import raw_pod, sidecarset
from injector.policy import params
from injector.policy import plan as planning
from injector.policysync import desired
from kuberuntime import api, kubeapi, kubeconfig
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders
from tests.kube.controlplane import REPO, ControlPlane, binaries_dir
from tests.kube.loop import BackgroundLoop

BETA_FLAGS = (
    "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
    "--feature-gates=MutatingAdmissionPolicy=true",
)
NS = "beta"
MANAGER_NS = names.DEFAULT_MANAGER_NAMESPACE


def _sidecarsets() -> list[JsonObj]:
    """The SidecarSets the measurement injects: the samples, the benchmark's, and one per feature."""
    found = [
        doc
        for path in sorted((REPO / "config" / "samples").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == names.KIND
    ]
    found.append(sidecarset("bench", "bench"))
    native = builders.container("native", "native:1", restartPolicy="Always")
    found.append(builders.sidecarset("native", app="native", init_containers=[native]))
    found.append(
        builders.sidecarset(
            "patched",
            app="patched",
            patchPodMetadata=[
                {"annotations": {"example.com/retained": "yes"}, "patchPolicy": "Retain"},
                {"annotations": {"example.com/forced": "yes"}, "patchPolicy": "Overwrite"},
            ],
        )
    )
    found.append(builders.sidecarset("second", app="bench", containers=[builders.container("second", "second:1")]))
    for i, doc in enumerate(found):
        meta = doc.setdefault("metadata", {})
        meta.update(uid=str(uuid.UUID(int=i + 1)), creationTimestamp=f"2024-01-01T00:00:{i:02d}Z", generation=1)
    return found


def _pods(sets: list[JsonObj]) -> list[JsonObj]:
    """One raw pod per app a SidecarSet selects."""
    apps = sorted(
        {
            str(v)
            for s in sets
            for k, v in ((s.get("spec") or {}).get("selector") or {}).get("matchLabels", {}).items()
            if k == "app"
        }
    )
    return [raw_pod(app) for app in apps]


def _masked(pod: JsonObj) -> JsonObj:
    p: JsonObj = json.loads(json.dumps(pod))
    meta = p["metadata"]
    for key in ("uid", "creationTimestamp", "resourceVersion", "name", "managedFields", "namespace"):
        meta.pop(key, None)
    p.pop("status", None)
    text = re.sub(r"kube-api-access-[a-z0-9]{5}", "kube-api-access-X", json.dumps(p, sort_keys=True))
    masked: JsonObj = json.loads(text)
    return masked


def _apply(loop: BackgroundLoop, client: kubeapi.KubeClient, group_version: str, generated: Any) -> list[str]:
    """Write the parameter objects, policies and bindings (these in `group_version`); what each write did."""
    # No owners: nothing garbage-collects on these servers.
    policies, bindings, values = desired.objects(
        generated, stored={}, stored_params={}, models={}, clock=lambda: "2024-01-01T00:00:00Z"
    )
    said = []
    for name in policies:
        for path, obj in (
            (params.path(values[name]["metadata"]["namespace"]), values[name]),
            (f"/apis/{group_version}/mutatingadmissionpolicies", policies[name]),
            (f"/apis/{group_version}/mutatingadmissionpolicybindings", bindings[name]),
        ):
            resource = path.rsplit("/", 1)[1]
            body = copy.deepcopy(obj)
            if resource != params.PLURAL:
                body["apiVersion"] = group_version
            started = time.monotonic()
            try:
                loop.run(client.create(path, body), timeout=120)
                said.append(f"{resource} {name}: stored in {time.monotonic() - started:.2f} s")
            except api.ApiError as e:
                said.append(f"{resource} {name}: refused: {e.message[:2000]}")
    return said


def _server(version: str, flags: tuple[str, ...]) -> ControlPlane:
    return ControlPlane(bin_dir=binaries_dir(version), controller_manager=False, apiserver_flags=flags).start()


def main(argv: list[str]) -> int:
    common.print_machine(
        "bench_policy_beta: sidecarctl's policies on the MutatingAdmissionPolicy beta of 1.34 and 1.35"
    )
    sets = _sidecarsets()
    models = [SidecarSet.from_object(s) for s in sets]
    plan = planning.plan(models, mode=planning.Mode.POLICY, manager_namespace=MANAGER_NS, timestamp=desired.STAMP)
    served = sorted(m for g in plan.policies for m in g.members)
    print(f"{len(sets)} SidecarSets, {len(served)} served by {len(plan.policies)} policies: {served}")
    pods = _pods(sets)
    loop = BackgroundLoop()
    results: dict[str, dict[str, Any]] = {}
    try:
        for version, group_version, flags in (
            ("1.37", "admissionregistration.k8s.io/v1", ()),
            ("1.34", "admissionregistration.k8s.io/v1beta1", BETA_FLAGS),
            ("1.35", "admissionregistration.k8s.io/v1beta1", BETA_FLAGS),
        ):
            cp = _server(version, flags)
            client = kubeapi.KubeClient(kubeconfig.load_config(str(cp.kubeconfig)))
            try:
                for ns, labels in ((NS, {names.NS_INJECTION_LABEL: "enabled"}), (MANAGER_NS, {})):
                    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
                    loop.run(client.create("/api/v1/namespaces", body))
                # No controller-manager here: the ServiceAccount admission plugin wants `default`.
                account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
                loop.run(client.create(f"/api/v1/namespaces/{NS}/serviceaccounts", account))
                said = _apply(loop, client, group_version, plan.policies)
                time.sleep(3.0)  # the API server's next policy refresh (a 1-s tick, longer for a large policy)
                out = []
                for pod in pods:
                    try:
                        got = loop.run(client.create(f"/api/v1/namespaces/{NS}/pods", pod, params={"dryRun": "All"}))
                        out.append(_masked(got))
                    except api.ApiError as e:
                        out.append({"refused": e.message[:300]})
                results[version] = {"version": cp.version, "writes": said, "pods": out}
            finally:
                loop.run(client.close())
                cp.stop()
    finally:
        loop.close()
    ga = results["1.37"]["pods"]
    rows = []
    for version in ("1.37", "1.34", "1.35"):
        r = results[version]
        refused = [w for w in r["writes"] if "refused" in w]
        equal = sum(1 for a, b in zip(r["pods"], ga, strict=True) if a == b)
        injected = sum(
            1 for p in r["pods"] if names.ANN_INJECTED_LIST in ((p.get("metadata") or {}).get("annotations") or {})
        )
        rows.append(
            (
                r["version"],
                f"{len(r['writes']) - len(refused)}/{len(r['writes'])}",
                f"{injected}/{len(pods)}",
                f"{equal}/{len(pods)}",
            )
        )
        for line in r["writes"]:
            print(f"  {version}: {line}")
        for pod, want in zip(r["pods"], ga, strict=True):
            if pod != want:
                print(f"  {version}: differs from 1.37: {json.dumps(pod)[:400]}")
    print(common.table(("kube-apiserver", "objects stored", "pods injected", "pods as on 1.37"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
