"""Differential tier: every pod x SidecarSet case through the webhook and through the policies.

Two control planes of their own, each with the real `sidecarctl run`: one in `--injection=webhook`
(every pod through /inject), one in `--injection=policy` (pods injected by the
MutatingAdmissionPolicies the manager generates; the webhook only for what a policy declines).
Each case's namespaces and SidecarSets are created in both, its pods are created for real in both,
and the stored pods must be equal field by field apart from name, uid, timestamps and
`injected-by` (tests.e2e.policysupport.stored_pod). Both clusters run the neighbours of
tests/kube/neighbours.py on every pod: a digest pinner called before sidecarctl's webhook (CREATE
and UPDATE, re-invoked) and a second injector after it, as a real cluster would, so the two paths
are compared as they behave among other admission steps, not alone (a second injector called
*before* sidecarctl's webhook is not compared: the API server runs policies before every webhook,
so the paths place its containers differently, as the README says). The corpus: every golden case with a pod
(tests/golden, workload templates as the pods their controllers would create), the samples of
config/samples, the benchmark's SidecarSets and pod, and the cases of tests/policy_corpus. Pods that
ask for per-pod overrides are declined by the policies: the webhook serves them on both paths.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from bench import common as bench_common
from injector.policysync.support import POLICIES
from kuberuntime import api
from sidecarsets.spec import names
from sidecarsets.spec.model import object_key
from tests import golden_cases
from tests.e2e.policysupport import PolicyCluster, private_clusters, stored_pod
from tests.kube.client import eventually
from tests.kube.controlplane import REPO, ControlPlane
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import VWC_PATH
from tests.kube.neighbours import FOREIGN_INIT, FOREIGN_SIDECAR, digest_pinning_app, neighbour, second_injector_app

SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"
CORPUS = Path(__file__).resolve().parents[1] / "policy_corpus"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}


@dataclass
class Case:
    name: str
    sidecarsets: list[dict[str, Any]]
    namespaces: dict[str, dict[str, str]]
    pods: list[dict[str, Any]]
    unvalidated: bool = False  # created with validation bypassed (the case shows what happens anyway)
    # Labels given to namespaces once the SidecarSets are stored (a namespace that turned
    # NamespacedSidecarSets off after they were written: admission would refuse them before).
    relabelled: dict[str, dict[str, str]] = field(default_factory=dict)


def _pods_of(doc: Any) -> list[dict[str, Any]]:
    if not isinstance(doc, dict):
        return []
    if doc.get("kind") == "Pod":
        return [copy.deepcopy(doc)]
    if doc.get("kind") == "List":
        return [p for item in doc.get("items") or [] for p in _pods_of(item)]
    spec = doc.get("spec") or {}
    template = spec.get("template") or ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template")
    if doc.get("kind") not in WORKLOADS or not template:
        return []
    meta = copy.deepcopy(template.get("metadata") or {})
    meta["name"] = f"{doc['metadata']['name']}-x"
    meta["namespace"] = doc["metadata"].get("namespace", "default")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(template["spec"])}
    if doc["kind"] in ("Job", "CronJob"):
        pod["spec"].setdefault("restartPolicy", "Never")
    return [pod]


def _namespaces(pods: list[dict[str, Any]], given: dict[str, dict[str, str]], *, label: bool) -> dict[str, Any]:
    out = {ns: dict(labels) for ns, labels in given.items()}
    for pod in pods:
        out.setdefault(pod["metadata"].get("namespace") or "default", {})
    if label:
        out = {ns: {**labels, **ENABLED} for ns, labels in out.items()}
    return out


def _golden() -> list[Case]:
    out = []
    for case in golden_cases.cases():
        pods = [p for doc in case.input_docs for p in _pods_of(doc)]
        if not pods:
            continue
        namespaces = _namespaces(pods, case.namespace_labels, label=case.name != "unlabelled-namespace")
        out.append(Case(case.name, case.sidecarsets, namespaces, pods, "--no-validate" in case.args))
    return out


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _corpus() -> list[Case]:
    out = []
    for d in sorted(p for p in CORPUS.iterdir() if p.is_dir()):
        pods = [p for doc in _docs(d / "input.yaml") for p in _pods_of(doc)]
        later = yaml.safe_load((d / "relabelled.yaml").read_text()) if (d / "relabelled.yaml").exists() else {}
        namespaces = _namespaces(pods, {}, label=True)
        out.append(Case(f"corpus/{d.name}", _docs(d / "sidecarsets.yaml"), namespaces, pods, relabelled=later))
    samples = REPO / "config" / "samples"
    sample_sets = [
        d for f in ("03-mesh-proxy-sidecarset.yaml", "04-log-agent-sidecarset.yaml") for d in _docs(samples / f)
    ]
    demo = [p for doc in _docs(samples / "05-demo-deployment.yaml") for p in _pods_of(doc)]
    variants = []
    changes: tuple[dict[str, str | None], ...] = ({"log-collection": "disabled"}, {"app.kubernetes.io/name": None}, {})
    for i, labels in enumerate(changes):
        pod = copy.deepcopy(demo[0])
        pod["metadata"]["name"] = f"shop-{i}"
        for k, v in labels.items():
            if v is None:
                pod["metadata"]["labels"].pop(k, None)
            else:
                pod["metadata"]["labels"][k] = v
        variants.append(pod)
    out.append(Case("samples/mesh-proxy+log-agent", sample_sets, _namespaces(variants, {}, label=True), variants))
    bench_pod = bench_common.deployment_pod(name="shop-bench")
    bench_pod["metadata"]["namespace"] = "bench-shop"
    bench_pod["spec"]["volumes"] = [v for v in bench_pod["spec"]["volumes"] if not v["name"].startswith("kube-api")]
    for c in bench_pod["spec"]["containers"]:
        c["volumeMounts"] = [m for m in c["volumeMounts"] if not m["name"].startswith("kube-api")]
    out.append(
        Case(
            "bench/three-sidecarsets",
            bench_common.three_sidecarsets(),
            _namespaces([bench_pod], {}, label=True),
            [bench_pod],
        )
    )
    return out


CASES = _golden() + _corpus()
if os.environ.get("SIDECARCTL_POLICY_CASES"):  # a subset, by name, when looking into one
    CASES = [c for c in CASES if c.name in os.environ["SIDECARCTL_POLICY_CASES"].split(",")]


# ---------------------------------------------------------------------------------------------


@dataclass
class Paths:
    webhook: PolicyCluster
    policy: PolicyCluster

    @property
    def both(self) -> tuple[PolicyCluster, PolicyCluster]:
        return self.webhook, self.policy


# Every namespace a case creates (the API server's own are left alone, as real neighbours do).
UNNEIGHBOURED = ["kube-system", "kube-public"]
NEIGHBOURED = {
    "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": UNNEIGHBOURED}]
}
PROBE_NS = "neighbours-probe"


def _neighbours(stack: contextlib.ExitStack, aloop: BackgroundLoop, cluster: PolicyCluster) -> None:
    cluster.namespace(PROBE_NS, {})
    probe = functools.partial(
        cluster.kube.create,
        f"/api/v1/namespaces/{PROBE_NS}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe"},
            "spec": {"containers": [{"name": "a", "image": "a:1"}]},
        },
        dryRun="All",
    )
    for app, config, operations, called in (
        (
            digest_pinning_app(),
            "aa-neighbour-digest",
            ("CREATE", "UPDATE"),
            lambda p: "@" in p["spec"]["containers"][0]["image"],
        ),
        (second_injector_app(), "zz-neighbour-injector", ("CREATE",), lambda p: len(p["spec"]["containers"]) == 2),
    ):
        stack.enter_context(
            neighbour(
                aloop,
                cluster.kube,
                app,
                config_name=config,
                namespace_selector=NEIGHBOURED,
                operations=operations,
                probe=probe,
                called=called,
            )
        )


# Cases run on PAIRS pairs of clusters side by side, each pair taking every PAIRS-th case: most of a
# case is waiting (its first revision, the policies enforced on kube-apiserver's one-second refresh,
# their deletion), so two pairs take about 60 % of one pair's time on this 2-core machine. A case
# never shares a pair with another while it runs: its SidecarSets select other cases' pods.
PAIRS = 2


@pytest.fixture(scope="module")
def pairs(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[list[Paths]]:
    injections = ("webhook", "policy") * PAIRS
    with (
        # Each case's SidecarSets are written together and the policies compared once enforced:
        # no burst to wait out (the quiet time has its unit tests), so written at once.
        private_clusters(aloop, control_plane.bin_dir, *injections, extra=("--policy-quiet=0",)) as clusters,
        contextlib.ExitStack() as stack,
    ):
        for cluster in clusters:
            _neighbours(stack, aloop, cluster)
        yield [Paths(clusters[i], clusters[i + 1]) for i in range(0, len(clusters), 2)]


def _neighboured(pod: dict[str, Any]) -> str | None:
    """What is wrong with a stored pod as the neighbours left it (their mutation missing or doubled)."""
    spec = pod["spec"]
    inits = [c["name"] for c in spec.get("initContainers") or []]
    containers = [c["name"] for c in spec["containers"]]
    if inits.count(FOREIGN_INIT) != 1 or containers.count(FOREIGN_SIDECAR) != 1 or containers[-1] != FOREIGN_SIDECAR:
        return f"the second injector's containers are not there once, last: {inits} {containers}"
    unpinned = [
        c.get("image")
        for c in spec["containers"] + (spec.get("initContainers") or [])
        if "@" not in c.get("image", "@")
    ]
    return f"images left unpinned: {unpinned}" if unpinned else None


@contextlib.contextmanager
def _unvalidated(cluster: PolicyCluster, skip: bool) -> Iterator[None]:
    """The SidecarSet webhook out of the way, for the cases that show what happens without it."""
    if not skip:
        yield
        return
    path = f"{VWC_PATH}/{names.VALIDATING_WEBHOOK_CONFIG}"
    saved = cluster.kube.get(path)
    cluster.kube.delete(path)
    time.sleep(0.3)
    try:
        yield
    finally:
        meta = {k: v for k, v in saved["metadata"].items() if k in ("name", "labels", "annotations")}
        cluster.kube.create(VWC_PATH, {**saved, "metadata": meta})


def _sidecarset(doc: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in doc["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
    if doc.get("kind") == names.NAMESPACED_KIND:
        return {
            "apiVersion": names.API_VERSION_V1BETA1,
            "kind": names.NAMESPACED_KIND,
            "metadata": meta,
            "spec": doc["spec"],
        }
    meta.pop("namespace", None)
    return {"apiVersion": f"{names.GROUP}/{names.VERSION}", "kind": names.KIND, "metadata": meta, "spec": doc["spec"]}


def _path(doc: dict[str, Any], *, named: bool = True) -> str:
    """Where a case's SidecarSet (or NamespacedSidecarSet) is stored; the collection without `named`."""
    meta = doc["metadata"]
    base = SS_PATH
    if doc.get("kind") == names.NAMESPACED_KIND:
        base = f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/namespaces/{meta['namespace']}/{names.NAMESPACED_PLURAL}"
    return f"{base}/{meta['name']}" if named else base


