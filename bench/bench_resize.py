"""In-place resize throughput: the controller against a plain loop of the same writes.

Run: `.venv/bin/python bench/bench_resize.py` (about 3 minutes; `--pods N`, `--rounds R`).

As bench_upgrade.py, on a private control plane with N injected pods per run (the benchmark's
mesh SidecarSet, `maxUnavailable: 100%`), but each round raises the proxy's CPU request instead of
changing its image. A pod takes two writes, the controller's own (sidecarsets.rollout.resize and
planner): the `pods/resize` JSON patch, then the patch recording the new hashes, which tests the
resourceVersion the resize returned and writes the without-image hash read from the resized pod.

* plain loop: plan with the planner, then for every pod at once send its two writes, one after
  the other; seconds until the last answer;
* controller: the manager in process, the SidecarSet changed, seconds until its own pod watch
  delivers every pod recording the new hash (the second write; the first precedes it).

No kubelet runs: between rounds, untimed, the pods are reported running with the values they were
resized to, as a kubelet would report them; the figure is write throughput. Rounds alternate the
two, each to the next CPU value, so that the drifting load of a shared machine hits both alike.
Target: the controller's median pods/s >= 90% of the plain loop's median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.bench_upgrade import Run, list_pods, wait_settled
from kuberuntime import kubeapi
from kuberuntime.jsontypes import JsonObj
from kuberuntime.kubeconfig import load_config
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.rollout import planner, resize, status
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

APP, PLAIN_APP = "shop", "shop-plain"
NS, PLAIN_NS = "bench-resize", "bench-resize-plain"
SS_NAME, PLAIN_SS = "mesh", "mesh-plain"
PROXY = "mesh-proxy"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}


def cpu(round_: int) -> str:
    return f"{100 + 50 * round_}m"


def sidecarset(name: str, app: str, round_: int) -> JsonObj:
    ss = common.mesh_sidecarset(name=name, app=app)
    ss["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu(round_)
    return ss


async def _resize_one(client: kubeapi.KubeClient, u: planner.PodUpgrade) -> JsonObj:
    """The controller's two writes for one pod (sidecarsets.controller.podwrites), in order."""
    path = f"/api/v1/namespaces/{u.namespace}/pods/{u.name}"
    resized: JsonObj = await client.patch(f"{path}/resize", list(u.resize), patch_type="json")
    meta = resized["metadata"]
    entry = resize.resize_record(u, meta["annotations"].get(names.ANN_HASH_WITHOUT_IMAGE), now=common.NOW)
    patch = [{**u.patch[0], "value": meta["resourceVersion"]}, *u.patch[1:], entry]
    result: JsonObj = await client.patch(path, patch, patch_type="json")
    return result


async def plain_loop(kubeconfig: str, round_: int, *, pods: int, server_pids: dict[str, int]) -> Run:
    client = kubeapi.KubeClient(load_config(kubeconfig))
    try:
        projections = [project(p) for p in await list_pods(client, PLAIN_NS)]
        model = SidecarSet.from_object(sidecarset(PLAIN_SS, PLAIN_APP, round_), tolerant=True)
        before = sidecarset(PLAIN_SS, PLAIN_APP, round_ - 1)["spec"]
        matched = status.matched_pods(model, projections, {PLAIN_NS: {names.NS_NAME_LABEL: PLAIN_NS}})
        plan = planner.plan_upgrade(
            model, matched, revision="r", now=common.NOW, resizable=resize.resizable_hashes(model, [before])
        )
        if len(plan.upgrades) != pods or not all(u.resize for u in plan.upgrades):
            raise RuntimeError(f"the planner chose {len(plan.upgrades)} resizes of {pods} pods ({plan.reason})")
        await asyncio.gather(*(client.get(f"/api/v1/namespaces/{PLAIN_NS}") for _ in range(64)))
        meter = common.CpuMeter(server_pids)
        t0 = time.perf_counter()
        await asyncio.gather(*(_resize_one(client, u) for u in plan.upgrades))
        return Run(time.perf_counter() - t0, meter.used())
    finally:
        await client.close()


