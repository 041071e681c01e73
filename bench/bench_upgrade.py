"""In-place upgrade throughput: the controller against a plain loop of the same pod patches.

Run: `.venv/bin/python bench/bench_upgrade.py` (about 3 minutes; `--pods N`, `--rounds R`).

A private control plane gets N injected pods (built by the real engine, reported Running and
Ready through `/status`) matched by a SidecarSet with `maxUnavailable: 100%`, and N more pods for
the baseline. Both runs use a `KubeClient` built the same way (so the same connection pool: at
most 64 requests in flight; the API server allows 1000 mutating requests in flight) and the
same patches (`planner.pod_patch`: resourceVersion and name tests, the image, the hash and
in-place-state annotations):

* plain loop: plan the upgrade of the baseline pods with the planner and send every patch at
  once through the client; seconds until the last answer;
* controller: the manager in process (no leader election, cert dir from `write_cert_dir`), the
  SidecarSet's image changed, seconds until the manager's own pod watch delivers every pod with
  the new image in its spec (counted in the informer's handler, so nothing polls). No kubelet
  runs: the pods stay as patched, so the figure is patch throughput; the time until the status
  shows every pod updated is reported too, since done-detection reads the status.

Also printed: the CPU seconds this process, kube-apiserver and etcd used in each run (which of
them is the bottleneck), and with `--profile` a cProfile of the manager's event loop thread.

The two alternate for `--rounds` rounds (default 3), each to the next image, so that the drifting
load of a shared machine hits both alike; between rollouts the pods are reported running the new
image, untimed. Target: the controller's median pods/s >= 70% of the plain loop's median.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import pstats
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from kuberuntime import kubeapi
from kuberuntime.jsontypes import JsonObj
from kuberuntime.kubeconfig import load_config
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.rollout import planner, status
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

APP, PLAIN_APP = "shop", "shop-plain"
NS, PLAIN_NS = "bench-upgrade", "bench-plain"
SS_NAME, PLAIN_SS = "mesh", "mesh-plain"


def image(version: int) -> str:
    return f"docker.io/envoyproxy/envoy:v1.30.{version}"


PROXY = "mesh-proxy"
POOL = kubeapi.POOL_SIZE  # the client's connection pool
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}


async def list_pods(client: kubeapi.KubeClient, namespace: str) -> list[JsonObj]:
    items: list[JsonObj] = []
    cont = ""
    while True:
        params: dict[str, str | int] = {"limit": 500}
        if cont:
            params["continue"] = cont
        page = await client.get(f"/api/v1/namespaces/{namespace}/pods", params=params)
        items.extend(page.get("items") or [])
        cont = str((page.get("metadata") or {}).get("continue") or "")
        if not cont:
            return items


def proxy_image(pod: JsonObj) -> str:
    return str(next(c["image"] for c in pod["spec"]["containers"] if c["name"] == PROXY))


@dataclass
class Run:
    seconds: float
    cpu: dict[str, float]
    first: float = 0.0  # controller only: change → first pod patched
    status: float | None = None  # controller only: change → status shows every pod updated
    reconciles: int = 0
    profile: str = ""


async def plain_loop(kubeconfig: str, ss: JsonObj, *, pods: int, image: str, server_pids: dict[str, int]) -> Run:
    """Plan with the planner, then send every patch at once through a fresh client."""
    client = kubeapi.KubeClient(load_config(kubeconfig))
    try:
        projections = [project(p) for p in await list_pods(client, PLAIN_NS)]
        model = SidecarSet.from_object(ss, tolerant=True)
        matched = status.matched_pods(model, projections, {PLAIN_NS: {names.NS_NAME_LABEL: PLAIN_NS}})
        plan = planner.plan_upgrade(model, matched, revision=f"{PLAIN_SS}-{image[-1]}", now=common.NOW)
        if len(plan.upgrades) != pods:
            raise RuntimeError(f"the planner chose {len(plan.upgrades)} of {pods} pods ({plan.reason})")
        # Fill the pool first (64 TLS connections), as the manager's busy client has it by now.
        await asyncio.gather(*(client.get(f"/api/v1/namespaces/{PLAIN_NS}") for _ in range(POOL)))
        cpu = common.CpuMeter(server_pids)
        t0 = time.perf_counter()
        # As many in flight as the pool holds: more would only queue for a connection, and past
        # about 6,000 patches the queued ones outlive the client's 30 s timeout.
        results = await common.bounded(
            [
                functools.partial(
                    client.patch, f"/api/v1/namespaces/{u.namespace}/pods/{u.name}", u.patch, patch_type="json"
                )
                for u in plan.upgrades
            ],
            limit=POOL,
        )
        run = Run(time.perf_counter() - t0, cpu.used())
        patched = sum(1 for r in results if proxy_image(r) == image)
        if patched != pods:
            raise RuntimeError(f"the plain loop moved {patched} of {pods} pods to {image}")
        return run
    finally:
        await client.close()


def wait_settled(c: common.Cluster, manager: Any, ss_path: str, n: int) -> None:
    """Until the manager leads, its pod watch is synced and the status counts `n` pods matched,
    updated and ready; then a second for its work queue to drain."""

    def settled() -> bool:
        if not manager.leading or not manager.pod_informer.synced.is_set():
            return False
        st = c.run(c.client.get(ss_path)).get("status") or {}
        return bool(st.get("matchedPods") == st.get("updatedPods") == st.get("readyPods") == n)

    deadline = time.monotonic() + 120
    while not settled():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the controller did not report {n} matched, updated, ready pods within 120 s")
        time.sleep(0.2)
    time.sleep(1.0)


def run_controller(
    c: common.Cluster, manager: Any, n: int, *, target: str, timeout: float, pids: dict[str, int], profile: bool
) -> Run:
    """Wait for the controller to settle, change the image, time the rollout as its own pod watch sees it."""
    ss_path = f"{common.SS_PATH}/{SS_NAME}"

    wait_settled(c, manager, ss_path, n)

    # Count upgraded pods as the manager's pod informer delivers them: O(1) per event, no polling.
    seen: set[str] = set()
    marks: dict[str, float] = {}
    all_seen = threading.Event()
    prof = cProfile.Profile()
    forward = manager.pod_informer.handler

    def handler(kind: str, old: PodProjection | None, new: PodProjection | None) -> None:
        forward(kind, old, new)
        if new is not None and new.namespace == NS and (PROXY, target) in new.containers:
            seen.add(new.name)
            marks.setdefault("first", time.perf_counter())
            if len(seen) >= n and "all" not in marks:
                marks["all"] = time.perf_counter()
                all_seen.set()

    async def instrument(on: bool) -> None:  # on the loop thread: the one to profile
        manager.pod_informer.handler = handler if on else forward
        if profile:
            prof.enable() if on else prof.disable()

    reconciles0 = manager.controller.reconciles
    print("controller: changing the SidecarSet's image ...", flush=True)
    c.run(instrument(True))
    cpu = common.CpuMeter(pids)
    t0 = time.perf_counter()
    patch = [{"op": "replace", "path": "/spec/containers/0/image", "value": target}]
    c.run(c.client.patch(ss_path, patch, patch_type="json"))
    finished = all_seen.wait(timeout)
    used = cpu.used()
    c.run(instrument(False))
    if not finished:
        raise RuntimeError(f"the controller patched {len(seen)} of {n} pods within {timeout} s")
    status_at: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = c.run(c.client.get(ss_path)).get("status") or {}
        if st.get("updatedPods") == n:
            status_at = time.perf_counter() - t0
            break
        time.sleep(0.1)
    profile_text = ""
    if profile:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        profile_text = out.getvalue()
    return Run(
        seconds=marks["all"] - t0,
        cpu=used,
        first=marks["first"] - t0,
        status=status_at,
        reconciles=manager.controller.reconciles - reconciles0,
        profile=profile_text,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=common.positive_int, default=1000, help="pods per run (default 1000)")
    parser.add_argument("--rounds", type=common.positive_int, default=3, help="plain/controller pairs (default 3)")
    parser.add_argument("--concurrency", type=common.positive_int, default=32, help="pod creates in flight")
    parser.add_argument("--timeout", type=common.positive_int, default=300, help="seconds to wait for a rollout")
    parser.add_argument("--profile", action="store_true", help="cProfile the manager's loop during the last rollout")
    args = parser.parse_args(argv)
    n = args.pods

    from tests.kube.managerharness import start_in_process, write_cert_dir

    common.print_machine(f"bench_upgrade: in-place upgrade of {n:,} pods, maxUnavailable 100%, real kube-apiserver")
    plain_runs: list[Run] = []
    ctl_runs: list[Run] = []
    with common.cluster() as c:
        for ns in (NS, PLAIN_NS, names.DEFAULT_MANAGER_NAMESPACE):
            c.run(c.ensure_namespace(ns))
        ss = c.run(c.client.create(common.SS_PATH, common.mesh_sidecarset(name=SS_NAME, app=APP, image=image(1))))
        plain_ss = common.mesh_sidecarset(name=PLAIN_SS, app=PLAIN_APP, image=image(1))  # never in the cluster
        print(f"creating {2 * n:,} injected pods and marking them Ready ...", flush=True)
        t0 = time.perf_counter()
        for ns, app, obj in ((NS, APP, ss), (PLAIN_NS, PLAIN_APP, plain_ss)):
            tpl = common.injected(
                common.deployment_pod(app=app), [SidecarSet.from_object(obj)], namespace=ns, labels=ENABLED
            )
            pods = [common.named(tpl, f"{app}-{i:05d}") for i in range(n)]
            c.run(common.create_ready_pods(c.client, pods, namespace=ns, limit=args.concurrency), timeout=1800)
        print(f"   {time.perf_counter() - t0:.1f}s", flush=True)
        pids = {name: c.cp.procs[name].pid for name in ("kube-apiserver", "etcd")}
        kubeconfig = str(c.cp.kubeconfig)
        cert_dir = common.temp_dir("sidecarctl-bench-certs-")
        write_cert_dir(cert_dir)

        # Rounds alternate a plain loop and a controller rollout to the next image, so that a drift in
        # the load of a shared machine hits both alike. Between rollouts the pods are reported running
        # the new image (what a kubelet would do), untimed, so the next rollout may start.
        for r in range(args.rounds):
            target = image(r + 2)
            print(f"round {r + 1}/{args.rounds}: plain loop ...", flush=True)
            if r:
                c.run(common.mark_ready(c.client, c.run(list_pods(c.client, PLAIN_NS)), namespace=PLAIN_NS), 600)
            ss_next = common.mesh_sidecarset(name=PLAIN_SS, app=PLAIN_APP, image=target)
            plain_runs.append(
                c.run(plain_loop(kubeconfig, ss_next, pods=n, image=target, server_pids=pids), args.timeout)
            )
            if r:
                c.run(common.mark_ready(c.client, c.run(list_pods(c.client, NS)), namespace=NS), 600)
            # A fresh manager each round: while the plain loop runs, no manager watches those pods.
            m = start_in_process(
                c.loop, c.cp, cert_dir, identity="bench-upgrade", leader_elect=False, sync_ca_bundle=False
            )
            try:
                print(f"round {r + 1}/{args.rounds}: controller ...", flush=True)
                profile = args.profile and r == args.rounds - 1
                ctl_runs.append(
                    run_controller(c, m.manager, n, target=target, timeout=args.timeout, pids=pids, profile=profile)
                )
            finally:
                m.stop()
        final_image = image(args.rounds + 1)
        on_new = sum(1 for p in c.run(list_pods(c.client, NS)) if proxy_image(p) == final_image)

    rows: list[list[object]] = []
    for r, (plain, ctl) in enumerate(zip(plain_runs, ctl_runs, strict=True)):
        ratio = plain.seconds / ctl.seconds
        rows.append(
            [
                r + 1,
                f"{plain.seconds:.2f} ({n / plain.seconds:,.0f}/s)",
                f"{ctl.seconds:.2f} ({n / ctl.seconds:,.0f}/s)",
                f"{ctl.first:.2f}",
                f"{ctl.status:.2f}" if ctl.status is not None else "timeout",
                ctl.reconciles,
                f"{ratio:.0%}",
            ]
        )
    plain_med = statistics.median(r.seconds for r in plain_runs)
    ctl_med = statistics.median(r.seconds for r in ctl_runs)
    ratio = plain_med / ctl_med
    rows.append(
        [
            "median",
            f"{plain_med:.2f} ({n / plain_med:,.0f}/s)",
            f"{ctl_med:.2f} ({n / ctl_med:,.0f}/s)",
            "",
            "",
            "",
            f"{ratio:.0%} (>= 70%: {common.verdict(ratio >= 0.70)})",
        ]
    )
    headers = ["round", "plain loop s", "controller s", "reaction s", "status done s", "reconciles", "ctl/plain"]
    print()
    print(common.table(headers, rows))
    print(
        "\ncontroller s: SidecarSet change → every pod patched (as the manager's pod watch delivers them);"
        "\nreaction s: change → first pod patched; status done s: change → status.updatedPods = pods"
    )
    print(f"pods with the last image on the API server: {on_new:,} of {n:,}")
    print("\nCPU seconds used during each run (2 cores: at most 2 s per second of the run):\n")
    procs = list(plain_runs[0].cpu)
    runs: list[tuple[str, Run]] = []
    for r in range(args.rounds):
        runs += [(f"plain {r + 1}", plain_runs[r]), (f"controller {r + 1}", ctl_runs[r])]
    cpu_rows = [[label, f"{run.seconds:.2f}", *(f"{run.cpu[k]:.2f}" for k in procs)] for label, run in runs]
    print(common.table(["run", "seconds", *procs], cpu_rows))
    if ctl_runs[-1].profile:
        print("\ncProfile of the event loop thread during the last controller run, by own time:\n")
        print(ctl_runs[-1].profile)
    return 0 if on_new == n else 1


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