def _apply_sidecarsets(paths: Paths, case: Case) -> dict[str, str]:
    """Create the case's SidecarSets in both clusters, oldest first; returns the ones the policy-mode
    manager refused, with its message.

    Both paths order SidecarSets by creation time (whole seconds), then by name. When the case's
    order is also their names' order, creating them within one second gives that order; otherwise
    they are created a second apart."""
    refused: dict[str, str] = {}
    ordered = sorted(
        enumerate(case.sidecarsets), key=lambda t: (str(t[1]["metadata"].get("creationTimestamp") or ""), t[0])
    )
    by_name = [object_key(doc) for _, doc in ordered]
    apart = by_name != sorted(by_name)
    for i, (_, doc) in enumerate(ordered):
        if i and apart:
            time.sleep(1.05)
        for cluster in paths.both:
            with _unvalidated(cluster, case.unvalidated):
                try:
                    cluster.kube.create(_path(doc, named=False), _sidecarset(doc))
                except api.ApiError as e:
                    if cluster is paths.webhook:
                        raise
                    refused[object_key(doc)] = e.message
    return refused


def _wait_revisions(paths: Paths, case: Case, refused: dict[str, str]) -> None:
    """Until each SidecarSet has its first revision: both paths then record it in the pods."""
    for cluster in paths.both:
        for doc in case.sidecarsets:
            if cluster is paths.policy and object_key(doc) in refused:
                continue
            eventually(
                functools.partial(_revision, cluster, _path(doc)), timeout=20, what=f"{object_key(doc)} has a revision"
            )


