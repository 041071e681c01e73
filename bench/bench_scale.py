"""Pod creation through the real API server as the number of SidecarSets grows.

One private control plane (etcd + kube-apiserver) and the real `sidecarctl run --injection=auto`.
At each stage there are 2N SidecarSets with disjoint selectors (`team: pK` and `team: wK`, the
benchmark's two-sidecar spec: a proxy with transferEnv, a log agent sharing the app's volumes):
N served by MutatingAdmissionPolicies, N annotated `sidecarctl.io/injection-path: webhook`. Each
stage adds SidecarSets to the previous one's and measures three kinds of pod, 8 clients each, in
alternating order over the rounds:

- stored: an already injected pod created in a namespace without the injection label (no mutation
  at all: what every other pod of the cluster costs);
- unselected: a raw pod in the injection-enabled namespace that no SidecarSet selects (its `team`
  has none): what the other pods of an enabled namespace cost, and as the API server matches every
  policy's selectors against every namespaced write before it looks at the resource, near what any
  other write there costs (a ConfigMap, a pod's status from its kubelet);
- policy: a raw pod that one policy-served SidecarSet selects (the webhook must not be called:
  the manager's inject counter is read before and after);
- webhook: a raw pod that one webhook-served SidecarSet selects;
- other: an unlabelled ConfigMap created in the injection-enabled namespace, standing for every
  write there that is no pod create (Events, pods' status from their kubelets): kube-apiserver
  matches every policy's namespace and object selectors against it before it looks at the resource.

Before measuring, the stage's last SidecarSets must be live: a dry-run pod of the last
policy-served one injected by its policy and of the last webhook-served one by the webhook; the
time from the last create to that is printed. While measuring, the manager is a follower (the
Lease is held elsewhere), as in bench_policy: the controller would track every injected pod and
load the 2 cores unevenly; what is measured is admission. `--profile DIR` saves a CPU profile of
kube-apiserver (its /debug/pprof) for each kind of pod at each stage, and prints its top entries;
with `--burst`, also of the burst's first two windows and its last (`apiserver-burst-<window>.pprof`).

`--shape` picks the selectors (one label, two labels, expressions, mixed: `selector`). `--burst`
then deletes every SidecarSet and creates the last stage's 2N at once, with the manager leading, and
measures in windows until every policy-served one is served by its policy (converged), and
`--settle-windows` more: unselected pods' rate against their rate just before, policy-served pods'
p99, and the CPU kube-apiserver, etcd and the manager used in the unselected window. `--change` then runs 40 s of
pods of one policy-served SidecarSet's team and another's twice, the second time with that
SidecarSet's image bumped 5 s in: pods created, p99, the slowest create and the CPU of
kube-apiserver, etcd and the manager in each window, and the size of the policy rewritten.

Printed per stage: pods/s (median of rounds), p50/p99 create latency, kube-apiserver CPU per pod,
the policies and bindings (count, bytes), the webhook's matchConditions (bytes), the manager's own
time per webhook call (its admission histogram: body received to response built) with the
connections each admission worker held after each webhook round, and how many
policy-served pods called the webhook; then the goals of the scale issue against N=1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import ssl
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.bench_policy import (
    POLICIES,
    _free_port,
    manager_cpu,
    manager_pids,
    raw_pod,
    resource_of,
    run_load,
    sidecarset,
)
from injector.policy import params
from injector.policy.generate import ANN_MEMBERS
from kuberuntime import api
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

KINDS = ("stored", "unselected", "policy", "webhook", "other")
BINDINGS = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings"
MWC = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{names.MUTATING_WEBHOOK_CONFIG}"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{names.DEFAULT_MANAGER_NAMESPACE}/leases/sidecarctl-controller"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
NAMESPACES = {"stored": "s-stored", **{kind: "s-inject" for kind in KINDS[1:]}}
# The "other" kind: a write in the injection-enabled namespace that is no pod create (a ConfigMap,
# unlabelled, as an Event is): kube-apiserver matches every policy's namespace and object selectors
# before it looks at the resource, so every Event, status update and ConfigMap there pays them.
OTHER: JsonObj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "other-"}, "data": {"k": "v"}}
# kube-apiserver's largest watch cache (k8s.io/apiserver storage/cacher: defaultUpperBoundCapacity).
WATCH_CACHE_EVENTS = 100 * 1024
PROFILER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pprof")


SHAPES = ("one", "two", "expressions", "mixed")


def selector(team: str, shape: str, k: int) -> JsonObj:
    """The selector of SidecarSet number `k` of a kind, for `team`, in one of the shapes people write:
    one label; two labels (`kind` shared by every SidecarSet of the kind); expressions (`In` of several
    values, `Exists`, `NotIn`); mixed (the three in turn)."""
    if shape == "mixed":
        shape = ("one", "two", "expressions")[k % 3]
    kind = team[0]
    if shape == "one":
        return {"matchLabels": {"team": team}}
    if shape == "two":
        return {"matchLabels": {"team": team, "kind": kind}}
    return {
        "matchExpressions": [
            {"key": "team", "operator": "In", "values": [team, f"{team}-canary", f"{team}-next"]},
            {"key": "tier", "operator": "Exists"},
            {"key": "track", "operator": "NotIn", "values": ["batch"]},
        ]
    }


def team_sidecarset(kind: str, k: int, shape: str = "one") -> JsonObj:
    """SidecarSet `scale-<kind><k>` selecting `team: <kind><k>` in `shape`; kind "w" is kept on the webhook."""
    meta = {"annotations": {names.ANN_INJECTION_PATH: "webhook"}} if kind == "w" else {}
    ss = sidecarset(f"scale-{kind}{k}", "unused", **meta)
    ss["spec"]["selector"] = selector(f"{kind}{k}", shape, k)
    return ss


def team_pod(team: str) -> JsonObj:
    """A raw pod of `team` that every shape of its SidecarSet selects (`kind`, `tier`, `track` too)."""
    pod = raw_pod("scale")
    pod["metadata"]["labels"].update(team=team, kind=team[0], tier="web", track="stable")
    return pod


@dataclass
class Figures:
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    apiserver_ms: list[float] = field(default_factory=list)
    webhook_calls: int = 0
    handler_ms: list[float] = field(default_factory=list)  # the manager's time per webhook call
    splits: list[str] = field(default_factory=list)  # connections per admission worker after a round
    paths: dict[str, int] = field(default_factory=dict)
    errors: int = 0


@dataclass
class Stage:
    n: int
    live_seconds: float
    policy_seconds: float
    policies: int
    policy_bytes: int
    bindings: int
    condition_bytes: int | None  # None: the webhook is not narrowed
    figures: dict[str, Figures]


def _scrape(url: str) -> list[str]:
    """The lines of the manager's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return list(resp.read().decode().splitlines())


