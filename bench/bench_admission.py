"""How long the /inject webhook takes per pod, in process and over HTTPS (targets from the issue).

Run: `.venv/bin/python bench/bench_admission.py` (about 1.5 minutes). Needs `wrk` for the HTTP/1.1
load and `h2load` for HTTP/2 (`apt-get install -y wrk nghttp2-client`); without them only the
in-process part runs and the missing tool is named.

a) In process: the AdmissionReview bytes of a Deployment-made pod (3 app containers, 40 env vars
   each, 5 volumes) with 3 matching SidecarSets, through (1) the handler's pieces (parse, snapshot,
   pinned revisions, `engine.inject`, response bytes) and (2) the whole ASGI app (starlette routing,
   body reading, metrics) called directly without a socket. Target: p50 <= 150 us.
b) Over HTTPS: the webhook app served exactly as the manager serves it (hypercorn, one worker, TLS
   from the cert reloader, on 127.0.0.1) in a child process, loaded with 16 keep-alive connections
   by a separate load generator; compared in the same run with an empty endpoint (a bare ASGI app
   answering a fixed AdmissionReview) on the same server setup. Targets: >= 85% of the empty
   endpoint's requests/s, p99 <= 20 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import http.client
import io
import json
import os
import pstats
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from injector.engine import engine
from injector.http import admission
from injector.http.app import create_webhook_app
from injector.http.body import BodyLimits
from injector.http.decisions import WebhookSettings
from sidecarctl.manager.supervisor import MALLOC_ENV
from sidecarsets.pins import pinned_sidecarsets
from sidecarsets.spec import names
from sidecarsets.store import TemplateStore

NAMESPACE = "shop"
NS_LABELS = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED, names.NS_NAME_LABEL: NAMESPACE}
APPS = ("empty", "webhook", "webhook-noreplay")
EMPTY_RESPONSE = orjson.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True},
    }
)
INSTALL_HINT = "apt-get install -y wrk nghttp2-client"


def build_store() -> TemplateStore:
    store = TemplateStore()
    given = common.three_sidecarsets()
    for ss in given:
        ss = {**ss, "metadata": {**ss["metadata"], "creationTimestamp": common.NOW, "resourceVersion": "1"}}
        store.on_sidecarset("ADDED", None, ss)
    if len(store.snapshot.sidecarsets) != len(given):  # the store logs why one was unusable
        raise RuntimeError("benchmark SidecarSets are unusable; see the log above")
    store.on_namespace("ADDED", None, NS_LABELS)
    return store


def review_body() -> bytes:
    return orjson.dumps(common.admission_review(common.deployment_pod(), namespace=NAMESPACE))


# -- a) in process --------------------------------------------------------------------------------
def handler_pieces(store: TemplateStore, body: bytes) -> bytes:
    """What the /inject handler does between reading the body and writing the response."""
    review = admission.parse(body)
    admission.require_kind(review, group="", kind="Pod", what="pods")
    assert review.object is not None
    snapshot = store.snapshot
    labels = snapshot.namespaces.get(review.namespace)
    pod_labels = (review.object.get("metadata") or {}).get("labels") or {}
    candidates, denied = pinned_sidecarsets(
        snapshot, pod_labels, namespace=review.namespace, namespace_labels=labels, rand=lambda: 0.5
    )
    assert denied is None
    outcome = engine.inject(
        review.object,
        namespace=review.namespace,
        namespace_labels=labels,
        sidecarsets=candidates,
        now=common.NOW,
        operation=review.operation,
    )
    return admission.response(review, patch=outcome.patch, warnings=outcome.warnings)


def asgi_caller(app: Any, body: bytes) -> Callable[[], Awaitable[bytes]]:
    """One POST /inject through the ASGI app, as hypercorn would deliver it, minus the socket."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "https",
        "path": names.INJECT_PATH,
        "raw_path": names.INJECT_PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:9443"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 9443),
        "state": {},
    }
    request = {"type": "http.request", "body": body, "more_body": False}

    async def call() -> bytes:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return request

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(dict(scope), receive, send)
        if sent[0].get("status") != 200:
            raise RuntimeError(f"/inject answered {sent[0].get('status')}: {sent[1:]}")
        return b"".join(m.get("body", b"") for m in sent[1:])

    return call