def run_controller(
    c: common.Cluster, manager: Any, n: int, round_: int, *, timeout: float, pids: dict[str, int]
) -> Run:
    ss_path = f"{common.SS_PATH}/{SS_NAME}"

    wait_settled(c, manager, ss_path, n)
    target = SidecarSet.from_object(sidecarset(SS_NAME, APP, round_), tolerant=True).hash
    seen: set[str] = set()
    marks: dict[str, float] = {}
    done = threading.Event()
    forward = manager.pod_informer.handler

    def handler(kind: str, old: PodProjection | None, new: PodProjection | None) -> None:
        forward(kind, old, new)
        entry = None if new is None or new.namespace != NS else new.hash_for(SS_NAME)
        if entry is not None and entry.hash == target:
            seen.add(new.name)  # type: ignore[union-attr]
            marks.setdefault("first", time.perf_counter())
            if len(seen) >= n and "all" not in marks:
                marks["all"] = time.perf_counter()
                done.set()

    async def instrument(on: bool) -> None:
        manager.pod_informer.handler = handler if on else forward

    c.run(instrument(True))
    meter = common.CpuMeter(pids)
    t0 = time.perf_counter()
    ops = [{"op": "replace", "path": "/spec/containers/0/resources/requests/cpu", "value": cpu(round_)}]
    c.run(c.client.patch(ss_path, ops, patch_type="json"))
    finished = done.wait(timeout)
    used = meter.used()
    c.run(instrument(False))
    if not finished:
        raise RuntimeError(f"the controller resized {len(seen)} of {n} pods within {timeout} s")
    return Run(seconds=marks["all"] - t0, cpu=used, first=marks["first"] - t0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=common.positive_int, default=1000, help="pods per run (default 1000)")
    parser.add_argument("--rounds", type=common.positive_int, default=3, help="plain/controller pairs (default 3)")
    parser.add_argument("--timeout", type=common.positive_int, default=300, help="seconds to wait for a rollout")
    args = parser.parse_args(argv)
    n = args.pods

    from tests.kube.managerharness import start_in_process, write_cert_dir

    common.print_machine(f"bench_resize: in-place resize of {n:,} pods, maxUnavailable 100%, real kube-apiserver")
    plain_runs: list[Run] = []
    ctl_runs: list[Run] = []
    with common.cluster() as c:
        for ns in (NS, PLAIN_NS, names.DEFAULT_MANAGER_NAMESPACE):
            c.run(c.ensure_namespace(ns))
        ss = c.run(c.client.create(common.SS_PATH, sidecarset(SS_NAME, APP, 0)))
        print(f"creating {2 * n:,} injected pods and marking them Ready ...", flush=True)
        for ns, app, obj in ((NS, APP, ss), (PLAIN_NS, PLAIN_APP, sidecarset(PLAIN_SS, PLAIN_APP, 0))):
            tpl = common.injected(
                common.deployment_pod(app=app), [SidecarSet.from_object(obj)], namespace=ns, labels=ENABLED
            )
            pods = [common.named(tpl, f"{app}-{i:05d}") for i in range(n)]
            c.run(common.create_ready_pods(c.client, pods, namespace=ns, limit=32), timeout=1800)
        pids = {name: c.cp.procs[name].pid for name in ("kube-apiserver", "etcd")}
        kubeconfig = str(c.cp.kubeconfig)
        cert_dir = common.temp_dir("sidecarctl-bench-certs-")
        write_cert_dir(cert_dir)
        for r in range(1, args.rounds + 1):
            if r > 1:  # the kubelet's part, untimed: every pod reports the values it was resized to
                for ns in (NS, PLAIN_NS):
                    c.run(common.mark_ready(c.client, c.run(list_pods(c.client, ns)), namespace=ns), 600)
            print(f"round {r}/{args.rounds}: plain loop ...", flush=True)
            plain_runs.append(c.run(plain_loop(kubeconfig, r, pods=n, server_pids=pids), args.timeout))
            m = start_in_process(
                c.loop, c.cp, cert_dir, identity="bench-resize", leader_elect=False, sync_ca_bundle=False
            )
            try:
                print(f"round {r}/{args.rounds}: controller ...", flush=True)
                ctl_runs.append(run_controller(c, m.manager, n, r, timeout=args.timeout, pids=pids))
            finally:
                m.stop()
        final = cpu(args.rounds)
        got = c.run(list_pods(c.client, NS))
        on_new = sum(
            1
            for p in got
            if next(x for x in p["spec"]["containers"] if x["name"] == PROXY)["resources"]["requests"]["cpu"] == final
        )

    rows: list[list[object]] = []
    for r, (plain, ctl) in enumerate(zip(plain_runs, ctl_runs, strict=True)):
        rows.append(
            [
                r + 1,
                f"{plain.seconds:.2f} ({n / plain.seconds:,.0f}/s)",
                f"{ctl.seconds:.2f} ({n / ctl.seconds:,.0f}/s)",
                f"{ctl.first:.2f}",
                f"{plain.seconds / ctl.seconds:.0%}",
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
            f"{ratio:.0%} (>= 90%: {common.verdict(ratio >= 0.90)})",
        ]
    )
    print()
    print(common.table(["round", "plain loop s", "controller s", "reaction s", "ctl/plain"], rows))
    print(f"pods with the last CPU request on the API server: {on_new:,} of {n:,}")
    procs = list(plain_runs[0].cpu)
    cpu_rows = []
    for r in range(args.rounds):
        for label, run in ((f"plain {r + 1}", plain_runs[r]), (f"controller {r + 1}", ctl_runs[r])):
            cpu_rows.append([label, f"{run.seconds:.2f}", *(f"{run.cpu[k]:.2f}" for k in procs)])
    print("\nCPU seconds used during each run:\n")
    print(common.table(["run", "seconds", *procs], cpu_rows))
    return 0 if on_new == n else 1


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
