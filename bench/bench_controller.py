"""What the SidecarSet controller costs with 5,000 injected pods: memory per pod, list time, reconcile CPU.

Run: `.venv/bin/python bench/bench_controller.py` (about 3 minutes; `--pods N` to change the count,
`--profile` to print where a reconcile spends its time).

A private control plane gets N pods with the injected shape (built by the real engine, so they
carry the sidecar, the hash annotations and the injected label as the webhook writes them), in a
namespace not labelled for injection, and one SidecarSet matching them; the pods are reported
Running and Ready through `/status`. Each measurement then runs in a fresh child process so that
one does not inherit the other's heap: the controller's pod informer (`project`) and `Controller`
list and index the pods, and the child reports

* list + project time (wall and CPU) until the informer has synced;
* memory per tracked pod: RSS before/after the sync (includes the transient list pages the
  allocator keeps), and tracemalloc of what stays alive, split by the module that allocated it;
* CPU (`time.process_time`) of `controller.reconcile` over all pods with the status already
  current (the computation alone), and with a status write. Targets: <= 2 KiB of projection per
  pod, <= 50 ms CPU per reconcile.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import pstats
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from kuberuntime import kubeapi
from kuberuntime.events import EventRecorder
from kuberuntime.informer import Informer
from kuberuntime.jsontypes import JsonObj
from kuberuntime.kubeconfig import load_config
from sidecarsets.controller.controller import Controller
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

NAMESPACE = "bench-pods"
APP = "shop"
SS_NAME = "mesh"
MANAGER_NS = names.DEFAULT_MANAGER_NAMESPACE
KIB = 1024


def _parts(client: kubeapi.KubeClient, page_size: int) -> tuple[Controller, Informer[PodProjection]]:
    """The manager's pod informer and controller, wired as `sidecarctl.manager.inprocess.Manager` wires them."""
    labels = {NAMESPACE: {names.NS_NAME_LABEL: NAMESPACE}}
    controller = Controller(client, namespace=MANAGER_NS, namespaces=lambda: labels, recorder=EventRecorder(client))
    informer: Informer[PodProjection] = Informer(
        client,
        "/api/v1/pods",
        name="pods",
        transform=project,
        handler=controller.on_pod,
        label_selector=f"{names.POD_INJECTED_LABEL}=true",
        page_size=page_size,
    )
    return controller, informer


async def _sync(informer: Informer[PodProjection], stop: asyncio.Event) -> asyncio.Task[None]:
    task = asyncio.create_task(informer.run(stop))
    await informer.synced.wait()
    return task


async def _stop(task: asyncio.Task[None], stop: asyncio.Event) -> None:
    stop.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _profile_text(prof: cProfile.Profile, sort: str, count: int) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(sort).print_stats(count)
    return out.getvalue()


async def phase_sync(kubeconfig: str, pods: int, reconciles: int, page_size: int, profile: bool) -> dict[str, Any]:
    """List/project time, RSS delta, and reconcile CPU, in one process."""
    client = kubeapi.KubeClient(load_config(kubeconfig))
    await client.get(f"/api/v1/namespaces/{NAMESPACE}")  # TLS session and pool up before the baseline
    controller, informer = _parts(client, page_size)
    gc.collect()
    rss0 = common.rss_bytes()
    stop = asyncio.Event()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    task = await _sync(informer, stop)
    list_wall, list_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    gc.collect()
    rss1 = common.rss_bytes()
    if len(informer.store) != pods:
        raise RuntimeError(f"the informer holds {len(informer.store)} pods, expected {pods}")

    writes = 0
    patch = client.patch

    async def counting_patch(path: str, body: Any, **kw: Any) -> JsonObj:
        nonlocal writes
        writes += 1
        return await patch(path, body, **kw)

    client.patch = counting_patch  # type: ignore[method-assign]
    ss = await client.get(f"{common.SS_PATH}/{SS_NAME}")
    controller.on_sidecarset("ADDED", None, ss)
    cpu0 = time.process_time()
    await controller.reconcile(SS_NAME)
    first_cpu = time.process_time() - cpu0
    status = dict(controller.sidecarsets[SS_NAME].status)

    async def timed(*, stale: bool) -> tuple[float, float]:
        if stale:  # the cached status disagrees with the pods: the reconcile writes it
            cur = controller.sidecarsets[SS_NAME].obj
            stale_obj = {**cur, "status": {**(cur.get("status") or {}), "matchedPods": 0}}
            controller.sidecarsets[SS_NAME] = SidecarSet.from_object(stale_obj, tolerant=True)
        gc.collect()
        w, c = time.perf_counter(), time.process_time()
        await controller.reconcile(SS_NAME)
        return time.process_time() - c, time.perf_counter() - w

    writes = 0
    current = [await timed(stale=False) for _ in range(reconciles)]
    writes_current = writes
    writes = 0
    with_write = [await timed(stale=True) for _ in range(reconciles)]
    writes_stale = writes

    profile_text = ""
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        await controller.reconcile(SS_NAME)
        prof.disable()
        profile_text = "one reconcile, status current, by cumulative time:\n" + _profile_text(prof, "cumulative", 30)
    await _stop(task, stop)
    if profile:  # a second, fresh list under the profiler (after the timed one, so it does not skew it)
        controller, informer = _parts(client, page_size)
        prof = cProfile.Profile()
        prof.enable()
        task = await _sync(informer, stop := asyncio.Event())
        prof.disable()
        await _stop(task, stop)
        profile_text += "\nlist + project of every pod, by own time:\n" + _profile_text(prof, "tottime", 25)
    await client.close()
    return {
        "list_wall": list_wall,
        "list_cpu": list_cpu,
        "rss_delta": rss1 - rss0,
        "first_cpu": first_cpu,
        "status": status,
        "current_cpu": [c for c, _ in current],
        "current_wall": [w for _, w in current],
        "current_writes": writes_current,
        "write_cpu": [c for c, _ in with_write],
        "write_wall": [w for _, w in with_write],
        "write_writes": writes_stale,
        "profile": profile_text,
    }


