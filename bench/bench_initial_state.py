"""The first state of N injected pods, streamed (WatchList) and listed in pages, as the controller reads it.

Run: `.venv/bin/python bench/bench_initial_state.py` (50,000 pods: creating them takes this machine
most of the run; `--pods N` for another count, `--rounds R` to repeat).

A private control plane (etcd + kube-apiserver 1.37, where WatchList is beta and on) gets N pods of
the injected shape (bench/bench_controller.py's: the real engine's output, Running and Ready), in
one namespace. Then, in turn and `--rounds` times so that drift shows, a fresh child process runs
the controller's pod informer (`sidecarctl.manager.warm.pod_informer`, the manager's own) until it
has synced, once asking for the state as a WatchList
(`sendInitialEvents=true`), once as the paged LIST it falls back to (pages of 100, as the
manager's pod watch asks), both with the manager's client (which decodes pods without their
managedFields), and once streamed again with every pod decoded whole, as the client did before.
For each: wall time to synced, the child's CPU, its peak RSS
(`VmHWM`: what the allocator took at the worst moment, which Python keeps; not `ru_maxrss`, which
Linux carries over from the benchmark's own process through fork and exec), and
kube-apiserver's CPU and peak RSS over the read (sampled every 50 ms).

Then the takeover, both ways in turn, `--rounds` times (`--phases` picks either part). A leader
(`sidecarctl run`, the manager's default Lease of 15 s) is started with the SidecarSet's status
zeroed, and its first right status timed from process start: the cold start. Then either a second
replica joins and stands by until its pod cache holds every pod (`sidecarctl_cached_objects`), the
**warm standby**; or nothing stands by and a new process is started at the moment of the kill, the
**cold start** of a replacement. The leader's whole process tree is SIGKILLed (no Lease release, as
a node failure looks) and the status zeroed at once, so only the next leader can make it right again.
Timed from the kill: the Lease taken (its acquireTime) and the first right status (the current
generation, every pod matched, updated and ready), polled every 0.1 s. The RSS of each process
tree (supervisor, control process, admission workers) is read before the kill.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.bench_controller import APP, NAMESPACE, SS_NAME
from kuberuntime import api, kubeapi
from kuberuntime.kubeconfig import load_config
from sidecarctl.manager import api_client
from sidecarctl.manager.warm import pod_informer
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube.managerharness import ManagerProcess, start_process, wait_ready, write_cert_dir
from tests.kube.measure import Metrics, RssSampler, descendants, rss

MIB = 1024 * 1024
MODES = {
    "stream": "WatchList (sendInitialEvents)",
    "pages": "paged LIST, 100 a page",
    "whole": "WatchList, managedFields decoded",
}
TAKEOVERS = {"warm": "warm standby", "cold": "cold start at the kill"}
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{names.DEFAULT_MANAGER_NAMESPACE}/leases/sidecarctl-controller"


def high_water() -> int:
    """This process's peak RSS in bytes (VmHWM: its own address space's, begun at exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


async def child(kubeconfig: str, mode: str, pods: int) -> dict[str, Any]:
    """One read of the state in this process: the manager's pod informer until synced."""
    config = load_config(kubeconfig)
    # The manager's client decodes pods without their managedFields; "whole" reads them as it did before.
    client = kubeapi.KubeClient(config) if mode == "whole" else api_client(config)
    await client.get(f"/api/v1/namespaces/{NAMESPACE}")  # TLS session and pool up before the baseline
    informer = pod_informer(client, watch_list=mode != "pages")
    base = high_water()
    stop = asyncio.Event()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    task = asyncio.create_task(informer.run(stop))
    await informer.synced.wait()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    peak = high_water()
    stop.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await client.close()
    if len(informer.store) != pods:
        raise RuntimeError(f"{mode}: the informer holds {len(informer.store)} pods, expected {pods}")
    streamed = informer.watch_list
    if (mode != "pages") != streamed:
        raise RuntimeError(f"{mode}: the state was {'streamed' if streamed else 'listed'}")
    return {"wall": wall, "cpu": cpu, "peak": peak, "base": base}