def check_response(raw: bytes) -> None:
    resp = orjson.loads(raw)["response"]
    if not resp.get("allowed") or resp.get("patchType") != "JSONPatch" or resp.get("warnings"):
        raise RuntimeError(f"unexpected admission response: {raw[:300]!r}")


def stats_us(samples_ns: list[int]) -> tuple[float, float, float, float]:
    s = sorted(samples_ns)
    return tuple(common.percentile(s, p) / 1000 for p in (50, 90, 99, 100))  # type: ignore[return-value]


def run_in_process(iterations: int, warmup: int) -> list[tuple[str, tuple[float, float, float, float]]]:
    store = build_store()
    body = review_body()
    check_response(handler_pieces(store, body))
    results: list[tuple[str, tuple[float, float, float, float]]] = []

    samples: list[int] = []
    for i in range(warmup + iterations):
        t0 = time.perf_counter_ns()
        handler_pieces(store, body)
        if i >= warmup:
            samples.append(time.perf_counter_ns() - t0)
    results.append(("handler pieces (parse, inject, response)", stats_us(samples)))

    async def loop(call: Callable[[], Awaitable[bytes]]) -> list[int]:
        check_response(await call())
        out: list[int] = []
        for i in range(warmup + iterations):
            t0 = time.perf_counter_ns()
            await call()
            if i >= warmup:
                out.append(time.perf_counter_ns() - t0)
        return out

    computed = asgi_caller(create_webhook_app(store, WebhookSettings(replay=None)), body)
    results.append(("whole ASGI app, every pod computed", stats_us(asyncio.run(loop(computed)))))
    replayed = asgi_caller(create_webhook_app(store), body)
    results.append(("whole ASGI app, identical pods replayed", stats_us(asyncio.run(loop(replayed)))))
    return results


def profile_handler(calls: int) -> str:
    store = build_store()
    body = review_body()
    for _ in range(500):
        handler_pieces(store, body)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        handler_pieces(store, body)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(20)
    return out.getvalue()


