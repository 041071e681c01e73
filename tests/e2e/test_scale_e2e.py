"""200 policy-served and 200 webhook-served SidecarSets on one API server: the policies stay few, the
webhook stays narrowed, and a pod only a policy serves never calls the webhook; with selectors of
one label (`team`) and of two (`team` and `kind`, the label every SidecarSet of a kind shares).

On a control plane of its own with `sidecarctl run --injection=auto`, as bench/bench_scale.py
measures it (the benchmark's SidecarSets: two sidecars, a transferEnv, shared volumes; disjoint
`team` selectors). Policy-served pods are compared field by field with the engine's output for the
same pod (what the webhook would have given them), so the packing of many groups into one policy
changes nothing a pod gets.
"""

from __future__ import annotations

import functools
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.bench_scale import team_pod, team_sidecarset
from injector.policy import bundle, selecting
from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH
from tests.e2e.policysupport import (
    PolicyCluster,
    policy_holding,
    private_cluster,
    stored_pod,
    webhook_condition,
    webhook_pod,
)
from tests.kube.client import eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.loop import BackgroundLoop

N = 200
NS = "scale-shop"
PLAIN = "scale-plain"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
PODS = "/api/v1/namespaces/{}/pods"
POLICIES = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"


@pytest.fixture(scope="module", params=["one", "two"])
def shape(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def count(shape: str) -> int:
    """SidecarSets per path: 200 of one label (the condition's size, the policies' count); 60 of two
    labels (one policy of 60 groups) show what tells their groups apart."""
    return N if shape == "one" else 60


@pytest.fixture(scope="module")
def cluster(aloop: BackgroundLoop, control_plane: ControlPlane, shape: str) -> Iterator[PolicyCluster]:
    with private_cluster(aloop, control_plane.bin_dir, injection="auto") as c:
        c.namespace(NS, ENABLED)
        c.namespace(PLAIN, {})
        # Eight at a time, as a GitOps tool applies a directory: one after the other took 40 s.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda obj: c.kube.create(SS_PATH, obj),
                    [team_sidecarset(k, n, shape) for n in range(count(shape)) for k in "pw"],
                )
            )
        yield c


def inject_calls(c: PolicyCluster) -> float:
    assert c.manager is not None
    with urllib.request.urlopen(c.manager.probe_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("sidecarctl_admissions_total{") and 'webhook="inject"' in line
    )


def injected_by(c: PolicyCluster, team: str) -> str | None:
    pod = c.kube.create(PODS.format(NS), team_pod(team), dryRun="All")
    return (pod["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY)


def revision_recorded(c: PolicyCluster, team: str) -> bool:
    """Whether a pod of `team` now records the revision the controller stored in its SidecarSet's status."""
    ss = c.kube.get(f"{SS_PATH}/scale-{team}")
    revision = (ss.get("status") or {}).get("latestRevision")
    pod = c.kube.create(PODS.format(NS), team_pod(team), dryRun="All")
    recorded = (pod["metadata"].get("annotations") or {}).get(names.ANN_HASH, "")
    return bool(revision) and f'"controllerRevision":"{revision}"' in recorded


def test_at_200_sidecarsets_per_path_the_webhook_stays_narrowed_and_policy_pods_never_call_it(
    cluster: PolicyCluster, shape: str
) -> None:
    c = cluster
    n = count(shape)
    eventually(
        lambda: injected_by(c, f"p{n - 1}") == "policy", timeout=120, interval=0.5, what="the last policy set live"
    )
    eventually(
        lambda: injected_by(c, f"w{n - 1}") == "webhook", timeout=60, interval=0.5, what="the last webhook set live"
    )

    def narrowed() -> bool:
        before = inject_calls(c)
        return injected_by(c, f"p{n // 2}") == "policy" and inject_calls(c) == before

    # Make before break: the webhook takes the policies' pods too until they have settled.
    eventually(narrowed, timeout=120, interval=1.0, what="policy-served pods no longer reaching the webhook")
    text = webhook_condition(c.kube)
    assert text is not None, "the webhook is narrowed"
    assert len(text) <= selecting.MAX_CONDITION_CHARS
    if shape == "one":
        assert text.count(" in l") <= 4, "one lookup per label key, not a term per SidecarSet"
    else:
        # The webhook's SidecarSets: their exact selectors stay, behind one lookup of the label that tells
        # them apart (a pod of another team stops there); the policy-served ones (a pod a policy may
        # decline): one lookup of the same label. Nothing is anchored on the `kind` they all share.
        assert text.count('("team" in l && l["team"] in [') == 2, text[:500]
        assert '("kind" in l && l["kind"] in [' not in text and '("kind" in l && l["kind"] == "p")' not in text
    stored = [
        p
        for p in c.kube.get(POLICIES, labelSelector="app.kubernetes.io/managed-by=sidecarctl")["items"]
        if p["metadata"]["name"].startswith(bundle.NAME_PREFIX)
    ]
    policies = [p["metadata"]["name"] for p in stored]
    # 200 groups of about 15 KiB, up to 1 MiB each; 60 groups fit in one
    assert (2 if shape == "one" else 1) <= len(policies) <= 5, policies
    for p in stored:
        # Each policy is skipped before any CEL for pods of other teams, whatever else they share.
        required = [
            e
            for e in p["spec"]["matchConstraints"]["objectSelector"]["matchExpressions"]
            if e["key"] != names.POD_INJECT_LABEL
        ]
        assert [e["key"] for e in required] == ["team"], (p["metadata"]["name"], required)
        candidates = next(v["expression"] for v in p["spec"]["variables"] if v["name"] == "candidates")
        assert '"kind=' not in candidates, "each group is a candidate for its own team's pods only"

    teams = [f"p{k}" for k in range(0, n, 10)]
    for team in teams:
        # A policy written before the controller recorded the SidecarSet's first revision injects
        # without `controllerRevision`, as the webhook does before its watch delivers that status;
        # the rewrite that adds it follows. Compare once it has.
        eventually(
            functools.partial(revision_recorded, c, team),
            timeout=120,  # a policy pass over 200 groups under the suite's load
            interval=0.5,
            what=f"{team}'s policy recording its revision",
        )
    before = inject_calls(c)
    for team in teams:
        pod = c.kube.create(PODS.format(NS), team_pod(team))
        assert pod["metadata"]["annotations"][names.ANN_INJECTED_BY] == "policy", team
        want = webhook_pod(c, f"scale-{team}", team_pod(team), namespace=NS, plain=PLAIN)
        assert stored_pod(pod) == want, f"{team}: the policy's pod differs from the webhook's"
    assert inject_calls(c) == before, "a policy-served pod called the webhook"
    assert {policy_holding(c.kube, f"scale-{t}") for t in teams} <= set(policies)
    for k in range(0, n, 40):
        pod = c.kube.create(PODS.format(NS), team_pod(f"w{k}"))
        assert pod["metadata"]["annotations"][names.ANN_INJECTED_BY] == "webhook"
        assert [x["name"] for x in pod["spec"]["containers"]] == ["proxy", "app", "log-agent"]
    # Each reaches the webhook (twice: the API server reinvokes it, reinvocationPolicy IfNeeded).
    assert inject_calls(c) >= before + len(range(0, n, 40))
