"""Measuring the real manager from outside: memory of its process tree, its metrics, its webhook port.

Shared by the reliability tier (tests/reliability) and the soak command (tools/soak.py):

- `RssSampler`: the resident memory of a process and all its descendants, summed, every 50 ms, from
  /proc (the figure a memory limit is enforced on, counted for every process of `sidecarctl run`).
- `Metrics`: the manager's /metrics (every process, prometheus multiprocess) read as numbers.
- `WebhookClient`: a keep-alive HTTPS client of the webhook port that trusts only the manager's CA,
  the way the API server calls it; `pod_review` and `injected_names` make and read its traffic.
"""

from __future__ import annotations

import base64
import http.client
import os
import secrets
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.kube import builders

MIB = 1024 * 1024


# -- memory of the process tree -------------------------------------------------------------------
def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc (children of children included)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss(pid: int) -> int:
    """Resident bytes of one process (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class RssSampler:
    """Sums the RSS of a process tree every `interval` seconds in a thread; remembers the peak.

    The tree is re-read every second (a restarted child is picked up); the per-sample cost is one
    small /proc read per process.
    """

    def __init__(self, root: int, *, interval: float = 0.05) -> None:
        self.root = root
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self.peak = 0
        self.peak_by_pid: dict[int, int] = {}
        self._pids: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def total(self) -> int:
        return sum(rss(p) for p in descendants(self.root))

    def _run(self) -> None:
        refreshed = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - refreshed >= 1.0:
                self._pids = descendants(self.root)
                refreshed = now
            per = {p: rss(p) for p in self._pids}
            total = sum(per.values())
            self.samples.append((now, total))
            if total > self.peak:
                self.peak = total
                self.peak_by_pid = per
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def describe(self) -> str:
        parts = ", ".join(f"{pid}: {v / MIB:.0f}" for pid, v in sorted(self.peak_by_pid.items()))
        return f"peak {self.peak / MIB:.1f} MiB over {len(self.samples)} samples (MiB by pid at the peak: {parts})"


# -- metrics --------------------------------------------------------------------------------------
class Metrics:
    """The manager's /metrics on the probe port, summed over processes and matching labels."""

    def __init__(self, probe_url: str) -> None:
        self.url = probe_url + "/metrics"

    def read(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(self.url, timeout=10) as r:
            text = r.read().decode()
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pid")))
                out[key] = out.get(key, 0.0) + float(s.value)
        return out

    def value(self, name: str, **labels: str) -> float:
        total = 0.0
        for (sample, got), v in self.read().items():
            if sample == name and all((k, want) in got for k, want in labels.items()):
                total += v
        return total


# -- the webhook port -----------------------------------------------------------------------------
def pod_review(namespace: str, name: str, *, app: str = "web", uid: str | None = None) -> bytes:
    """An AdmissionReview for creating a distinct pod `name` (as the API server sends it)."""
    pod = builders.pod(name, namespace=namespace, labels={"app": app, "pod": name})
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid or secrets.token_hex(16),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace,
                "name": name,
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": pod,
                "dryRun": False,
            },
        }
    )


def injected_names(answer: bytes) -> list[str]:
    """The names of the containers a /inject answer adds (empty when it patches nothing)."""
    response = orjson.loads(answer)["response"]
    if not response.get("allowed") or not response.get("patch"):
        return []
    ops = orjson.loads(base64.b64decode(response["patch"]))
    return [
        str(op["value"].get("name"))
        for op in ops
        if op.get("op") == "add"
        and op.get("path", "").startswith("/spec/containers/")
        and isinstance(op["value"], dict)
    ]


class WebhookClient:
    """HTTP/1.1 keep-alive over TLS to the webhook port, trusting only `ca_file` (as caBundle does)."""

    def __init__(self, url: str, ca_file: Path, *, timeout: float = 15.0) -> None:
        host, _, port = url.removeprefix("https://").partition(":")
        self.host, self.port = host, int(port)
        self.ctx = ssl.create_default_context(cafile=str(ca_file))
        self.timeout = timeout
        self._conn: http.client.HTTPSConnection | None = None
        self.reconnects = 0

    def _connection(self) -> http.client.HTTPSConnection:
        if self._conn is None:
            self._conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=self.timeout)
            self._conn.connect()
            self.reconnects += 1
        return self._conn

    def connect(self) -> None:
        self._connection()

    def post(self, path: str, body: bytes, *, content_type: str = "application/json") -> tuple[int, bytes, float]:
        """(status, body, seconds from sending to the whole answer); reconnects when the server closed."""
        for attempt in range(2):
            conn = self._connection()
            started = time.perf_counter()
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": content_type})
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
                continue
            took = time.perf_counter() - started
            if resp.getheader("connection", "").lower() == "close":
                self.close()
            return resp.status, data, took
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def percentile(values: Iterable[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]