# -- b) over HTTPS --------------------------------------------------------------------------------
async def empty_app(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Any) -> None:
    """The floor: read the body, answer a fixed AdmissionReview; no routing, parsing or metrics."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(EMPTY_RESPONSE)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": EMPTY_RESPONSE})


def serve(kind: str, bind: str, cert_dir: str, workers: int = 1, channel: int | None = None) -> None:
    """Child process: serve one app the way the manager serves its webhook port, until SIGTERM.

    With `workers` > 1 this process only accepts and hands each connection to the worker holding
    the fewest (sidecarctl.manager.handoff), and that many worker processes serve, each with its
    own Listener and app, as `sidecarctl run` runs its admission workers (and with the same
    allocator settings the supervisor gives them). A worker is this function with `channel`.
    """
    from certwatcher.reloader import CertReloader
    from injector.http.budget import ByteBudget
    from injector.http.server import Limits, Listener  # the manager's own listener, so the comparison is exact
    from sidecarctl.manager.handoff import WorkerChannel
    from sidecarctl.manager.listeners import listen

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if workers > 1:
            await _dispatch(kind, bind, cert_dir, workers, stop)
            return
        reloader = CertReloader(cert_dir)
        reloader.reload_now()
        app: Any = empty_app
        # As sidecarctl.manager.webhook builds it: the default settings (replay on) and the body budget.
        limits = BodyLimits(budget=ByteBudget(64 * 1024 * 1024))
        if kind == "webhook":
            app = create_webhook_app(build_store(), WebhookSettings(), limits)
        elif kind == "webhook-noreplay":
            app = create_webhook_app(build_store(), WebhookSettings(replay=None), limits)
        source = WorkerChannel(channel) if channel is not None else listen(bind)
        await Listener(app, source, reloader.front_context, Limits()).serve(stop)

    asyncio.run(main())


async def _dispatch(kind: str, bind: str, cert_dir: str, workers: int, stop: asyncio.Event) -> None:
    """The supervisor's part: the port, and `workers` processes it hands connections to."""
    from sidecarctl.manager.handoff import Dispatcher
    from sidecarctl.manager.listeners import bind_only

    dispatcher = Dispatcher(bind_only(bind))
    procs = []
    for i in range(workers):
        theirs = dispatcher.attach(i)
        args = [sys.executable, __file__, "--serve", kind, "--cert-dir", cert_dir, "--channel", str(theirs.fileno())]
        procs.append(subprocess.Popen(args, pass_fds=(theirs.fileno(),), preexec_fn=_die_with_parent))
        theirs.close()
    task = asyncio.create_task(dispatcher.serve())
    try:
        await stop.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the benchmark


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(kind: str, cert_dir: Path, workdir: Path, workers: int = 1) -> Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = workdir / f"server-{kind}-{workers}.log"
    args = [sys.executable, __file__, "--serve", kind, "--bind", f"127.0.0.1:{port}", "--cert-dir", str(cert_dir)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*args, "--workers", str(workers)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
            env={**os.environ, **MALLOC_ENV},
        )
    server = Server(proc, port, log)
    deadline = time.monotonic() + 30
    ctx = ssl._create_unverified_context()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as raw, ctx.wrap_socket(raw):
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"{kind} server did not accept TLS connections within 30 s")


def post_once(port: int, body: bytes) -> bytes:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl._create_unverified_context(), timeout=10)
    try:
        conn.request("POST", names.INJECT_PATH, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST {names.INJECT_PATH} answered {resp.status}: {data[:300]!r}")
        return data
    finally:
        conn.close()


@dataclass
class Load:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int


WRK_SCRIPT = """
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nBENCH {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "errors": %d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
"""


def run_wrk(
    port: int,
    body_file: Path | None,
    script: Path,
    *,
    connections: int,
    seconds: int,
    env: dict[str, str] | None = None,
) -> Load:
    url = f"https://127.0.0.1:{port}{names.INJECT_PATH}"
    args = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script), url]
    env = {**os.environ, **(env or {}), **({"BENCH_BODY": str(body_file)} if body_file else {})}
    out = subprocess.run(args, capture_output=True, text=True, env=env, check=False, timeout=seconds + 60)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-1500:]}{out.stderr[-1500:]}")
    data = json.loads(line[len("BENCH ") :])
    return Load(
        rps=data["requests"] / (data["duration_us"] / 1e6),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        requests=data["requests"],
        errors=data["errors"],
    )


# hypercorn ends a connection after `keep_alive_max_requests` (1000) requests: HTTP/1.1 with
# `Connection: close` (wrk reconnects), HTTP/2 with GOAWAY, after which the connection lingers until
# `keep_alive_timeout` (75 s in the manager) and h2load does not reconnect. So h2load sends a fixed
# count per connection, below that limit, instead of running for a duration.
H2_REQUESTS_PER_CONNECTION = 900