def measure(c: common.Cluster, mode: str, pods: int) -> dict[str, Any]:
    apiserver = c.cp.procs["kube-apiserver"].pid
    cmd = [sys.executable, __file__, "--child", mode, "--kubeconfig", str(c.cp.kubeconfig), "--pods", str(pods)]
    cpu0 = common.process_cpu(apiserver)
    with RssSampler(apiserver) as sampler:
        rss0 = sampler.total()
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    cpu = common.process_cpu(apiserver) - cpu0
    if out.returncode != 0:
        raise RuntimeError(f"{mode} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(apiserver_cpu=cpu, apiserver_peak=sampler.peak, apiserver_before=rss0)
    return result


def populate(c: common.Cluster, pods: int, concurrency: int) -> None:
    c.run(c.ensure_namespace(NAMESPACE))
    ss = c.run(c.client.create(common.SS_PATH, common.mesh_sidecarset(name=SS_NAME, app=APP)))
    enabled = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
    template = common.injected(
        common.deployment_pod(app=APP), [SidecarSet.from_object(ss)], namespace=NAMESPACE, labels=enabled
    )
    print(f"creating {pods:,} injected pods and marking them Ready ...", flush=True)
    t0 = time.perf_counter()
    batch = 5000  # so that the bench's own pod objects never all sit in memory at once
    for start in range(0, pods, batch):
        chunk = [common.named(template, f"{APP}-{i:05d}") for i in range(start, min(pods, start + batch))]
        c.run(common.create_ready_pods(c.client, chunk, namespace=NAMESPACE, limit=concurrency), timeout=3600)
    print(f"   {time.perf_counter() - t0:.0f} s", flush=True)


# -- the takeover ----------------------------------------------------------------------------------
def tree_rss(m: ManagerProcess) -> int:
    return sum(rss(pid) for pid in descendants(m.proc.pid))


def kill_tree(m: ManagerProcess) -> tuple[float, float]:
    """SIGKILL to every process of the manager at once; (monotonic, wall clock) of the kill."""
    pids = descendants(m.proc.pid)
    at = (time.monotonic(), time.time())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    m.proc.wait(timeout=10)
    return at


def zero_status(c: common.Cluster) -> None:
    zero = {"matchedPods": 0, "updatedPods": 0, "readyPods": 0, "updatedReadyPods": 0, "observedGeneration": 0}
    c.run(c.client.patch(f"{common.SS_PATH}/{SS_NAME}/status", {"status": zero}, patch_type="merge"))


def right_status(c: common.Cluster, pods: int, timeout: float, what: str) -> float:
    """Polls every 0.1 s until the status is of the current generation with every pod matched,
    updated and ready; time.monotonic() then."""
    deadline = time.monotonic() + timeout
    while True:
        ss = c.run(c.client.get(f"{common.SS_PATH}/{SS_NAME}"))
        st = ss.get("status") or {}
        counts = [st.get(k) for k in ("matchedPods", "updatedPods", "readyPods", "updatedReadyPods")]
        if counts == [pods] * 4 and st.get("observedGeneration") == ss["metadata"]["generation"]:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: status {st} after {timeout:.0f} s")
        time.sleep(0.1)


def acquired_after(c: common.Cluster, wall_kill: float, holder: str) -> float:
    spec = c.run(c.client.get(LEASE_PATH))["spec"]
    if spec.get("holderIdentity") != holder:
        raise RuntimeError(f"the Lease is held by {spec.get('holderIdentity')!r}, not {holder!r}")
    stamp = dt.datetime.fromisoformat(str(spec["acquireTime"]).replace("Z", "+00:00")).timestamp()
    return stamp - wall_kill


def takeover(c: common.Cluster, cert_dir: Path, mode: str, pods: int, r: int, timeout: float) -> dict[str, float]:
    """One leader killed, the next one's way to a right status (see the module's docstring)."""
    with contextlib.suppress(api.NotFound):
        c.run(c.client.delete(LEASE_PATH))
    zero_status(c)
    started = time.monotonic()
    leader = start_process(c.cp, cert_dir, identity=f"{mode}-{r}-a", extra=("--log-format=text",))
    running = [leader]
    try:
        wait_ready(leader, timeout=60)
        cold_start = right_status(c, pods, timeout, "the first leader's status") - started
        if mode == "warm":
            standby = start_process(c.cp, cert_dir, identity=f"{mode}-{r}-b", extra=("--log-format=text",))
            running.append(standby)
            wait_ready(standby, timeout=60)
            held = Metrics(standby.probe_url)
            deadline = time.monotonic() + timeout
            while held.value("sidecarctl_cached_objects", informer="pods") < pods:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby's pod cache is not full after {timeout:.0f} s")
                time.sleep(0.2)
        time.sleep(3.0)  # settled: the first state's garbage collected
        leader_rss = tree_rss(leader)
        standby_rss = tree_rss(running[1]) if mode == "warm" else float("nan")
        t_kill, wall_kill = kill_tree(leader)
        running.remove(leader)
        zero_status(c)
        if mode == "cold":
            running.append(start_process(c.cp, cert_dir, identity=f"{mode}-{r}-b", extra=("--log-format=text",)))
        done = right_status(c, pods, timeout, f"{TAKEOVERS[mode]}: the next leader's status")
        lease = acquired_after(c, wall_kill, f"{mode}-{r}-b")
    except BaseException:
        for m in running:
            print(f"--- {m.log_path}:\n{m.log_tail(30)}", file=sys.stderr)
        raise
    finally:
        for m in running:
            m.kill()
    return {
        "cold_start": cold_start,
        "lease": lease,
        "status": done - t_kill,
        "leader_rss": leader_rss,
        "standby_rss": standby_rss,
    }


def report_takeover(results: dict[str, list[dict[str, float]]], pods: int) -> None:
    def each(mode: str, key: str, scale: float, digits: int) -> str:
        values = [r[key] / scale for r in results[mode]]
        if any(v != v for v in values):  # NaN: not measured that way
            return "-"
        return f"{statistics.median(values):.{digits}f} ({' / '.join(f'{v:.{digits}f}' for v in values)})"

    def med(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[mode]))

    rows = []
    for label, key, scale, digits, ratio in (
        ("kill to Lease taken (s)", "lease", 1.0, 1, True),
        ("kill to first right status (s)", "status", 1.0, 1, True),
        ("first right status after the Lease (s)", "after_lease", 1.0, 1, True),
        ("cold start with a free Lease: process start to right status (s)", "cold_start", 1.0, 1, False),
        ("leader RSS, process tree (MiB)", "leader_rss", MIB, 0, False),
        ("standby RSS, process tree (MiB)", "standby_rss", MIB, 0, False),
    ):
        x = f"{med('cold', key) / med('warm', key):.2f}x" if ratio and med("warm", key) else ""
        rows.append([label, each("warm", key, scale, digits), each("cold", key, scale, digits), x])
    print()
    print(f"takeover at {pods:,} injected pods, the leader SIGKILLed; median (each round)")
    print(common.table(["measure", TAKEOVERS["warm"], TAKEOVERS["cold"], "cold / warm"], rows))


