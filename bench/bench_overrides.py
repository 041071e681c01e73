"""What a per-pod override annotation costs at admission: the same pod with and without
`sidecarctl.io/overrides`, in the same run, rounds interleaved.

Run: `.venv/bin/python bench/bench_overrides.py` (about 1 minute). In process, no socket: the
/inject handler's pieces (parse, snapshot, pinned revisions, `engine.inject`, response bytes) and the
whole ASGI app with every pod computed (no replay), for the benchmark's Deployment-made pod
(3 app containers, 40 env vars each, 5 volumes) and its 3 matching SidecarSets, the mesh proxy's
SidecarSet allowing overrides (`spec.overrides`) in both cases. With the annotation the pod asks for
the proxy's CPU request and limit, its memory limit and one env var: read, checked against the
bounds, merged, recorded. Each round runs `--calls` of one kind then of the other (the order
alternating per round); the table gives p50/p90/p99 and the mean over all rounds, and the ratio.
Goal: with the annotation at most 1.1x the cost without.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.bench_admission import NAMESPACE, NS_LABELS, asgi_caller, handler_pieces
from injector.http.app import create_webhook_app
from injector.http.decisions import WebhookSettings
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore

BOUNDS = [
    {
        "containerName": "mesh-proxy",
        "resources": {"cpu": {"min": "50m", "max": "4"}, "memory": {"min": "64Mi", "max": "4Gi"}},
        "env": ["PROXY_LOG_LEVEL"],
    }
]
ASKED = {
    "mesh-proxy": {
        "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "2", "memory": "2Gi"}},
        "env": [{"name": "PROXY_LOG_LEVEL", "value": "debug"}],
    }
}
GOAL = 1.1


def build_store() -> TemplateStore:
    store = TemplateStore()
    for ss in common.three_sidecarsets():
        meta = {**ss["metadata"], "creationTimestamp": common.NOW, "resourceVersion": "1"}
        spec = {**ss["spec"], "overrides": BOUNDS} if ss["metadata"]["name"] == "mesh" else ss["spec"]
        store.on_sidecarset("ADDED", None, {**ss, "metadata": meta, "spec": spec})
    if len(store.snapshot.sidecarsets) != 3:
        raise RuntimeError("benchmark SidecarSets are unusable; see the log above")
    store.on_namespace("ADDED", None, NS_LABELS)
    return store


def bodies() -> dict[str, bytes]:
    plain = common.deployment_pod()
    asking = common.deployment_pod()
    asking["metadata"].setdefault("annotations", {})[names.ANN_OVERRIDES] = json.dumps(ASKED)
    return {
        "without": orjson.dumps(common.admission_review(plain, namespace=NAMESPACE)),
        "with": orjson.dumps(common.admission_review(asking, namespace=NAMESPACE)),
    }


def _check(raw: bytes, *, asked: bool) -> None:
    resp = orjson.loads(raw)["response"]
    if not resp.get("allowed") or resp.get("patchType") != "JSONPatch" or resp.get("warnings"):
        raise RuntimeError(f"unexpected admission response: {raw[:300]!r}")
    patch = orjson.loads(base64.b64decode(resp["patch"]))
    proxy = next(
        op["value"] for op in patch if isinstance(op.get("value"), dict) and op["value"].get("name") == "mesh-proxy"
    )
    limits = proxy["resources"]["limits"]
    if asked != (limits.get("cpu") == "2" and limits.get("memory") == "2Gi"):
        raise RuntimeError(f"the override was {'not ' if asked else ''}applied: {proxy['resources']}")


def _rounds(run: Callable[[bytes], float], given: dict[str, bytes], rounds: int, calls: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in given}
    for r in range(rounds):
        order = list(given) if r % 2 == 0 else list(reversed(given))
        for kind in order:
            samples[kind] += [run(given[kind]) for _ in range(calls)]
    return samples


def measure(rounds: int, calls: int, warmup: int) -> list[tuple[str, dict[str, list[float]]]]:
    store, given = build_store(), bodies()
    for kind, body in given.items():
        _check(handler_pieces(store, body), asked=kind == "with")

    def pieces(body: bytes) -> float:
        t0 = time.perf_counter_ns()
        handler_pieces(store, body)
        return (time.perf_counter_ns() - t0) / 1000

    for body in given.values():
        for _ in range(warmup):
            pieces(body)
    out = [("handler pieces (parse, inject, response)", _rounds(pieces, given, rounds, calls))]

    app = create_webhook_app(store, WebhookSettings(replay=None))
    callers: dict[bytes, Callable[[], Awaitable[bytes]]] = {b: asgi_caller(app, b) for b in given.values()}
    loop = asyncio.new_event_loop()

    def whole(body: bytes) -> float:
        t0 = time.perf_counter_ns()
        loop.run_until_complete(callers[body]())
        return (time.perf_counter_ns() - t0) / 1000

    for body in given.values():
        _check(loop.run_until_complete(callers[body]()), asked=body == given["with"])
        for _ in range(warmup):
            whole(body)
    out.append(("whole ASGI app, every pod computed", _rounds(whole, given, rounds, calls)))
    loop.close()
    return out


def _stats(values: list[float]) -> tuple[float, float, float, float]:
    s = sorted(values)
    return common.percentile(s, 50), common.percentile(s, 90), common.percentile(s, 99), sum(s) / len(s)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=common.positive_int, default=10, help="interleaved rounds")
    parser.add_argument("--calls", type=common.positive_int, default=2_000, help="calls of each kind per round")
    parser.add_argument("--warmup", type=common.positive_int, default=2_000, help="warm-up calls of each kind")
    args = parser.parse_args(argv)
    common.print_machine("bench_overrides: /inject with and without a sidecarctl.io/overrides annotation")
    given = bodies()
    print(f"   AdmissionReview: {len(given['without']):,} bytes without, {len(given['with']):,} with the annotation")
    print(f"   annotation: {json.dumps(ASKED)}")
    print(f"\n{args.rounds} rounds x {args.calls:,} calls of each kind, interleaved (us per pod):\n", flush=True)
    rows: list[list[Any]] = []
    for what, samples in measure(args.rounds, args.calls, args.warmup):
        without, with_ = _stats(samples["without"]), _stats(samples["with"])
        for kind, st in (("without", without), ("with", with_)):
            rows.append([what, kind, *(f"{v:.1f}" for v in st), "", ""])
        p50_ratio, mean_ratio = with_[0] / without[0], with_[3] / without[3]
        rows[-1][-2:] = [
            f"{p50_ratio:.3f} / {mean_ratio:.3f}",
            common.verdict(p50_ratio <= GOAL and mean_ratio <= GOAL),
        ]
    print(common.table(["path", "annotation", "p50", "p90", "p99", "mean", "with/without p50 / mean", "<= 1.1x"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