def run_h2load(
    port: int, body_file: Path, workdir: Path, *, connections: int, per_connection: int, h1: bool = False
) -> Load:
    """h2load, one request in flight per connection (-m1), the same concurrency as the HTTP/1.1 run."""
    url = f"https://127.0.0.1:{port}{names.INJECT_PATH}"
    log = workdir / "h2load.log"
    log.unlink(missing_ok=True)
    args = ["h2load", f"-c{connections}", "-m1", "-t1", f"-n{connections * per_connection}"]
    args += ["-d", str(body_file), "-H", "content-type: application/json", f"--log-file={log}", url]
    if h1:
        args.insert(1, "--h1")
    out = subprocess.run(args, capture_output=True, text=True, check=False, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"h2load failed ({out.returncode}): {out.stdout[-1500:]}{out.stderr[-1500:]}")
    if not h1 and "Application protocol: h2" not in out.stdout:
        raise RuntimeError(f"h2load did not negotiate h2:\n{out.stdout[-1500:]}")
    finished = re.search(r"finished in [0-9.]+m?s, ([0-9.]+) req/s", out.stdout)
    failed = re.search(r"requests: \d+ total, \d+ started, \d+ done, \d+ succeeded, (\d+) failed", out.stdout)
    if finished is None or failed is None:
        raise RuntimeError(f"cannot read h2load's summary:\n{out.stdout[-1500:]}")
    lat: list[float] = []
    errors = int(failed.group(1))
    for row in log.read_text().splitlines():
        parts = row.split("\t")
        if len(parts) < 3 or int(parts[1]) <= 0:
            continue  # status 0: cut off by the end of the run, not answered
        if int(parts[1]) >= 300:
            errors += 1
        lat.append(int(parts[2]) / 1000)
    if not lat:
        raise RuntimeError(f"h2load logged no requests:\n{out.stdout[-1500:]}")
    lat.sort()
    return Load(
        rps=float(finished.group(1)),
        p50_ms=common.percentile(lat, 50),
        p99_ms=common.percentile(lat, 99),
        requests=len(lat),
        errors=errors,
    )


def run_https(seconds: int, connections: int) -> tuple[list[list[object]], list[str]]:
    """Rows of the HTTPS table plus notes (missing tools, failed checks)."""
    from tests.kube.managerharness import write_cert_dir

    notes: list[str] = []
    have_wrk, have_h2load = shutil.which("wrk") is not None, shutil.which("h2load") is not None
    protocols: list[str] = []
    if have_wrk:
        protocols.append("HTTP/1.1 (wrk)")
    elif have_h2load:
        protocols.append("HTTP/1.1 (h2load --h1)")
        notes.append(f"wrk not found; HTTP/1.1 measured with h2load --h1 (install wrk: {INSTALL_HINT})")
    if have_h2load:
        protocols.append("HTTP/2 (h2load)")
    else:
        notes.append(f"h2load not found: no HTTP/2 figures (install it: {INSTALL_HINT})")
    if not protocols:
        notes.insert(0, f"no load generator found: skipping the HTTPS part. Install one: {INSTALL_HINT}")
        return [], notes

    workdir = common.temp_dir("sidecarctl-bench-admission-")
    try:
        cert_dir = workdir / "certs"
        write_cert_dir(cert_dir)
        body = review_body()
        body_file = workdir / "review.json"
        body_file.write_bytes(body)
        script = workdir / "post.lua"
        script.write_text(WRK_SCRIPT)

        def measure(protocol: str, port: int, *, warmup: bool) -> Load:
            if protocol.startswith("HTTP/1.1 (wrk)"):
                secs = 2 if warmup else seconds
                return run_wrk(port, body_file, script, connections=connections, seconds=secs)
            per_connection = 100 if warmup else H2_REQUESTS_PER_CONNECTION
            h1 = protocol.startswith("HTTP/1.1")
            return run_h2load(port, body_file, workdir, connections=connections, per_connection=per_connection, h1=h1)

        results: dict[tuple[str, str], Load] = {}
        for kind in APPS:
            server = start_server(kind, cert_dir, workdir)
            try:
                reply = post_once(server.port, body)
                if kind != "empty":
                    check_response(reply)
                for protocol in protocols:
                    size = f"{seconds}s" if "wrk" in protocol else f"{H2_REQUESTS_PER_CONNECTION} requests/connection"
                    print(f"   load: {kind} endpoint, {protocol}, {size} ...", flush=True)
                    measure(protocol, server.port, warmup=True)  # connections, caches, the allocator
                    results[(kind, protocol)] = measure(protocol, server.port, warmup=False)
            finally:
                server.stop()
        rows: list[list[object]] = []
        for protocol in protocols:
            empty = results[("empty", protocol)]
            for kind, load in (
                ("empty", empty),
                ("/inject, identical pods (replayed)", results[("webhook", protocol)]),
                ("/inject, every pod computed", results[("webhook-noreplay", protocol)]),
            ):
                ratio = load.rps / empty.rps
                rows.append(
                    [
                        protocol,
                        kind,
                        f"{load.rps:,.0f}",
                        f"{load.p50_ms:.2f}",
                        f"{load.p99_ms:.2f}",
                        f"{load.requests:,}",
                        load.errors,
                        f"{ratio:.0%} ({common.verdict(ratio >= 0.85)})" if kind != "empty" else "",
                        common.verdict(load.p99_ms <= 20) if kind != "empty" else "",
                    ]
                )
        return rows, notes
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# Every request a different pod: a counter (per wrk thread) in a label, so no answer can be replayed.
WRK_DISTINCT_SCRIPT = """
local function slurp(name)
  local f = assert(io.open(os.getenv(name), "rb"))
  local data = f:read("*a")
  f:close()
  return data
end
local prefix, suffix = slurp("BENCH_PREFIX"), slurp("BENCH_SUFFIX")
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
local counter = 0
local headers = {["Content-Type"] = "application/json"}
function request()
  counter = counter + 1
  return wrk.format("POST", nil, headers, prefix .. tostring(tid) .. "-" .. tostring(counter) .. suffix)
end
""" + WRK_SCRIPT.split("wrk.headers", 1)[1].split("\n", 1)[1]