def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples with these labels, from the manager's /metrics."""
    total = 0.0
    for line in _scrape(url):
        if not line.startswith(name + "{"):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def _per_worker(url: str) -> str:
    """The webhook connections each admission worker holds, from the supervisor's gauge: "5/4"."""
    counts = [
        line.rpartition(" ")[2].removesuffix(".0")
        for line in _scrape(url)
        if line.startswith("sidecarctl_webhook_worker_connections{")
    ]
    return "/".join(counts) or "-"


def _profile(cp: Any, seconds: float, out: Path, *, what: str = "profile") -> None:
    """kube-apiserver's CPU profile over the next `seconds` (or `what`="heap": its live heap after a
    collection), saved to `out` (runs in a thread)."""
    pki = cp.workdir / "pki"
    ctx = ssl.create_default_context(cafile=str(pki / "serving-ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    query = "gc=1" if what == "heap" else f"seconds={int(seconds)}"
    with urllib.request.urlopen(f"{cp.url}/debug/pprof/{what}?{query}", context=ctx, timeout=seconds + 30) as resp:
        out.write_bytes(resp.read())


def _top(profile: Path, lines: int = 25, *, options: tuple[str, ...] = ("-cum", "-focus=admission")) -> str:
    proc = subprocess.run(
        ["go", "tool", "pprof", "-top", *options, f"-nodecount={lines}", str(profile)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return proc.stdout if proc.returncode == 0 else proc.stderr


async def _create_all(c: common.Cluster, objs: list[JsonObj], *, limit: int = 16) -> None:
    async def create(obj: JsonObj) -> None:
        with contextlib.suppress(api.Conflict):
            await c.client.create(common.SS_PATH, obj)

    await common.bounded([lambda o=o: create(o) for o in objs], limit=limit)  # type: ignore[misc]


def _injected_by(c: common.Cluster, team: str) -> str | None:
    try:
        got = c.run(c.client.create("/api/v1/namespaces/s-inject/pods", team_pod(team), params={"dryRun": "All"}))
    except api.ApiError:
        return None
    return (got["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY)


def _wait_live(c: common.Cluster, n: int, since: float, timeout: float) -> tuple[float, float]:
    """Seconds from `since` until the last SidecarSet of each kind injects a dry-run pod (by either
    path: the webhook takes a policy's pods until the policy is enforced), and until the last
    policy-served one injects by its policy."""
    deadline = time.monotonic() + timeout
    live = None
    while True:
        by_p, by_w = _injected_by(c, f"p{n - 1}"), _injected_by(c, f"w{n - 1}")
        if live is None and by_p is not None and by_w is not None:
            live = time.monotonic() - since
        if live is not None and by_p == "policy":
            return live, time.monotonic() - since
        if time.monotonic() > deadline:
            raise RuntimeError(f"the SidecarSets of stage {n} were not live within {timeout:.0f} s")
        time.sleep(0.2)


def _wait_narrowed(c: common.Cluster, probe_url: str, team: str, timeout: float) -> None:
    """Until a policy-served pod no longer reaches the webhook (the manager narrows it again once
    the policies it wrote have settled: make before break), twice in a row a second apart; at
    most `timeout` seconds (a webhook that is never narrowed is what the table then shows)."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2:
        before = _metric(probe_url, "sidecarctl_admissions_total", webhook="inject")
        _injected_by(c, team)
        quiet = quiet + 1 if _metric(probe_url, "sidecarctl_admissions_total", webhook="inject") == before else 0
        if time.monotonic() > deadline:
            print(f"  policy-served pods still reach the webhook {timeout:.0f} s after the last create", flush=True)
            return
        time.sleep(1.0)


def _sizes(c: common.Cluster) -> tuple[int, int, int, int | None]:
    sel = {"labelSelector": "app.kubernetes.io/managed-by=sidecarctl"}
    policies = c.run(c.client.get(POLICIES, params=sel))["items"]
    bindings = c.run(c.client.get(BINDINGS, params=sel))["items"]
    policies = [p for p in policies if p["metadata"]["name"] != "sidecarctl-canary"]
    mwc = c.run(c.client.get(MWC))
    conditions = mwc["webhooks"][0].get("matchConditions") or []
    ours = [m for m in conditions if m.get("name") == "sidecarctl-needs-webhook"]
    cond_bytes = sum(len(m["expression"]) for m in ours) if ours else None
    return len(policies), sum(len(json.dumps(p)) for p in policies), len(bindings), cond_bytes


def _measure(
    c: common.Cluster, bodies: dict[str, JsonObj], probe_url: str, args: argparse.Namespace, n: int, *, fill: bool
) -> dict[str, Figures]:
    figures = {k: Figures() for k in KINDS}
    apiserver = c.cp.procs["kube-apiserver"].pid
    kubeconfig_path = str(c.cp.kubeconfig)
    for kind in KINDS:  # warm-up
        run_load(kubeconfig_path, NAMESPACES[kind], bodies[kind], 1.0, args.clients)
    if fill:
        # kube-apiserver's watch cache keeps the last pod events until newer ones overwrite them, in a
        # ring it doubles (up to 102,400 events) while its oldest event is under 75 s old: the first
        # stage would otherwise be measured with an emptier heap than every later one, which holds
        # the previous stages' pods (its heap profile: 94 MB before the first stage, 1 GB before a
        # second of N=1,000, 462 MB of it pods, 177 MB the compiled policies), and the garbage
        # collector's cost per pod grows with the heap. So first enough pods to fill the ring,
        # created and deleted as a stage does.
        created = 0
        while created < WATCH_CACHE_EVENTS // 2:
            result = run_load(kubeconfig_path, NAMESPACES["stored"], bodies["stored"], args.seconds, args.clients)
            created += len(result["latencies"])
            c.run(c.client.delete(f"/api/v1/namespaces/{NAMESPACES['stored']}/pods"))
    if args.profile is not None:
        _profile(c.cp, 0, args.profile / f"apiserver-n{n}-heap.pprof", what="heap")
    for r in range(args.rounds):
        for kind in KINDS if r % 2 == 0 else tuple(reversed(KINDS)):
            calls = _metric(probe_url, "sidecarctl_admissions_total", webhook="inject")
            handled = _metric(probe_url, "sidecarctl_admission_duration_seconds_sum", webhook="inject")
            before = common.process_cpu(apiserver)
            profiler: Future[None] | None = None
            if args.profile is not None and r == 0:
                out = args.profile / f"apiserver-n{n}-{kind}.pprof"
                profiler = PROFILER.submit(_profile, c.cp, args.seconds, out)
            result = run_load(kubeconfig_path, NAMESPACES[kind], bodies[kind], args.seconds, args.clients)
            if profiler is not None:
                profiler.result()
            cpu = common.process_cpu(apiserver) - before
            count = len(result["latencies"])
            f = figures[kind]
            f.rates.append(count / result["elapsed"])
            f.latencies += result["latencies"]
            f.apiserver_ms.append(1000 * cpu / max(count, 1))
            f.errors += result["error_count"]
            round_calls = int(_metric(probe_url, "sidecarctl_admissions_total", webhook="inject") - calls)
            f.webhook_calls += round_calls
            if round_calls:
                handled = _metric(probe_url, "sidecarctl_admission_duration_seconds_sum", webhook="inject") - handled
                f.handler_ms.append(1000 * handled / round_calls)
                f.splits.append(_per_worker(probe_url))
            for by, k in result["injected_by"].items():
                f.paths[by] = f.paths.get(by, 0) + k
            print(f"  N={n} round {r + 1} {kind:8} {count / result['elapsed']:6.0f} pods/s", flush=True)
            c.run(c.client.delete(f"/api/v1/namespaces/{NAMESPACES[kind]}/{resource_of(bodies[kind])}"))
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", default="1,30,100,300,1000", help="values of N, increasing")
    parser.add_argument("--rounds", type=common.positive_int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of load per kind and round")
    parser.add_argument("--clients", type=common.positive_int, default=8)
    parser.add_argument("--profile", type=Path, default=None, help="save kube-apiserver CPU and heap profiles here")
    parser.add_argument("--shape", choices=SHAPES, default="one", help="the SidecarSets' selectors (see `selector`)")
    parser.add_argument("--burst", action="store_true", help="then all 2N SidecarSets created at once (see above)")
    parser.add_argument("--change", action="store_true", help="then one image bump under load (see above)")
    parser.add_argument(
        "--settle-windows", type=int, default=2, help="burst windows measured after it converged (the steady state)"
    )
    parser.add_argument(
        "--no-stage-figures", action="store_true", help="only create each stage's SidecarSets (before --burst)"
    )
    parser.add_argument(
        "--manager-arg",
        action="append",
        default=[],
        help="a flag for the leading managers (repeat), e.g. --policy-pace=2",
    )
    args = parser.parse_args(argv)
    stages = [int(s) for s in args.stages.split(",")]
    if stages != sorted(set(stages)) or stages[0] < 1:
        parser.error("--stages: increasing positive numbers")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    common.print_machine(
        f"bench_scale: 2N SidecarSets selecting by {args.shape} label(s), N in {stages}; {args.clients} clients,"
        f" {args.rounds} rounds x {args.seconds:g} s"
    )
    from tests.kube.managerharness import MWC_PATH, VWC_PATH, start_process, wait_ready, webhook_configs, write_cert_dir

    results: list[Stage] = []
    with common.cluster() as c:
        for ns, labels in (("s-stored", {}), ("s-inject", ENABLED), (names.DEFAULT_MANAGER_NAMESPACE, {})):
            c.run(c.ensure_namespace(ns, labels))
        cert_dir = common.temp_dir("bench-scale-certs-")
        write_cert_dir(cert_dir)
        port = _free_port()
        mwc, vwc = webhook_configs(
            f"https://127.0.0.1:{port}",
            mutating=names.MUTATING_WEBHOOK_CONFIG,
            validating=names.VALIDATING_WEBHOOK_CONFIG,
        )
        c.run(c.client.create(MWC_PATH, mwc))
        c.run(c.client.create(VWC_PATH, vwc))
        have = 0
        for n in stages:
            with contextlib.suppress(api.NotFound):
                c.run(c.client.delete(LEASE))
            manager = start_process(
                c.cp, cert_dir, identity=f"scale-{n}", webhook_port=port, extra=("--log-format=text", *args.manager_arg)
            )
            try:
                wait_ready(manager, timeout=120)
                new = [team_sidecarset(kind, k, args.shape) for k in range(have, n) for kind in ("p", "w")]
                c.run(_create_all(c, new), timeout=1800)
                created = time.monotonic()
                live, by_policy = _wait_live(c, n, created, timeout=600)
                have = n
                print(
                    f"N={n}: {2 * n} SidecarSets, the last injecting {live:.1f} s after its create,"
                    f" by its policy {by_policy:.1f} s after",
                    flush=True,
                )
                _wait_narrowed(c, manager.probe_url, f"p{n // 2}", timeout=60)
                sizes = _sizes(c)
            finally:
                manager.terminate()
            if args.no_stage_figures:
                continue
            # Measured with a follower: the webhook and the policies serve, nothing reconciles.
            c.run(_hold_lease(c))
            follower = start_process(
                c.cp, cert_dir, identity=f"scale-follower-{n}", webhook_port=port, extra=("--log-format=text",)
            )
            try:
                wait_ready(follower, timeout=120)
                model = SidecarSet.from_object(team_sidecarset("p", n // 2, args.shape))
                unselected = team_pod("unselected")
                unselected["metadata"]["labels"]["kind"] = "p"  # every label but the team of a policy-served pod
                bodies = {
                    "stored": common.injected(team_pod(f"p{n // 2}"), [model], namespace="s-inject", labels=ENABLED),
                    "unselected": unselected,
                    "policy": team_pod(f"p{n // 2}"),
                    "webhook": team_pod(f"w{n // 2}"),
                    "other": OTHER,
                }
                figures = _measure(c, bodies, follower.probe_url, args, n, fill=not results)
            finally:
                follower.terminate()
            results.append(Stage(n, live, by_policy, *sizes, figures))
            _report(results[-1:], goals=False)  # each stage as it ends: a long run keeps what it measured
            if args.profile is not None:
                for kind in KINDS:
                    prof = args.profile / f"apiserver-n{n}-{kind}.pprof"
                    if prof.exists():
                        print(f"\n-- kube-apiserver CPU, N={n}, {kind} pods (top) --\n{_top(prof)}")
                heap = args.profile / f"apiserver-n{n}-heap.pprof"
                top = _top(heap, 15, options=("-sample_index=inuse_space", "-cum"))
                print(f"\n-- kube-apiserver live heap when measuring starts, N={n} (top) --\n{top}")
        if args.burst or args.change:
            _after_stages(c, args, cert_dir, port, stages[-1])
    _report(results)
    return 0


def _clear(c: common.Cluster, namespace: str) -> None:
    """Delete the pods a window created (a few thousand): while policies compile, kube-apiserver can
    take longer than a client's usual 30 s over that, which is not what is measured. kube-apiserver
    answers 504 after its own request timeout (60 s) and goes on deleting: asked again until none is left."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    deadline = time.monotonic() + 900
    while True:
        try:
            c.run(c.client.request("DELETE", path, timeout=600), timeout=660)
        except api.ApiError as e:
            if e.status != 504 or time.monotonic() > deadline:
                raise
        if not c.run(c.client.get(path, params={"limit": "1"}))["items"]:
            return


def _wait_idle(pid: int, *, below: float = 0.3, timeout: float = 120.0) -> None:
    """Until the process `pid` uses less than `below` of a core over 2 s (or `timeout` passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = common.process_cpu(pid)
        time.sleep(2.0)
        if common.process_cpu(pid) - before < 2.0 * below:
            return


def _converged(c: common.Cluster, n: int) -> int:
    """How many of the policy-served SidecarSets report PolicyInjection True."""
    items = c.run(c.client.get(common.SS_PATH))["items"]
    served = 0
    for ss in items:
        if not ss["metadata"]["name"].startswith("scale-p"):
            continue
        conditions = (ss.get("status") or {}).get("conditions") or []
        served += any(
            x.get("type") == names.CONDITION_POLICY_INJECTION and x.get("status") == "True" for x in conditions
        )
    return served


def _after_stages(c: common.Cluster, args: argparse.Namespace, cert_dir: Path, port: int, n: int) -> None:
    """The burst and the one-change stages, with a leading manager (it writes the policies)."""
    from tests.kube.managerharness import start_process, wait_ready

    with contextlib.suppress(api.NotFound):
        c.run(c.client.delete(LEASE))
    extra = ("--log-format=text", *args.manager_arg)
    leader = start_process(c.cp, cert_dir, identity="scale-leader", webhook_port=port, extra=extra)
    kubeconfig_path = str(c.cp.kubeconfig)
    unselected = team_pod("unselected")
    unselected["metadata"]["labels"]["kind"] = "p"
    try:
        wait_ready(leader, timeout=120)
        if args.burst:
            c.run(c.client.delete(common.SS_PATH), timeout=600)
            deadline = time.monotonic() + 300
            while c.run(c.client.get(common.SS_PATH))["items"] or _sizes(c)[0]:
                if time.monotonic() > deadline:
                    raise RuntimeError("the SidecarSets and their policies were not gone within 300 s")
                time.sleep(1.0)
            # The rate before: once kube-apiserver is idle again after the deletions (its collector and
            # our sync's cleanup), the median of three windows (one window right after them read 489
            # to 817 pods/s on three runs of one day).
            _wait_idle(c.cp.procs["kube-apiserver"].pid)
            before = []
            for _ in range(3):
                steady = run_load(kubeconfig_path, NAMESPACES["unselected"], unselected, args.seconds, args.clients)
                before.append(len(steady["latencies"]) / steady["elapsed"])
            steady_rate = statistics.median(before)
            print(f"unselected pods/s before the burst: {', '.join(f'{r:.0f}' for r in before)}", flush=True)
            burst = [team_sidecarset(kind, k, args.shape) for k in range(n) for kind in ("p", "w")]
            started = time.monotonic()
            c.run(_create_all(c, burst), timeout=1800)
            created = time.monotonic() - started
            print(f"burst: {2 * n} SidecarSets created in {created:.1f} s", flush=True)
            rows: list[tuple[object, ...]] = []
            rates: list[float] = []  # the unselected pods/s of each window, as measured
            converged_at = None
            after = 0  # windows measured once converged: does the rate come back, or is it the steady state?
            tree = manager_pids(leader.proc.pid)
            pids = {"kube-apiserver": c.cp.procs["kube-apiserver"].pid, "etcd": c.cp.procs["etcd"].pid}
            while after < args.settle_windows + 1 and time.monotonic() - started < 600:
                meter, manager0 = common.CpuMeter(pids), manager_cpu(tree)
                # kube-apiserver's CPU profile of the first two windows and of the last (converged).
                profiler: Future[None] | None = None
                if args.profile is not None and (len(rows) < 2 or after == args.settle_windows):
                    out = args.profile / f"apiserver-burst-{len(rows)}.pprof"
                    profiler = PROFILER.submit(_profile, c.cp, args.seconds, out)
                other = run_load(kubeconfig_path, NAMESPACES["unselected"], unselected, args.seconds, args.clients)
                used = {**meter.used(), "manager": manager_cpu(tree) - manager0}
                if profiler is not None:
                    profiler.result()
                served = run_load(
                    kubeconfig_path, NAMESPACES["policy"], team_pod(f"p{n // 2}"), args.seconds, args.clients
                )
                lat = sorted(served["latencies"])
                done = _converged(c, n)
                at = time.monotonic() - started
                rate = len(other["latencies"]) / other["elapsed"]
                rates.append(rate)
                rows.append(
                    (
                        f"{at:.0f}",
                        f"{rate:.0f} ({rate / steady_rate:.0%})",
                        f"{len(lat) / served['elapsed']:.0f}",
                        f"{1000 * common.percentile(lat, 99):.0f}",
                        dict(served["injected_by"]),
                        f"{done}/{n}",
                        " / ".join(f"{used[k]:.1f}" for k in ("kube-apiserver", "etcd", "manager")),
                    )
                )
                print("  burst", *rows[-1], flush=True)
                if done == n and converged_at is None:
                    converged_at = at
                after += converged_at is not None
            print(
                common.table(
                    (
                        "s after the burst",
                        f"unselected pods/s (of {steady_rate:.0f} before)",
                        "policy-served pods/s",
                        "p99 ms",
                        "injected by",
                        "policy-served sets converged",
                        f"CPU s in the unselected window ({args.seconds:.0f} s): kube-apiserver / etcd / manager",
                    ),
                    rows,
                )
            )
            # Deleted once, at the end: a collection delete of a window's pods took the API server a
            # minute while the policies compiled, and the windows would have been that far apart.
            _clear(c, NAMESPACES["policy"])  # the unselected pods' namespace too
            said = "not within 600 s" if converged_at is None else f"{converged_at:.0f} s after the first create"
            print(f"burst of {2 * n}: converged {said}; policies {_sizes(c)[:2]}", flush=True)
            # The windows leave their pods (tens of thousands by the end), and kube-apiserver's cost per
            # create grows with its heap: the windows after convergence show the rate without the burst.
            settled, during = rates[len(rates) - (after - 1) :], rates[: len(rates) - (after - 1)]
            if after > 1:
                low = min(during) / statistics.median(settled)
                print(f"unselected pods/s once converged: median {statistics.median(settled):.0f}; the burst's lowest"
                      f" window {min(during):.0f} ({low:.0%} of it)", flush=True)  # fmt: skip
        if args.change:
            _one_change(c, args, n, leader.proc.pid)
    finally:
        leader.terminate()


def _one_change(c: common.Cluster, args: argparse.Namespace, n: int, leader: int) -> None:
    """One policy-served SidecarSet's image bumped while pods of its team and another are created;
    the CPU of kube-apiserver, etcd and the leading manager over each window (and with `--profile`,
    kube-apiserver's CPU profile of each)."""
    team = n // 2
    name = f"scale-p{team}"

    def members(policy: JsonObj) -> list[str]:
        return str((policy["metadata"].get("annotations") or {}).get(ANN_MEMBERS, "")).replace(";", ",").split(",")

    holder = next((p for p in c.run(c.client.get(POLICIES))["items"] if name in members(p)), None)
    size = len(json.dumps(holder)) if holder else 0
    kubeconfig_path = str(c.cp.kubeconfig)
    seconds = 40.0

    def window(bump: bool, profile: Path | None) -> tuple[list[float], dict[str, float]]:
        pids = {"kube-apiserver": c.cp.procs["kube-apiserver"].pid, "etcd": c.cp.procs["etcd"].pid}
        tree = manager_pids(leader)
        meter = common.CpuMeter(pids)
        manager0 = manager_cpu(tree)
        profiler = None if profile is None else PROFILER.submit(_profile, c.cp, seconds, profile)
        with ThreadPoolExecutor(max_workers=2) as pool:
            loads = [
                pool.submit(
                    run_load, kubeconfig_path, NAMESPACES["policy"], team_pod(f"p{t}"), seconds, args.clients // 2
                )
                for t in (team, (team + 1) % n)
            ]
            time.sleep(5.0)
            if bump:
                image = "docker.io/envoyproxy/envoy:v1.30.2"
                patch = [{"op": "replace", "path": "/spec/containers/0/image", "value": image}]
                c.run(c.client.patch(f"{common.SS_PATH}/{name}", patch, patch_type="json"))
            results = [f.result() for f in loads]
        cpu = {**meter.used(), "manager": manager_cpu(tree) - manager0}
        if profiler is not None:
            profiler.result()
        _clear(c, NAMESPACES["policy"])
        return sorted(x for r in results for x in r["latencies"]), cpu

    # The same load without the bump first: the slowest create of a window on this machine with no
    # policy rewritten, so what the rewrite adds shows beside it.
    for bump, what, tag in ((False, "no change (the same load)", "steady"), (True, "one image bump", "bump")):
        profile = None if args.profile is None else args.profile / f"apiserver-n{n}-{tag}.pprof"
        lat, cpu = window(bump, profile)
        used = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items() if k != "this process")
        print(
            f"{what} at N={n}: {len(lat)} pods in {seconds:.0f} s, p99 {1000 * common.percentile(lat, 99):.0f} ms,"
            f" slowest {1000 * lat[-1]:.0f} ms; CPU s: {used}",
            flush=True,
        )
        if profile is not None:
            print(_top(profile, options=("-cum",)))
    if holder is None:
        return
    policy_name = holder["metadata"]["name"]
    after = c.run(c.client.get(f"{POLICIES}/{policy_name}"))
    rewritten = after["metadata"]["resourceVersion"] != holder["metadata"]["resourceVersion"]
    values = c.run(c.client.get(f"{params.path(names.DEFAULT_MANAGER_NAMESPACE)}/{policy_name}"))
    print(
        f"  {name}'s policy {policy_name} ({size / 1024:.0f} KiB): {'rewritten' if rewritten else 'not rewritten'};"
        f" its parameter object {len(json.dumps(values)) / 1024:.1f} KiB"
    )


async def _hold_lease(c: common.Cluster) -> None:
    import datetime

    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sidecarctl-controller", "namespace": names.DEFAULT_MANAGER_NAMESPACE},
        "spec": {
            "holderIdentity": "bench-holder",
            "leaseDurationSeconds": 86400,
            "renewTime": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    try:
        got = await c.client.get(LEASE)
    except api.NotFound:
        await c.client.create(LEASE.rsplit("/", 1)[0], lease)
        return
    got["spec"] = lease["spec"]
    await c.client.update(LEASE, got)


def _report(stages: list[Stage], *, goals: bool = True) -> None:
    if not stages:  # --no-stage-figures
        return
    rows = []
    for s in stages:
        row: list[object] = [
            s.n,
            f"{s.live_seconds:.1f} / {s.policy_seconds:.1f}",
            f"{s.policies}, {s.policy_bytes / 1024:.0f} KiB",
        ]
        row.append("none" if s.condition_bytes is None else f"{s.condition_bytes / 1024:.1f} KiB")
        for kind in KINDS:
            f = s.figures[kind]
            lat = sorted(f.latencies)
            row.append(
                f"{statistics.median(f.rates):.0f} ({1000 * common.percentile(lat, 50):.0f}/"
                f"{1000 * common.percentile(lat, 99):.0f} ms, {statistics.median(f.apiserver_ms):.1f} ms CPU)"
            )
        handler = s.figures["webhook"].handler_ms
        splits = ", ".join(s.figures["webhook"].splits)
        row.append(f"{statistics.median(handler):.2f} ({splits})" if handler else "-")
        row.append(s.figures["policy"].webhook_calls)
        row.append(sum(f.errors for f in s.figures.values()))
        rows.append(row)
    print()
    print(
        common.table(
            (
                "N",
                "live s (injected / by policy)",
                "policies",
                "webhook condition",
                "stored pods/s (p50/p99, apiserver CPU/pod)",
                "unselected",
                "policy-served",
                "webhook-served",
                "other writes (a ConfigMap) in the enabled namespace",
                "manager ms per webhook call (connections per worker)",
                "webhook calls by policy pods",
                "errors",
            ),
            rows,
        )
    )
    if not goals:
        return
    base = stages[0]

    def ratio(s: Stage, kind: str) -> float:
        return statistics.median(s.figures[kind].rates) / statistics.median(base.figures[kind].rates)

    verdicts = []
    for s in stages[1:]:
        cpu = statistics.median(s.figures["policy"].apiserver_ms) / statistics.median(
            base.figures["policy"].apiserver_ms
        )
        verdicts += [
            (
                f"N={s.n}: stored rate vs N={base.n}",
                f"{ratio(s, 'stored'):.0%}",
                common.verdict(ratio(s, "stored") >= 0.9),
            ),
            (
                f"N={s.n}: unselected pods of an enabled namespace, rate",
                f"{ratio(s, 'unselected'):.0%}",
                common.verdict(ratio(s, "unselected") >= 0.9),
            ),
            (
                f"N={s.n}: other writes (a ConfigMap) in an enabled namespace, rate",
                f"{ratio(s, 'other'):.0%}",
                common.verdict(ratio(s, "other") >= 0.9),
            ),
            (f"N={s.n}: policy-served rate", f"{ratio(s, 'policy'):.0%}", common.verdict(ratio(s, "policy") >= 0.8)),
            (f"N={s.n}: webhook-served rate", f"{ratio(s, 'webhook'):.0%}", common.verdict(ratio(s, "webhook") >= 0.8)),
            (f"N={s.n}: apiserver CPU per policy-served pod", f"{cpu:.2f}x", common.verdict(cpu <= 1.25)),
            (
                f"N={s.n}: webhook calls for policy-served pods",
                str(s.figures["policy"].webhook_calls),
                common.verdict(s.figures["policy"].webhook_calls == 0),
            ),
        ]
    verdicts.append(
        (
            f"N={stages[-1].n}: last SidecarSet live",
            f"{stages[-1].live_seconds:.1f} s",
            common.verdict(stages[-1].live_seconds <= 30),
        )
    )
    print()
    print(common.table(("goal", "measured", "met"), verdicts))


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
