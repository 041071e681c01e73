"""Attack clients of the webhook port, run as a separate process so their CPU and GIL never slow the
test's own measurements (RSS sampling, the ordinary /inject client, the Lease monitor).

    python -m tests.reliability.attacks big   --url URL --ca CA --namespace NS --seconds S
    python -m tests.reliability.attacks flood --url URL --ca CA --raw 2000 --header-drips 200 --body-drips 200

Each prints one JSON object on its last line of stdout: what was sent and what came back.

- `big`: rounds of 8 concurrent 6 MiB AdmissionReviews for a namespace nobody knows (full of `{}`;
  with `--strings` half of them carry one long string instead, so they are parsed and the namespace
  is looked up), plus one `/validate-sidecarset` carrying a SidecarSet with 100,000 containers,
  each on a new TLS connection, until `--seconds` have passed.
- `flood`: TCP connections that never send a ClientHello, TLS connections that drip their request
  headers, and TLS connections that send complete headers and drip the body, one byte every
  `--interval` seconds. For each connection: the seconds from its start until the server closed
  it (or none when it was still open after `--limit` seconds), and the status line if any came.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import resource
import secrets
import ssl
import sys
import threading
import time
from collections import Counter
from typing import Any

import orjson

from sidecarsets.spec import names

MIB = 1024 * 1024


# -- big bodies -----------------------------------------------------------------------------------
def big_review(namespace: str, size: int, *, string: bool = False) -> bytes:
    """A pod AdmissionReview of exactly `size` bytes, its pod padded with `{}` values (millions of
    them: refused before parsing) or, with `string`, with one long annotation (few values: parsed,
    then the namespace is looked up)."""
    head = orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": secrets.token_hex(16),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace,
                "operation": "CREATE",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "big", "namespace": namespace, "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "app:1"}]},
                    "padding": [],
                },
            },
        }
    )
    prefix, suffix = head[: head.rindex(b"[]") + 1], head[head.rindex(b"[]") + 1 :]
    room = size - len(prefix) - len(suffix)
    if string:
        pad = b'"' + b"x" * (room - 2) + b'"'
    else:
        pad = b"{}," * (room // 3)
        pad = pad[:-1] if pad else pad
    body = prefix + pad + b" " * (room - len(pad)) + suffix
    assert len(body) == size
    return body


def huge_sidecarset_review(containers: int) -> bytes:
    spec = {
        "selector": {"matchLabels": {"app": "huge"}},
        "containers": [{"name": f"c{i}", "image": "x"} for i in range(containers)],
    }
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": secrets.token_hex(16),
                "kind": {"group": names.GROUP, "version": names.VERSION, "kind": names.KIND},
                "resource": {"group": names.GROUP, "version": names.VERSION, "resource": names.PLURAL},
                "operation": "CREATE",
                "name": "huge",
                "object": {
                    "apiVersion": names.API_VERSION,
                    "kind": names.KIND,
                    "metadata": {"name": "huge"},
                    "spec": spec,
                },
            },
        }
    )


def _post(host: str, port: int, ctx: ssl.SSLContext, path: str, body: bytes) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.monotonic() - started
    except (OSError, http.client.HTTPException):
        return 0, time.monotonic() - started  # 0: the connection ended without an answer
    finally:
        conn.close()


def run_big(args: argparse.Namespace) -> dict[str, Any]:
    host, port = _host_port(args.url)
    ctx = ssl.create_default_context(cafile=args.ca)
    # Half of them full of `{}`, half one long string (with --strings; else all `{}`).
    bodies = [
        big_review(args.namespace, args.size_mib * MIB, string=args.strings and i % 2 == 1)
        for i in range(args.concurrency)
    ]
    validate = huge_sidecarset_review(args.containers)
    statuses: Counter[str] = Counter()
    slowest = 0.0
    rounds = 0
    deadline = time.monotonic() + args.seconds
    lock = threading.Lock()

    def one(path: str, body: bytes) -> None:
        nonlocal slowest
        status, took = _post(host, port, ctx, path, body)
        with lock:
            statuses[f"{path} {status}"] += 1
            slowest = max(slowest, took)

    while time.monotonic() < deadline:
        threads = [threading.Thread(target=one, args=(names.INJECT_PATH, b)) for b in bodies]
        threads.append(threading.Thread(target=one, args=(names.VALIDATE_PATH, validate)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rounds += 1
    return {
        "rounds": rounds,
        "review_bytes": len(bodies[0]),
        "validate_bytes": len(validate),
        "statuses": dict(statuses),
        "slowest_seconds": slowest,
    }


# -- connection flood -------------------------------------------------------------------------------
async def _until_closed(reader: asyncio.StreamReader, limit: float) -> tuple[bool, bytes]:
    """Read until EOF or reset: (closed by the server, first bytes received)."""
    got = b""
    try:
        async with asyncio.timeout(limit):
            while True:
                chunk = await reader.read(4096)
                if not chunk:
                    return True, got
                if len(got) < 64:
                    got += chunk
    except TimeoutError:
        return False, got
    except (ConnectionError, ssl.SSLError, OSError):
        return True, got


async def _raw(host: str, port: int, limit: float) -> dict[str, Any]:
    started = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError as e:
        return {"kind": "raw", "connect_error": str(e)}
    connected = time.monotonic()
    closed, _ = await _until_closed(reader, limit)
    writer.close()
    return {
        "kind": "raw",
        "connect": connected - started,
        "closed_after": (time.monotonic() - connected) if closed else None,
    }


async def _drip(host: str, port: int, ctx: ssl.SSLContext, kind: str, interval: float, limit: float) -> dict[str, Any]:
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx, server_hostname=host), timeout=limit
        )
    except (OSError, ssl.SSLError, TimeoutError) as e:
        # The server may refuse TLS (a full worker closes a connection it has no slot for): closed, not open.
        return {"kind": kind, "closed_after": time.monotonic() - started, "tls_error": type(e).__name__}
    if kind == "header":
        data = b"POST /inject HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    else:
        writer.write(
            b"POST /inject HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n"
        )
        data = b'{"apiVersion": "admission.k8s.io/v1", ' * 3000

    async def drip() -> None:
        for i in range(len(data)):
            try:
                writer.write(data[i : i + 1])
                await writer.drain()
            except (ConnectionError, ssl.SSLError, OSError, RuntimeError):
                return
            await asyncio.sleep(interval)

    dripping = asyncio.create_task(drip())
    closed, first = await _until_closed(reader, limit - (time.monotonic() - started))
    dripping.cancel()
    writer.close()
    status = first.split(b"\r\n", 1)[0].decode(errors="replace") if first else ""
    return {"kind": kind, "closed_after": (time.monotonic() - started) if closed else None, "status": status}


async def _flood(args: argparse.Namespace) -> dict[str, Any]:
    host, port = _host_port(args.url)
    ctx = ssl.create_default_context(cafile=args.ca)
    tasks: list[asyncio.Task[dict[str, Any]]] = []
    started = time.monotonic()
    # Opened in batches: 2,000 SYNs at once overflow any accept queue, and the figures would then
    # measure the kernel's SYN retransmits instead of the server.
    for i in range(args.raw):
        tasks.append(asyncio.create_task(_raw(host, port, args.limit)))
        if i % 100 == 99:
            await asyncio.sleep(0.02)
    for kind, count in (("header", args.header_drips), ("body", args.body_drips)):
        for i in range(count):
            tasks.append(asyncio.create_task(_drip(host, port, ctx, kind, args.interval, args.limit)))
            if i % 20 == 19:
                await asyncio.sleep(0.02)
    opened = time.monotonic() - started
    results = await asyncio.gather(*tasks)
    out: dict[str, Any] = {"opened_in": opened}
    for kind in ("raw", "header", "body"):
        mine = [r for r in results if r["kind"] == kind]
        closed = [r["closed_after"] for r in mine if r.get("closed_after") is not None]
        out[kind] = {
            "count": len(mine),
            "closed": len(closed),
            "max_closed_after": max(closed, default=None),
            "min_closed_after": min(closed, default=None),
            "connect_errors": sum(1 for r in mine if "connect_error" in r),
            "tls_errors": dict(Counter(r["tls_error"] for r in mine if "tls_error" in r)),
            "statuses": dict(Counter(r.get("status", "") for r in mine if r.get("status"))),
            "max_connect": max((r.get("connect", 0.0) for r in mine), default=0.0),
        }
    return out


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("https://").partition(":")
    return host, int(port)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.attacks")
    sub = parser.add_subparsers(dest="cmd", required=True)
    big = sub.add_parser("big")
    flood = sub.add_parser("flood")
    for p in (big, flood):
        p.add_argument("--url", required=True)
        p.add_argument("--ca", required=True)
    big.add_argument("--namespace", required=True)
    big.add_argument("--seconds", type=float, default=10.0)
    big.add_argument("--concurrency", type=int, default=8)
    big.add_argument("--size-mib", type=int, default=6)
    big.add_argument("--containers", type=int, default=100_000)
    big.add_argument("--strings", action="store_true", help="half the reviews padded with one long string")
    flood.add_argument("--raw", type=int, default=2000)
    flood.add_argument("--header-drips", type=int, default=200)
    flood.add_argument("--body-drips", type=int, default=200)
    flood.add_argument("--interval", type=float, default=5.0)
    flood.add_argument("--limit", type=float, default=45.0)
    args = parser.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = run_big(args) if args.cmd == "big" else asyncio.run(_flood(args))
    print(orjson.dumps(result).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