DISTINCT_MARK = "@@BENCH-ID@@"


def distinct_template() -> tuple[bytes, bytes]:
    """The benchmark pod's review split around a label value that each request fills with its own id."""
    pod = common.deployment_pod()
    pod["metadata"]["labels"]["bench-id"] = DISTINCT_MARK
    body = orjson.dumps(common.admission_review(pod, namespace=NAMESPACE))
    prefix, _, suffix = body.partition(DISTINCT_MARK.encode())
    return prefix, suffix


def run_distinct(seconds: int, connections: int, workers: int) -> tuple[list[list[object]], list[str]]:
    """c) every pod distinct, `workers` processes behind one port (as --webhook-workers), against the
    empty endpoint served alike."""
    from tests.kube.managerharness import write_cert_dir

    if shutil.which("wrk") is None:
        return [], [f"wrk not found: part c needs it to send a different pod each time (install: {INSTALL_HINT})"]
    workdir = common.temp_dir("sidecarctl-bench-distinct-")
    try:
        cert_dir = workdir / "certs"
        write_cert_dir(cert_dir)
        prefix, suffix = distinct_template()
        (workdir / "prefix").write_bytes(prefix)
        (workdir / "suffix").write_bytes(suffix)
        script = workdir / "distinct.lua"
        script.write_text(WRK_DISTINCT_SCRIPT)
        env = {"BENCH_PREFIX": str(workdir / "prefix"), "BENCH_SUFFIX": str(workdir / "suffix")}
        results: dict[str, Load] = {}
        for kind in ("empty", "webhook"):
            server = start_server(kind, cert_dir, workdir, workers=workers)
            try:
                reply = post_once(server.port, prefix + b"check" + suffix)
                if kind != "empty":
                    check_response(reply)
                print(f"   load: {kind} endpoint, {workers} processes, every pod distinct, {seconds}s ...", flush=True)
                run_wrk(server.port, None, script, connections=connections, seconds=2, env=env)  # warm-up
                results[kind] = run_wrk(server.port, None, script, connections=connections, seconds=seconds, env=env)
            finally:
                server.stop()
        empty = results["empty"]
        rows: list[list[object]] = []
        for kind, load in (("empty", empty), ("/inject, every pod distinct", results["webhook"])):
            ratio = load.rps / empty.rps
            rows.append(
                [
                    f"HTTP/1.1 (wrk), {workers} workers",
                    kind,
                    f"{load.rps:,.0f}",
                    f"{load.p50_ms:.2f}",
                    f"{load.p99_ms:.2f}",
                    f"{load.requests:,}",
                    load.errors,
                    f"{ratio:.0%} ({common.verdict(ratio >= 0.85)})" if kind != "empty" else "",
                    common.verdict(load.p99_ms <= 20) if kind != "empty" else "",
                ]
            )
        return rows, []
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=common.positive_int, default=20_000, help="in-process samples")
    parser.add_argument("--warmup", type=common.positive_int, default=2_000, help="in-process warm-up calls")
    parser.add_argument("--seconds", type=common.positive_int, default=10, help="duration of each wrk load")
    parser.add_argument("--connections", type=common.positive_int, default=16, help="keep-alive connections")
    parser.add_argument("--skip-https", action="store_true", help="only the in-process part")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of the in-process handler")
    parser.add_argument("--workers", type=common.positive_int, default=2, help="server processes in part c")
    parser.add_argument("--serve", choices=APPS, help=argparse.SUPPRESS)
    parser.add_argument("--bind", help=argparse.SUPPRESS)
    parser.add_argument("--cert-dir", help=argparse.SUPPRESS)
    parser.add_argument("--channel", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.bind, args.cert_dir, 1 if args.channel is not None else args.workers, args.channel)
        return 0

    common.print_machine("bench_admission: /inject with a 3-container, 120-env-var pod and 3 matching SidecarSets")
    body = review_body()
    print(
        f"   AdmissionReview: {len(body):,} bytes; response patch: {len(handler_pieces(build_store(), body)):,} bytes"
    )
    print(f"\na) in process, {args.iterations:,} calls after {args.warmup:,} warm-up calls (us):\n", flush=True)
    rows = [
        [what, f"{p50:.0f}", f"{p90:.0f}", f"{p99:.0f}", f"{worst:.0f}", common.verdict(p50 <= 150)]
        for what, (p50, p90, p99, worst) in run_in_process(args.iterations, args.warmup)
    ]
    print(common.table(["path", "p50", "p90", "p99", "max", "p50 <= 150 us"], rows))
    if args.profile:
        print("\ncProfile of 3,000 handler calls, by own time:\n")
        print(profile_handler(3000))
    if args.skip_https:
        return 0
    print(
        f"\nb) HTTPS on 127.0.0.1, the manager's Listener in 1 process, {args.connections} keep-alive connections:\n",
        flush=True,
    )
    https_rows, notes = run_https(args.seconds, args.connections)
    if https_rows:
        headers = ["protocol", "endpoint", "req/s", "p50 ms", "p99 ms", "requests", "errors", "vs empty (>= 85%)"]
        print(common.table([*headers, "p99 <= 20 ms"], https_rows))
    for note in notes:
        print(f"note: {note}")
    print(
        f"\nc) HTTPS on 127.0.0.1, the manager's Listener in {args.workers} processes behind one port (as "
        f"--webhook-workers {args.workers}), {args.connections} keep-alive connections, every pod distinct:\n",
        flush=True,
    )
    distinct_rows, notes = run_distinct(args.seconds, args.connections, args.workers)
    if distinct_rows:
        headers = ["server", "endpoint", "req/s", "p50 ms", "p99 ms", "requests", "errors", "vs empty (>= 85%)"]
        print(common.table([*headers, "p99 <= 20 ms"], distinct_rows))
    for note in notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(common.run_main(main, sys.argv[1:]))