def _revision(cluster: PolicyCluster, path: str) -> str | None:
    status = cluster.kube.get(path).get("status") or {}
    return status.get("latestRevision")


def _delete_sidecarsets(paths: Paths, case: Case) -> None:
    for cluster in paths.both:
        for doc in case.sidecarsets:
            with contextlib.suppress(api.NotFound):
                cluster.kube.delete(_path(doc))

    def policies_gone() -> bool:
        items = paths.policy.kube.get(POLICIES)["items"]
        return all(p["metadata"]["name"] == "sidecarctl-canary" for p in items)

    eventually(policies_gone, timeout=20, what="the case's policies deleted")


def _pod_for(case_index: int, pod: dict[str, Any], j: int) -> dict[str, Any]:
    p = copy.deepcopy(pod)
    meta = p["metadata"]
    meta.pop("namespace", None)
    if meta.get("name"):
        meta["name"] = f"{meta['name']}-c{case_index}-{j}"[:63].rstrip("-")
    elif not meta.get("generateName"):
        meta["name"] = f"pod-c{case_index}-{j}"
    return p


def _create(cluster: PolicyCluster, ns: str, pod: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
    params = {"dryRun": "All"} if dry_run else {}
    return cluster.kube.create(f"/api/v1/namespaces/{ns}/pods", pod, **params)


def _injected(pod: dict[str, Any]) -> bool:
    return names.ANN_INJECTED_LIST in (pod["metadata"].get("annotations") or {})


@dataclass
class Tally:
    """What the cases of one pair found, merged at the end."""

    report: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("cases", "pods", "equal", "injected", "by policy", "by webhook", "refused", "overrides"), 0
        )
    )


