"""Why a full reconcile costs more per pod at 50,000 pods than at 5,000, in process and without an API server.

Run: `.venv/bin/python bench/bench_reconcile_scale.py` (about a minute; `--pods 5000 50000` by default).

For each size, a child process builds that many injected, Running and Ready pods (the real engine's
shape, bench/common.py), projects them as the pod informer does, hands them to a `Controller` with a
fake API server, and times `reconcile` with the status already current (the computation alone), under
three garbage-collector settings: Python's defaults, the manager's control process's thresholds
(`gc.set_threshold(100_000, 50, 100)`), and every object frozen out of collection (`gc.freeze()`).
It then profiles one reconcile and prints each function's own time per pod: if a step grew worse
than linearly, its per-pod time would grow with the count.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from kuberuntime.events import EventRecorder
from sidecarsets.controller.controller import SS_PATH, Controller
from sidecarsets.pods.projection import project
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube.fakeapi import FakeApiServer

NAMESPACE = "bench-pods"
MODES = ("default", "manager", "frozen")


def _controller(pods: int) -> Controller:
    ss_obj = common.mesh_sidecarset(name="mesh", app="shop")
    ss_obj["metadata"].update(uid="mesh-uid", generation=1, resourceVersion="1")
    template = common.injected(
        common.deployment_pod(app="shop", env_vars=2),
        [SidecarSet.from_object(ss_obj)],
        namespace=NAMESPACE,
        labels={names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED},
    )
    api = FakeApiServer()
    api._store(f"{SS_PATH}/mesh", ss_obj)
    labels = {NAMESPACE: {names.NS_NAME_LABEL: NAMESPACE}}
    c = Controller(
        api,
        namespace="sidecarctl-system",
        namespaces=lambda: labels,
        recorder=EventRecorder(api),
        revisions=lambda _name: [],
    )
    for i in range(pods):
        pod = common.named(template, f"shop-{i:05d}")
        pod["metadata"].update(namespace=NAMESPACE, uid=f"uid-{i}", resourceVersion=str(100 + i))
        pod["status"] = common.ready_status(pod)
        c.on_pod("ADDED", None, project(pod))
    c.on_sidecarset("ADDED", None, ss_obj)
    return c


async def _measure(pods: int, mode: str, rounds: int) -> dict[str, Any]:
    if mode == "manager":
        gc.set_threshold(100_000, 50, 100)
    c = _controller(pods)
    await c.reconcile("mesh")  # writes the status once; the timed ones find it current
    if mode == "frozen":
        gc.freeze()
    cpu = []
    for _ in range(rounds):
        gc.collect()
        started = time.process_time()
        await c.reconcile("mesh")
        cpu.append(time.process_time() - started)
    prof = cProfile.Profile()
    prof.enable()
    await c.reconcile("mesh")
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    own = sorted(((v[2], f"{Path(k[0]).name}:{k[1]} {k[2]}") for k, v in stats.items()), reverse=True)[:8]
    status = c.sidecarsets["mesh"].status
    return {"cpu": statistics.median(cpu), "own": own, "matched": status.get("matchedPods")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pods", type=common.positive_int, nargs="+", default=[5000, 50000])
    parser.add_argument("--rounds", type=common.positive_int, default=5, help="timed reconciles per setting")
    parser.add_argument("--child", nargs=2, metavar=("PODS", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_measure(int(args.child[0]), args.child[1], args.rounds))))
        return 0
    common.print_machine("bench_reconcile_scale: one SidecarSet, N injected Ready pods, in process")
    rows: list[list[str]] = []
    profiles: dict[int, list[tuple[float, str]]] = {}
    for pods in args.pods:
        for mode in MODES:
            cmd = [sys.executable, __file__, "--child", str(pods), mode, "--rounds", str(args.rounds)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            if result["matched"] != pods:
                raise RuntimeError(f"matched {result['matched']} of {pods} pods")
            rows.append([f"{pods:,}", mode, f"{result['cpu'] * 1e3:.1f} ms", f"{result['cpu'] / pods * 1e6:.2f} us"])
            profiles.setdefault(pods, result["own"])
    print(common.table(["pods", "gc", "reconcile CPU (median)", "per pod"], rows))
    print("\nown time per pod of the costliest functions, one reconcile under cProfile (gc: default):")
    for pods, own in profiles.items():
        print(f"  {pods:,} pods: " + "; ".join(f"{name} {t / pods * 1e6:.2f} us" for t, name in own[:5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(common.run_main(main, sys.argv[1:]))
