"""A fuzz soak of the webhook port: many malformed and valid AdmissionReviews, every answer checked.

Used by `tools/soak.py` (a documented command: its own control plane and manager, `--count
100000`) and by the reliability tier (a smaller count against the tier's manager). The requests
are generated from a seeded generator, so a failing request can be regenerated from its index:

- valid pod reviews (injected, skipped, system and unknown namespaces, UPDATE/DELETE, subresources,
  dry runs) and valid SidecarSet reviews, as the API server sends them;
- the same with structural damage: a value replaced by one of another type (at a random place or at
  the places the code reads: `request`, `object`, `metadata`, `spec.containers`, names, labels, env,
  volumes, `uid`, `operation`), keys removed, lists and objects swapped, huge numbers, long strings;
- byte damage: truncated, a byte flipped, invalid UTF-8, a BOM, deep nesting, not JSON at all,
  empty; and HTTP-level damage: another content type, GET, an unknown path, a pod sent to the
  SidecarSet webhook.

Every answer must be below 500; a 200 must be an AdmissionReview answering the request's uid.
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from sidecarsets.spec import names
from tests.kube import builders
from tests.kube.measure import MIB, RssSampler, descendants

JsonLike = Any


@dataclass(frozen=True)
class Request:
    index: int
    method: str
    path: str
    content_type: str
    body: bytes
    uid: str | None  # what a 200 must answer, when the body carries a usable uid


def _review(obj: JsonLike, *, namespace: str, operation: str, kind: dict[str, str], uid: str, **extra: Any) -> JsonLike:
    request: dict[str, Any] = {
        "uid": uid,
        "kind": kind,
        "resource": {"group": kind["group"], "version": kind["version"], "resource": kind["kind"].lower() + "s"},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": obj,
        "dryRun": False,
        **extra,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
SS_KIND = {"group": names.GROUP, "version": names.VERSION, "kind": names.KIND}
WEIRD_VALUES: tuple[JsonLike, ...] = (
    None,
    True,
    0,
    -1,
    2**63,
    1e308,
    "",
    "x" * 300,
    "\u00e9\u4e2d\U0001f600",
    [],
    [None],
    {},
    {"": ""},
    [[[]]],
    "../../etc/passwd",
    "a/b?c#d",
)


class Generator:
    """Request number `i` of a run is a function of (seed, i) alone."""

    def __init__(self, *, seed: int, labelled: str, plain: str, app: str) -> None:
        self.seed = seed
        self.labelled = labelled  # a namespace labelled for injection, known to the manager
        self.plain = plain  # a namespace without the label
        self.app = app  # pods labelled app=<app> match a SidecarSet

    def _pod(self, r: random.Random, i: int) -> JsonLike:
        containers = [
            builders.container(
                f"c{n}",
                f"app:{n}",
                env=[{"name": f"E{k}", "value": str(k)} for k in range(r.randint(0, 4))],
                volumeMounts=[{"name": "data", "mountPath": f"/data{n}"}] if r.random() < 0.5 else [],
            )
            for n in range(r.randint(1, 3))
        ]
        return builders.pod(
            f"fuzz-{i}",
            labels={"app": self.app if r.random() < 0.7 else "other", "i": str(i)},
            annotations={"note": str(r.random())} if r.random() < 0.3 else None,
            containers=containers,
            volumes=[{"name": "data", "emptyDir": {}}],
        )

    def _sidecarset(self, r: random.Random, i: int) -> JsonLike:
        return builders.sidecarset(
            f"fuzz-{i}",
            containers=[builders.container(f"s{n}", f"side:{n}") for n in range(r.randint(1, 3))],
            selector={"matchLabels": {"app": f"fuzz-{i}"}},
            updateStrategy={"maxUnavailable": r.choice([1, "10%", 0, "x", -1])},
        )

    def _valid(self, r: random.Random, i: int, uid: str) -> tuple[str, JsonLike]:
        roll = r.random()
        if roll < 0.8:
            namespace = r.choice(
                [self.labelled] * 6
                + [self.plain, "kube-system", names.DEFAULT_MANAGER_NAMESPACE, f"unknown-{r.randint(0, 9)}"]
            )
            operation = r.choice(["CREATE"] * 8 + ["UPDATE", "DELETE", "CONNECT"])
            extra: dict[str, Any] = {}
            if r.random() < 0.05:
                extra["subResource"] = r.choice(["status", "ephemeralcontainers", "binding"])
            if r.random() < 0.05:
                extra["dryRun"] = True
            if operation == "UPDATE":
                extra["oldObject"] = self._pod(r, i)
            pod = self._pod(r, i)
            return names.INJECT_PATH, _review(
                pod, namespace=namespace, operation=operation, kind=POD_KIND, uid=uid, **extra
            )
        operation = r.choice(["CREATE", "CREATE", "UPDATE", "DELETE"])
        ss = self._sidecarset(r, i)
        extra = {"oldObject": self._sidecarset(r, i)} if operation == "UPDATE" else {}
        return names.VALIDATE_PATH, _review(ss, namespace="", operation=operation, kind=SS_KIND, uid=uid, **extra)

    def request(self, i: int) -> Request:
        r = random.Random(self.seed * 1_000_003 + i)
        uid = f"{self.seed:x}-{i:08d}"
        path, doc = self._valid(r, i, uid)
        roll = r.random()
        if roll < 0.35:
            return Request(i, "POST", path, "application/json", orjson.dumps(doc), uid)
        if roll < 0.8:
            for _ in range(r.randint(1, 3)):
                doc = _damage(r, doc)
            request = doc.get("request") if isinstance(doc, dict) else None
            want = request.get("uid") if isinstance(request, dict) else None
            return Request(i, "POST", path, "application/json", _dumps(doc), want if isinstance(want, str) else None)
        if roll < 0.95:
            return Request(i, "POST", path, "application/json", _damage_bytes(r, orjson.dumps(doc)), None)
        method, path2, ctype = r.choice(
            [
                ("POST", path, "text/plain"),
                ("POST", path, "application/json; charset=utf-8"),
                ("GET", path, "application/json"),
                ("POST", "/nowhere", "application/json"),
                ("POST", names.VALIDATE_PATH if path == names.INJECT_PATH else names.INJECT_PATH, "application/json"),
            ]
        )
        usable = ctype.startswith("application/json") and method == "POST"
        return Request(i, method, path2, ctype, orjson.dumps(doc), uid if usable else None)


def _dumps(doc: JsonLike) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:  # an integer past 64 bits: write it by hand, as a foreign client would
        return repr(doc).encode()


def _nodes(doc: JsonLike, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], JsonLike]]:
    yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(doc, list):
        for n, v in enumerate(doc):
            yield from _nodes(v, (*path, n))


# Where the code reads first: damage there reaches the most checks.
HOT = (
    ("request",),
    ("request", "object"),
    ("request", "uid"),
    ("request", "operation"),
    ("request", "namespace"),
    ("request", "kind"),
    ("request", "object", "metadata"),
    ("request", "object", "metadata", "labels"),
    ("request", "object", "metadata", "annotations"),
    ("request", "object", "spec"),
    ("request", "object", "spec", "containers"),
    ("request", "object", "spec", "containers", 0),
    ("request", "object", "spec", "containers", 0, "name"),
    ("request", "object", "spec", "containers", 0, "env"),
    ("request", "object", "spec", "volumes"),
    ("request", "object", "spec", "selector"),
    ("request", "object", "spec", "updateStrategy"),
    ("request", "oldObject"),
)


def _set(doc: JsonLike, path: tuple[Any, ...], value: JsonLike) -> JsonLike:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return doc
    with contextlib.suppress(IndexError, TypeError):
        node[path[-1]] = value
    return doc


def _damage(r: random.Random, doc: JsonLike) -> JsonLike:
    doc = copy.deepcopy(doc)
    nodes = list(_nodes(doc))
    roll = r.random()
    path = r.choice(HOT) if roll < 0.5 else r.choice(nodes)[0]
    action = r.random()
    if action < 0.5:
        return _set(doc, path, copy.deepcopy(r.choice(WEIRD_VALUES)))
    if action < 0.7 and path:  # remove the key or element
        parent = doc
        for key in path[:-1]:
            try:
                parent = parent[key]
            except (KeyError, IndexError, TypeError):
                return doc
        with contextlib.suppress(KeyError, IndexError, TypeError):
            del parent[path[-1]]
        return doc
    if action < 0.85:  # wrap the value in a list, or a list's items in an object
        target = next((v for p, v in nodes if p == path), None)
        return _set(doc, path, [target] if not isinstance(target, list) else {"items": target})
    return _set(doc, path, {"x": "y" * r.randint(0, 2000), "n": r.randint(-(2**31), 2**31)})


def _damage_bytes(r: random.Random, raw: bytes) -> bytes:
    roll = r.random()
    if roll < 0.25:
        return raw[: r.randint(0, len(raw))]
    if roll < 0.45:
        at = r.randrange(len(raw))
        return raw[:at] + bytes([r.randrange(256)]) + raw[at + 1 :]
    if roll < 0.55:
        return b"\xef\xbb\xbf" + raw
    if roll < 0.65:
        at = r.randrange(len(raw))
        return raw[:at] + b"\xff\xfe\xc3(" + raw[at:]
    if roll < 0.75:
        depth = r.choice([10, 500, 1100, 5000])
        return b"[" * depth + b"]" * depth
    if roll < 0.85:
        return r.choice([b"", b" ", b"null", b"[]", b"{}", b"1", b'"x"', b"NaN", b'{"request": null}'])
    return bytes(r.randrange(256) for _ in range(r.randint(1, 512)))


@dataclass
class SoakResult:
    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # index: what was wrong
    seconds: float = 0.0
    reconnects: int = 0

    @property
    def server_errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)


def check_answer(req: Request, status: int, body: bytes) -> str | None:
    """What is wrong with the answer to `req`, or None."""
    if status >= 500:
        return f"status {status}: {body[:200]!r}"
    if status != 200:
        return None
    try:
        doc = orjson.loads(body)
        response = doc["response"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"200 without an AdmissionReview: {body[:200]!r}"
    if not isinstance(response.get("allowed"), bool):
        return f"200 without response.allowed: {body[:200]!r}"
    if req.uid is not None and response.get("uid") != req.uid:
        return f"answered uid {response.get('uid')!r}, asked {req.uid!r}"
    return None


def run(
    host: str,
    port: int,
    ca_file: str,
    generator: Generator,
    *,
    count: int,
    connections: int = 4,
    on_progress: Callable[[int], None] | None = None,
) -> SoakResult:
    """Send requests 0..count-1 over `connections` keep-alive TLS connections; check every answer."""
    ctx = ssl.create_default_context(cafile=ca_file)
    result = SoakResult()
    lock = threading.Lock()
    next_index = iter(range(count))
    started = time.monotonic()

    def worker() -> None:
        conn: http.client.HTTPSConnection | None = None
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                break
            req = generator.request(i)
            for attempt in range(3):
                if conn is None:
                    conn = http.client.HTTPSConnection(host, port, context=ctx, timeout=30)
                    with lock:
                        result.reconnects += 1
                try:
                    conn.request(req.method, req.path, body=req.body, headers={"Content-Type": req.content_type})
                    resp = conn.getresponse()
                    body = resp.read()
                    status = resp.status
                    if resp.getheader("connection", "").lower() == "close":
                        conn.close()
                        conn = None
                    break
                except (http.client.HTTPException, OSError) as e:
                    if conn is not None:
                        conn.close()
                    conn = None
                    if attempt == 2:
                        status, body = 0, str(e).encode()
            problem = "no answer: " + body.decode(errors="replace") if status == 0 else check_answer(req, status, body)
            with lock:
                result.sent += 1
                result.statuses[status] += 1
                if problem is not None and len(result.failures) < 50:
                    result.failures.append(f"#{req.index} {req.method} {req.path}: {problem}")
                sent = result.sent
            if on_progress is not None and sent % 1000 == 0:
                on_progress(sent)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker, name=f"soak-{n}", daemon=True) for n in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.monotonic() - started
    return result


@dataclass
class SoakReport:
    """A soak of a running manager: the answers, and its process tree's memory and children."""

    result: SoakResult
    warm_rss: int  # after the warm-up share of the requests
    final_rss: int
    peak_rss: int
    children_before: set[int]
    children_after: set[int]

    @property
    def growth(self) -> int:
        return self.final_rss - self.warm_rss

    def problems(self, *, max_growth: int) -> list[str]:
        """What makes the soak fail: 5xx, bad answers, a child replaced, memory that kept growing."""
        out: list[str] = []
        if self.result.server_errors:
            out.append(f"{self.result.server_errors} answers with status >= 500")
        out.extend(self.result.failures)
        if self.children_after != self.children_before:
            out.append(f"manager children changed: {sorted(self.children_before)} -> {sorted(self.children_after)}")
        if self.growth > max_growth:
            out.append(f"RSS grew {self.growth / MIB:.1f} MiB after the warm-up (allowed {max_growth / MIB:.0f} MiB)")
        return out

    def rows(self) -> dict[str, object]:
        r = self.result
        return {
            "requests": f"{r.sent:,} in {r.seconds:.1f} s ({r.sent / max(r.seconds, 1e-9):,.0f}/s), "
            f"{r.reconnects} connections opened",
            "answers by status": ", ".join(f"{s}: {n:,}" for s, n in sorted(r.statuses.items())),
            "RSS of the manager tree": f"after warm-up {self.warm_rss / MIB:.1f} MiB, at the end "
            f"{self.final_rss / MIB:.1f} MiB ({self.growth / MIB:+.1f} MiB), peak {self.peak_rss / MIB:.1f} MiB",
            "manager children": f"{sorted(self.children_before)} before, {sorted(self.children_after)} after",
        }


def soak_manager(
    webhook_url: str,
    ca_file: str,
    root_pid: int,
    generator: Generator,
    *,
    count: int,
    warmup: float = 0.2,
    connections: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> SoakReport:
    """Soak the manager whose supervisor is `root_pid`; RSS is read when the warm-up share is done."""
    host, _, port = webhook_url.removeprefix("https://").partition(":")
    before = set(descendants(root_pid)) - {root_pid}
    warm_at = max(1000, int(count * warmup) // 1000 * 1000)
    marks: dict[str, int] = {}
    with RssSampler(root_pid) as rss:

        def on_progress(sent: int) -> None:
            if sent == warm_at:
                marks["warm"] = rss.total()
            if progress is not None:
                progress(sent, rss.total())

        result = run(host, int(port), ca_file, generator, count=count, connections=connections, on_progress=on_progress)
        time.sleep(1.0)  # let answers in flight finish and buffers go back
        final = rss.total()
    after = set(descendants(root_pid)) - {root_pid}
    return SoakReport(result, marks.get("warm", final), final, rss.peak, before, after)