def _run_cases(paths: Paths, cases: list[tuple[int, Case]]) -> Tally:
    """The cases one after the other on one pair of clusters (`overrides` counts pods asking for
    per-pod overrides: equal, and the webhook's on both paths)."""
    tally = Tally()
    counts, report = tally.counts, tally.report
    for ci, case in cases:
        counts["cases"] += 1
        for cluster in paths.both:
            for ns, labels in case.namespaces.items():
                cluster.namespace(ns, labels)
        refused = _apply_sidecarsets(paths, case)
        for cluster in paths.both:
            for ns, labels in case.relabelled.items():
                cluster.namespace(ns, {**case.namespaces.get(ns, {}), **labels})
        try:
            _wait_revisions(paths, case, refused)
            if refused:
                counts["refused"] += 1
                report.append(f"{case.name}: refused in policy mode: {refused}")
                continue
            _compare_case(paths, ci, case, counts, report, tally.failures)
        finally:
            _delete_sidecarsets(paths, case)
    return tally


def test_every_case_gives_the_same_pod_through_the_webhook_and_through_policies(pairs: list[Paths]) -> None:
    numbered = list(enumerate(CASES))
    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        tallies = list(pool.map(_run_cases, pairs, [numbered[i :: len(pairs)] for i in range(len(pairs))]))
    counts = {k: sum(t.counts.get(k, 0) for t in tallies) for t in tallies for k in t.counts}
    report = [line for t in tallies for line in t.report]
    failures = [f for t in tallies for f in t.failures]
    summary = ", ".join(f"{k} {v}" for k, v in counts.items())
    print("\n" + "\n".join(sorted(report)) + f"\n{summary}")
    assert counts["cases"] == len(CASES), summary
    assert not failures, "\n\n".join(failures)
    assert counts["pods"] >= 45 and counts["by policy"] >= 35, summary
    assert counts["overrides"] >= 5, summary


def _compare_case(
    paths: Paths, ci: int, case: Case, counts: dict[str, int], report: list[str], failures: list[str]
) -> None:
    # The webhooks' SidecarSet stores and namespace caches (a case may relabel a namespace an
    # earlier one made; the namespaces were written before the SidecarSets) and the API server's.
    time.sleep(0.3)
    pods = [(p["metadata"].get("namespace") or "default", _pod_for(ci, p, j)) for j, p in enumerate(case.pods)]
    through_webhook = [_create(paths.webhook, ns, p) for ns, p in pods]

    # Policies are enforced about a second after they are stored, and the webhook takes their pods
    # until then: dry-run until the policy injects each pod the webhook injected (a pod the policy
    # declines stays with the webhook: the wait ends), or, for a case that injects nothing, wait a
    # full refresh interval.
    def caught_up() -> bool:
        for (ns, p), want in zip(pods, through_webhook, strict=True):
            got = _create(paths.policy, ns, p, dry_run=True)
            by = (got["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY)
            if _injected(want) and (by != names.INJECTED_BY_POLICY or stored_pod(got) != stored_pod(want)):
                return False
        return True

    with contextlib.suppress(AssertionError):
        eventually(caught_up, timeout=8, interval=0.1, what="the policies enforced")
    if not any(_injected(w) for w in through_webhook):
        time.sleep(1.3)
    for (ns, p), want in zip(pods, through_webhook, strict=True):
        counts["pods"] += 1
        got = _create(paths.policy, ns, p)
        a, b = stored_pod(want), stored_pod(got)
        by = (got["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY, "-")
        label = f"{case.name} {ns}/{p['metadata'].get('name') or p['metadata'].get('generateName')}"
        if a != b:
            diff = jsonpatch.make_patch(a, b).patch
            failures.append(f"{label} (injected by {by}): the policy path differs from the webhook: {diff}")
            continue
        for path, stored in (("webhook", want), ("policy", got)):
            if ns in UNNEIGHBOURED:
                continue
            if (wrong := _neighboured(stored)) is not None:
                failures.append(f"{label} on the {path} path: {wrong}")
        counts["equal"] += 1
        if _injected(got):
            counts["injected"] += 1
            counts[f"by {by}"] = counts.get(f"by {by}", 0) + 1
            if names.ANN_OVERRIDES in (p["metadata"].get("annotations") or {}):
                if by != names.INJECTED_BY_WEBHOOK:
                    failures.append(f"{label}: asks for overrides, so the policy must leave it to the webhook")
                counts["overrides"] += 1
        report.append(f"{label}: equal, {'injected by ' + by if _injected(got) else 'not injected'}")