def report(results: dict[str, list[dict[str, Any]]], pods: int) -> None:
    def med(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in results[mode]))

    def each(mode: str, key: str, scale: float, digits: int) -> str:
        values = [r[key] / scale for r in results[mode]]
        return f"{statistics.median(values):.{digits}f} ({' / '.join(f'{v:.{digits}f}' for v in values)})"

    modes = [mode for mode in MODES if results[mode]]
    rows = []
    for label, key, scale, digits, unit in (
        ("time to synced", "wall", 1.0, 1, "s"),
        ("informer CPU", "cpu", 1.0, 1, "s"),
        ("informer peak RSS", "peak", MIB, 0, "MiB"),
        ("kube-apiserver CPU", "apiserver_cpu", 1.0, 1, "s"),
        ("kube-apiserver peak RSS", "apiserver_peak", MIB, 0, "MiB"),
    ):
        ratios = [f"{med(m, key) / med('stream', key):.2f}x" if med("stream", key) else "-" for m in modes[1:]]
        rows.append([f"{label} ({unit})", *(each(m, key, scale, digits) for m in modes), *ratios])
    print()
    print(f"{pods:,} injected pods; median (each round)")
    print(common.table(["measure", *(MODES[m] for m in modes), *(f"{m} / stream" for m in modes[1:])], rows))
    before = statistics.median(r["apiserver_before"] for rs in results.values() for r in rs)
    print(f"kube-apiserver RSS before each read: {before / MIB:.0f} MiB (median)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=common.positive_int, default=50_000, help="injected pods (default 50000)")
    parser.add_argument("--rounds", type=common.positive_int, default=2, help="reads of each kind, alternating")
    parser.add_argument("--concurrency", type=common.positive_int, default=32, help="pod creates in flight")
    parser.add_argument(
        "--phases", default="reads,takeover", help="comma-separated: reads (WatchList and LIST), takeover"
    )
    parser.add_argument("--child", choices=tuple(MODES), help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(child(args.kubeconfig, args.child, args.pods))))
        return 0
    phases = set(args.phases.split(","))
    if not phases or phases - {"reads", "takeover"}:
        parser.error(f"--phases: reads and/or takeover, not {args.phases!r}")
    common.print_machine(f"bench_initial_state: {args.pods:,} injected pods, {' and '.join(sorted(phases))}")
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    taken: dict[str, list[dict[str, float]]] = {mode: [] for mode in TAKEOVERS}
    with common.cluster() as c:
        populate(c, args.pods, args.concurrency)
        for r in range(args.rounds if "reads" in phases else 0):
            for mode in MODES if r % 2 == 0 else reversed(MODES):
                got = measure(c, mode, args.pods)
                results[mode].append(got)
                print(
                    f"  round {r + 1} {MODES[mode]:30} synced in {got['wall']:.1f} s, peak RSS"
                    f" {got['peak'] / MIB:.0f} MiB, kube-apiserver {got['apiserver_cpu']:.1f} CPU-s,"
                    f" peak {got['apiserver_peak'] / MIB:.0f} MiB",
                    flush=True,
                )
        cert_dir = common.temp_dir("bench-initial-state-certs-")
        write_cert_dir(cert_dir)
        c.run(c.ensure_namespace(names.DEFAULT_MANAGER_NAMESPACE))
        timeout = 120 + args.pods / 100
        for r in range(args.rounds if "takeover" in phases else 0):
            for mode in TAKEOVERS if r % 2 == 0 else reversed(TAKEOVERS):
                got = takeover(c, cert_dir, mode, args.pods, r, timeout)
                got["after_lease"] = got["status"] - got["lease"]
                taken[mode].append(got)
                print(
                    f"  round {r + 1} {TAKEOVERS[mode]:22} Lease taken {got['lease']:.1f} s after the kill,"
                    f" right status {got['status']:.1f} s; cold start {got['cold_start']:.1f} s;"
                    f" leader RSS {got['leader_rss'] / MIB:.0f} MiB, standby {got['standby_rss'] / MIB:.0f} MiB",
                    flush=True,
                )
    if "reads" in phases:
        report(results, args.pods)
    if "takeover" in phases:
        report_takeover(taken, args.pods)
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
