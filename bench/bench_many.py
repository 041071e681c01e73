"""Admission in process as the cluster grows: N SidecarSets, 10,000 namespaces relabelled meanwhile.

Run: `.venv/bin/python bench/bench_many.py` (about a minute).

The benchmark's realistic pod (a Deployment's: 3 app containers x 40 env vars, 5 volumes) through
the /inject handler's pieces (parse, snapshot, pinned revisions, the engine, the response), with
exactly one SidecarSet selecting it among N (the others select `team: tK` pods, as in
bench_scale). Printed per N: p50 / p99 µs and the ratio to N=1 (goal at N=1,000: <= 1.3x). Then
the store with 10,000 namespaces: a namespace's labels change before every admission (the worst
case: every request finds a new snapshot to build), p50 / p99 against no change.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.bench_admission import NAMESPACE, NS_LABELS, check_response, handler_pieces, review_body, stats_us
from bench.bench_scale import team_sidecarset
from sidecarsets.store import TemplateStore


def store_with(n: int, namespaces: int = 1) -> TemplateStore:
    """The matching mesh SidecarSet plus n - 1 that select other pods."""
    store = TemplateStore()
    mesh = common.mesh_sidecarset()
    sets = [mesh, *(team_sidecarset("p", k) for k in range(n - 1))]
    for ss in sets:
        ss = {**ss, "metadata": {**ss["metadata"], "creationTimestamp": common.NOW, "resourceVersion": "1"}}
        store.on_sidecarset("ADDED", None, ss)
    if len(store.snapshot.sidecarsets) != n:
        raise RuntimeError("benchmark SidecarSets are unusable; see the log above")
    store.on_namespace("ADDED", None, NS_LABELS)
    for i in range(namespaces - 1):
        store.on_namespace("ADDED", None, {"kubernetes.io/metadata.name": f"team-{i}", "sidecar-injection": "enabled"})
    return store


def timed(store: TemplateStore, body: bytes, iterations: int, warmup: int, churn: bool = False) -> list[int]:
    check_response(handler_pieces(store, body))
    samples: list[int] = []
    labels = {"kubernetes.io/metadata.name": "team-0", "sidecar-injection": "enabled"}
    for i in range(warmup + iterations):
        if churn:
            changed = {**labels, "round": str(i)}
            store.on_namespace("MODIFIED", labels, changed)
            labels = changed
        t0 = time.perf_counter_ns()
        handler_pieces(store, body)
        if i >= warmup:
            samples.append(time.perf_counter_ns() - t0)
    return samples


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=common.positive_int, default=5_000)
    parser.add_argument("--warmup", type=common.positive_int, default=500)
    parser.add_argument("--sets", default="1,100,1000", help="values of N")
    args = parser.parse_args(argv)
    common.print_machine(f"bench_many: admission in process, {args.iterations} samples per row")
    body = review_body()
    rows = []
    base = 0.0
    for n in [int(x) for x in args.sets.split(",")]:
        p50, _, p99, _ = stats_us(timed(store_with(n), copy.copy(body), args.iterations, args.warmup))
        base = base or p50
        rows.append((f"{n} SidecarSets, 1 selecting the pod", f"{p50:.0f}", f"{p99:.0f}", f"{p50 / base:.2f}x"))
    store = store_with(1000, namespaces=10_000)
    quiet = stats_us(timed(store, body, args.iterations, args.warmup))
    churn = stats_us(timed(store, body, args.iterations, args.warmup, churn=True))
    rows.append(
        ("1,000 SidecarSets, 10,000 namespaces", f"{quiet[0]:.0f}", f"{quiet[2]:.0f}", f"{quiet[0] / base:.2f}x")
    )
    rows.append(
        (
            "the same, a namespace relabelled before each pod",
            f"{churn[0]:.0f}",
            f"{churn[2]:.0f}",
            f"{churn[0] / base:.2f}x",
        )
    )
    print(common.table(("store", "p50 µs", "p99 µs", "p50 vs N=1"), rows))
    print(f"namespace {NAMESPACE}: goal at N=1,000 p50 <= 1.3x N=1: {common.verdict(float(rows[2][3][:-1]) <= 1.3)}")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