async def phase_trace(kubeconfig: str, pods: int, page_size: int) -> dict[str, Any]:
    """What the informer and controller keep alive per pod, by allocating module."""
    client = kubeapi.KubeClient(load_config(kubeconfig))
    await client.get(f"/api/v1/namespaces/{NAMESPACE}")
    tracemalloc.start()
    gc.collect()
    base = tracemalloc.take_snapshot()
    base_bytes = tracemalloc.get_traced_memory()[0]
    controller, informer = _parts(client, page_size)
    stop = asyncio.Event()
    task = await _sync(informer, stop)
    await _stop(task, stop)  # the store stays; the watch connection's buffers go
    if len(informer.store) != pods or len(controller.pods) != pods:
        raise RuntimeError(f"tracked {len(informer.store)}/{len(controller.pods)} pods, expected {pods}")
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - base_bytes
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    by_file: dict[str, int] = {}
    for diff in snap.compare_to(base, "filename"):
        if diff.size_diff <= 0:
            continue
        path = diff.traceback[0].filename
        key = path.split("/site-packages/")[-1] if "/site-packages/" in path else Path(path).name
        by_file[key] = by_file.get(key, 0) + diff.size_diff
    await client.close()
    return {"retained": retained, "by_file": by_file}


def run_child(
    phase: str, kubeconfig: Path, args: argparse.Namespace, *, page_size: int, profile: bool
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--phase", phase, "--kubeconfig", str(kubeconfig), "--pods", str(args.pods)]
    cmd += ["--reconciles", str(args.reconciles), "--page-size", str(page_size)]
    cmd += ["--profile"] if profile else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"phase {phase} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=common.positive_int, default=5000, help="injected pods (default 5000)")
    parser.add_argument("--reconciles", type=common.positive_int, default=10, help="timed reconciles of each kind")
    parser.add_argument("--concurrency", type=common.positive_int, default=32, help="pod creates in flight")
    parser.add_argument(
        "--env-vars",
        type=int,
        default=40,
        help="env vars per app container (default 40, the realistic pod; fewer makes 50,000 pods fit a"
        " private etcd: the projection keeps no env, so memory per tracked pod does not depend on it)",
    )
    parser.add_argument(
        "--page-size",
        type=common.positive_int,
        action="append",
        help="list page size (default: the manager's 500); repeat to compare list time and RSS for more sizes",
    )
    parser.add_argument("--profile", action="store_true", help="print a cProfile of a reconcile and of the list")
    parser.add_argument("--phase", choices=("sync", "trace"), help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.page_size = args.page_size or [500]
    if args.phase == "sync":
        result = phase_sync(args.kubeconfig, args.pods, args.reconciles, args.page_size[0], args.profile)
        print(json.dumps(asyncio.run(result)))
        return 0
    if args.phase == "trace":
        print(json.dumps(asyncio.run(phase_trace(args.kubeconfig, args.pods, args.page_size[0]))))
        return 0

    common.print_machine(f"bench_controller: {args.pods:,} injected pods, one SidecarSet, real kube-apiserver")
    with common.cluster() as c:
        c.run(c.ensure_namespace(NAMESPACE))
        c.run(c.ensure_namespace(MANAGER_NS))
        ss = c.run(c.client.create(common.SS_PATH, common.mesh_sidecarset(name=SS_NAME, app=APP)))
        enabled = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
        template = common.injected(
            common.deployment_pod(app=APP, env_vars=args.env_vars),
            [SidecarSet.from_object(ss)],
            namespace=NAMESPACE,
            labels=enabled,
        )
        pods = [common.named(template, f"{APP}-{i:05d}") for i in range(args.pods)]
        size = len(json.dumps(common.ready_status(pods[0]))) + len(json.dumps(pods[0]))
        print(
            f"creating {args.pods:,} pods (~{size / KIB:.1f} KiB of JSON each) and marking them Ready ...", flush=True
        )
        t0 = time.perf_counter()
        c.run(common.create_ready_pods(c.client, pods, namespace=NAMESPACE, limit=args.concurrency), timeout=1800)
        took = time.perf_counter() - t0
        print(f"   {took:.1f}s ({2 * args.pods / took:,.0f} requests/s: one create and one status patch per pod)")
        print("measuring in child processes ...\n", flush=True)
        sizes = args.page_size
        sync = run_child("sync", c.cp.kubeconfig, args, page_size=sizes[0], profile=args.profile)
        trace = run_child("trace", c.cp.kubeconfig, args, page_size=sizes[0], profile=False)
        others = {size: run_child("sync", c.cp.kubeconfig, args, page_size=size, profile=False) for size in sizes[1:]}

    n = args.pods
    st = sync["status"]
    print(f"SidecarSet status after the first reconcile: {json.dumps(st, sort_keys=True)}")
    if not st.get("matchedPods") == st.get("updatedPods") == st.get("readyPods") == n:
        print(f"warning: expected matchedPods = updatedPods = readyPods = {n}")
    by_file: dict[str, int] = trace["by_file"]
    # namedtuple constructors are compiled from "<string>"; the strings parsed by orjson count for kubeapi.py.
    projection = sum(by_file.get(k, 0) for k in ("projection.py", "kubeapi.py", "<string>"))
    indexes = by_file.get("informer.py", 0) + by_file.get("controller.py", 0)
    rows: list[list[object]] = [
        [
            "list + project (informer synced), wall",
            f"{sync['list_wall']:.2f} s",
            f"{n / sync['list_wall']:,.0f} pods/s",
            "",
        ],
        ["list + project, CPU", f"{sync['list_cpu']:.2f} s", f"{sync['list_cpu'] / n * 1e6:.0f} us/pod", ""],
        ["RSS delta over the sync", f"{sync['rss_delta'] / 2**20:.1f} MiB", f"{sync['rss_delta'] / n:,.0f} B/pod", ""],
        [
            "retained (tracemalloc), all",
            f"{trace['retained'] / 2**20:.2f} MiB",
            f"{trace['retained'] / n:,.0f} B/pod",
            "",
        ],
        [
            "  projections (projection.py + JSON strings kept)",
            f"{projection / 2**20:.2f} MiB",
            f"{projection / n:,.0f} B/pod",
            f"<= 2048 B: {common.verdict(projection / n <= 2048)}",
        ],
        ["  informer store + controller indexes", f"{indexes / 2**20:.2f} MiB", f"{indexes / n:,.0f} B/pod", ""],
    ]
    for label, key, writes in (
        ("status current", "current", "current_writes"),
        ("with status write", "write", "write_writes"),
    ):
        cpu = sync[f"{key}_cpu"]
        wall = sync[f"{key}_wall"]
        med = statistics.median(cpu) * 1000
        rows.append(
            [
                f"reconcile over {n:,} pods, {label} ({sync[writes]} writes in {len(cpu)})",
                f"{med:.1f} ms CPU (min {min(cpu) * 1000:.1f})",
                f"{statistics.median(wall) * 1000:.1f} ms wall",
                f"<= 50 ms: {common.verdict(med <= 50)}",
            ]
        )
    rows.append(
        ["first reconcile (creates the revision, writes status)", f"{sync['first_cpu'] * 1000:.1f} ms CPU", "", ""]
    )
    for size, other in others.items():
        wall, cpu, rss = other["list_wall"], other["list_cpu"], other["rss_delta"]
        rows.append([f"list pages of {size}: list + project wall / CPU", f"{wall:.2f} s / {cpu:.2f} s", "", ""])
        rows.append([f"list pages of {size}: RSS delta", f"{rss / 2**20:.1f} MiB", f"{rss / n:,.0f} B/pod", ""])
    print(common.table(["measure", "value", "per pod / rate", "target"], rows))
    print("\nretained by allocating module (tracemalloc, top 8):")
    for name, size in sorted(by_file.items(), key=lambda kv: -kv[1])[:8]:
        print(f"   {name:<40} {size / 2**20:8.2f} MiB  {size / n:8,.0f} B/pod")
    if sync["profile"]:
        print("\ncProfile of " + sync["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
