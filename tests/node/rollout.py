"""Helpers for rollouts on the real node: workloads behind a SidecarSet, a 50 ms sampler of what
the API server reports during a rollout, the checks made on those samples, and a pod-creation load.

The sampler reads the SidecarSet first and the pods second, over one kept-alive TLS connection,
every 50 ms. The order matters for the check that no pod is counted updated too early: the
controller wrote `status.updatedReadyPods` from what it saw at or before the SidecarSet read, and a
pod that really runs the new sidecar and is ready stays so, so the pods read afterwards must show
at least that many such pods. A pod counts as really updated only by what the kubelet reports of
the running container (the new image, a new imageID, ready), never by `observedGeneration`, which
the kubelet moves to the new spec while the old sidecar still runs and is ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tests.kube import builders, images
from tests.kube.adminrest import AdminRest, ApiError
from tests.kube.client import eventually
from tests.node.pods import app_container, http_probe, is_ready, statuses

SS_PATH = "/apis/sidecarctl.io/v1alpha1/sidecarsets"
SIDECAR = "proxy"
INTERVAL = 0.05


# -- objects ------------------------------------------------------------------------------------


def sidecarset(
    name: str, namespace: str, image: str, *, max_unavailable: int | str, app: str, resources: Any = None
) -> dict[str, Any]:
    sidecar: dict[str, Any] = {
        "name": SIDECAR,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "readinessProbe": http_probe(images.SIDECAR_PORT),
    }
    if resources is not None:
        sidecar["resources"] = resources
    strategy = {"type": "RollingUpdate", "maxUnavailable": max_unavailable}
    return builders.sidecarset(name, app=app, containers=[sidecar], namespace=namespace, updateStrategy=strategy)


def deployment(name: str, replicas: int, *, app: str, grace: int = 5) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {"terminationGracePeriodSeconds": grace, "containers": [app_container()]},
            },
        },
    }


@dataclasses.dataclass
class Workload:
    """A labelled namespace, a SidecarSet selecting `app` there, and a Deployment of it."""

    api: AdminRest
    namespace: str
    sidecarset: str
    app: str
    replicas: int
    max_unavailable: int

    @property
    def ss_path(self) -> str:
        return f"{SS_PATH}/{self.sidecarset}"

    @property
    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods?labelSelector=app%3D{self.app}"

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.api.get(self.pods_path)["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def image(self) -> str:
        image: str = self.api.get(self.ss_path)["spec"]["containers"][0]["image"]
        return image

    def set_image(self, image: str) -> float:
        """Patch the SidecarSet's sidecar image; returns the monotonic time of the patch."""
        patch = [
            {"op": "test", "path": "/spec/containers/0/name", "value": SIDECAR},
            {"op": "replace", "path": "/spec/containers/0/image", "value": image},
        ]
        at = time.monotonic()
        self.api.patch(self.ss_path, patch, "json")
        return at

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.api.get(self.ss_path).get("status") or {}
        return status


def create_workload(
    api: AdminRest,
    namespace: str,
    *,
    image: str,
    replicas: int,
    max_unavailable: int,
    grace: int = 5,
    app: str = "fleet",
    timeout: float = 120,
    resources: Any = None,
) -> Workload:
    """Label `namespace` for injection, create the SidecarSet and the Deployment, and wait until
    every pod is Ready with its sidecar and the SidecarSet counts them all updated and ready."""
    name = f"{app}-{namespace[-6:]}"
    api.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {"sidecar-injection": "enabled"}}})
    api.create(
        SS_PATH, sidecarset(name, namespace, image, max_unavailable=max_unavailable, app=app, resources=resources)
    )
    w = Workload(api, namespace, name, app, replicas, max_unavailable)

    def store_has_it() -> bool:  # the manager's webhook store sees the SidecarSet a moment after the write
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "labels": {"app": app}}}
        probe["spec"] = {"containers": [app_container()]}
        try:
            got = api.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
        except ApiError:
            return False
        return SIDECAR in [c["name"] for c in got["spec"]["containers"]]

    eventually(
        store_has_it, timeout=30, interval=0.2, what=f"SidecarSet {name} in the manager's store", retrying=(ApiError,)
    )
    api.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment(app, replicas, app=app, grace=grace))

    seen: dict[str, Any] = {}

    def all_ready() -> bool:
        pods = w.pods()
        status = w.status()
        seen.update(pods=len(pods), ready=sum(map(is_ready, pods)), status=status)
        seen["containers"] = sorted({",".join(c["name"] for c in p["spec"]["containers"]) for p in pods})
        seen["states"] = sorted(
            {
                f"{name}: {st.get('image')} {json.dumps(st.get('state'))[:200]}"
                for p in pods
                for name, st in statuses(p).items()
                if not st.get("ready")
            }
        )
        return (
            len(pods) == replicas
            and all(is_ready(p) for p in pods)
            and status.get("matchedPods") == replicas
            and status.get("updatedReadyPods") == replicas
        )

    try:
        eventually(
            all_ready,
            timeout=timeout,
            interval=0.2,
            what=f"{replicas} pods of {app} Ready and counted",
            retrying=(ApiError,),
        )
    except AssertionError as e:
        raise AssertionError(f"{e}; last seen: {seen}") from None
    return w


# -- sampling -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PodView:
    """What a sample keeps of one pod."""

    name: str
    uid: str
    ready: bool
    generation: int
    observed_generation: int
    spec_image: str
    image: str  # what the kubelet reports the sidecar container runs
    image_id: str
    sidecar_ready: bool
    running: bool
    restarts: int
    waiting: str  # reason, when the sidecar is waiting

    @classmethod
    def of(cls, pod: dict[str, Any]) -> PodView:
        spec = next(c for c in pod["spec"]["containers"] if c["name"] == SIDECAR)
        st = statuses(pod).get(SIDECAR) or {}
        state = st.get("state") or {}
        return cls(
            name=pod["metadata"]["name"],
            uid=pod["metadata"]["uid"],
            ready=is_ready(pod),
            generation=int(pod["metadata"].get("generation") or 0),
            observed_generation=int((pod.get("status") or {}).get("observedGeneration") or 0),
            spec_image=spec["image"],
            image=st.get("image", ""),
            image_id=st.get("imageID", ""),
            sidecar_ready=bool(st.get("ready")),
            running="running" in state,
            restarts=int(st.get("restartCount") or 0),
            waiting=(state.get("waiting") or {}).get("reason", ""),
        )

    def runs(self, image: str, old_ids: frozenset[str]) -> bool:
        """The kubelet reports the sidecar running `image` (a new imageID), ready, in a Ready pod."""
        return (
            self.image == image
            and bool(self.image_id)
            and self.image_id not in old_ids
            and self.running
            and self.sidecar_ready
            and self.ready
        )


@dataclasses.dataclass(frozen=True)
class Sample:
    t: float
    generation: int  # the SidecarSet's metadata.generation
    status: dict[str, Any]
    pods: tuple[PodView, ...]
    image: str = ""  # the SidecarSet's image for the sidecar, as read in this sample

    def counts_current_spec(self) -> bool:
        """The status was written for the SidecarSet's current spec (not the one before the patch)."""
        return int(self.status.get("observedGeneration") or 0) == self.generation

    def counts(self, target: str) -> bool:
        """The status counts pods against a spec with the `target` image: a sample taken while the
        patch to it was on its way reads the spec before it, whose status is current for that one."""
        return self.image == target and self.counts_current_spec()


class KeepAliveGet:
    """GETs over one kept-alive TLS connection (a new handshake per sample would cost ~10 ms)."""

    def __init__(self, api: AdminRest) -> None:
        url = urllib.parse.urlsplit(api.base)
        self.host, self.port, self.ctx = url.hostname or "127.0.0.1", url.port or 443, api.ctx
        self.conn: http.client.HTTPSConnection | None = None

    def get(self, path: str) -> Any:
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=10)
            try:
                self.conn.request("GET", path, headers={"Accept": "application/json"})
                resp = self.conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                continue
            if resp.status != 200:
                raise ApiError(resp.status, "GET", path, body.decode(errors="replace"))
            return json.loads(body)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Sampler:
    """Every 50 ms: the SidecarSet's status, then the workload's pods. Use as a context manager."""

    def __init__(self, workload: Workload, *, interval: float = INTERVAL) -> None:
        self.w = workload
        self.interval = interval
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        client = KeepAliveGet(self.w.api)
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    ss = client.get(self.w.ss_path)
                    pods = client.get(self.w.pods_path)["items"]
                except (OSError, http.client.HTTPException, ApiError) as e:
                    self.errors.append(f"{t:.2f}: {e}")
                else:
                    views = tuple(sorted((PodView.of(p) for p in pods), key=lambda v: v.name))
                    generation = int(ss["metadata"].get("generation") or 0)
                    spec = ss.get("spec") or {}
                    image = next(
                        (
                            str(c.get("image") or "")
                            for c in (*(spec.get("containers") or []), *(spec.get("initContainers") or []))
                            if c.get("name") == SIDECAR
                        ),
                        "",
                    )
                    self.samples.append(Sample(t, generation, ss.get("status") or {}, views, image))
                next_at += self.interval
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            client.close()

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def wait(self, check: Callable[[Sample], bool], *, timeout: float, what: str) -> Sample:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for s in self.samples[seen:]:
                if check(s):
                    return s
            seen = len(self.samples)
            time.sleep(self.interval / 2)
        last = self.latest()
        raise AssertionError(f"not within {timeout}s: {what}; last sample: {last}")


@dataclasses.dataclass
class RolloutReport:
    """What the samples of one rollout show."""

    samples: int
    max_not_ready: int  # pods not Ready in one sample
    max_in_flight: int  # pods patched to the target image that do not run it ready yet
    max_unavailable_seen: int  # pods not Ready or in flight
    early_counts: list[str]  # samples where the status counted more pods updated than really are
    fooling: int  # pod-samples: observedGeneration of the new spec while the old sidecar ran, ready
    done_at: float | None  # first sample: every pod really updated and the status counts them all
    max_gap: float  # longest time between two samples
    max_flapping: int  # pods in one sample that went not Ready on their own (see `analyse`)
    before_patch: int  # samples that still read the SidecarSet's spec from before the patch


def _instance(p: PodView) -> tuple[str, int, str]:
    """One run of a pod's sidecar container: a restart or an in-place upgrade makes a new one."""
    return p.uid, p.restarts, p.image_id


def flapping(s: Sample, seen_ready: set[tuple[str, int, str]], *, target: str, old_ids: frozenset[str]) -> set[str]:
    """Pods of `s` that are not Ready although the rollout has nothing to do with it: the same run
    of the sidecar was in a Ready pod in an earlier sample, and the pod either was not patched yet
    or already runs the target (a readiness probe that missed its timeout on a loaded node). A pod
    the controller patched and the kubelet has not restarted yet is never one of them: it still
    runs the old image."""
    return {
        p.name
        for p in s.pods
        if not p.ready
        and p.running
        and _instance(p) in seen_ready
        and (p.spec_image != target or (p.image == target and p.image_id not in old_ids))
    }


def _walk(
    samples: Sequence[Sample], *, target: str, old_ids: frozenset[str]
) -> Iterator[tuple[Sample, set[str], list[PodView]]]:
    """Each sample with its `flapping` pods and its pods in flight (patched to the target, not yet
    running it Ready, and not flapping): what `analyse` and `timeline` both go by."""
    seen_ready: set[tuple[str, int, str]] = set()
    for s in samples:
        flaps = flapping(s, seen_ready, target=target, old_ids=old_ids)
        seen_ready.update(_instance(p) for p in s.pods if p.ready and p.running)
        in_flight = [
            p for p in s.pods if p.spec_image == target and not p.runs(target, old_ids) and p.name not in flaps
        ]
        yield s, flaps, in_flight


def analyse(samples: Sequence[Sample], *, target: str, old_ids: frozenset[str], total: int) -> RolloutReport:
    """What the samples show. A pod that goes not Ready on its own (`flapping`) is not counted
    against the rollout's budget, which bounds what the controller takes down; the most such pods
    in one sample is reported so the test can show them."""
    max_not_ready = max_in_flight = max_unavailable = fooling = max_flapping = 0
    early: list[str] = []
    done_at = None
    for s, flaps, in_flight in _walk(samples, target=target, old_ids=old_ids):
        really = [p for p in s.pods if p.runs(target, old_ids)]
        not_ready = [p for p in s.pods if not p.ready and p.name not in flaps]
        max_flapping = max(max_flapping, len(flaps))
        max_not_ready = max(max_not_ready, len(not_ready))
        max_in_flight = max(max_in_flight, len(in_flight))
        max_unavailable = max(max_unavailable, len({p.name for p in not_ready} | {p.name for p in in_flight}))
        fooling += sum(
            1
            for p in s.pods
            if p.spec_image == target
            and p.generation > 1
            and p.observed_generation == p.generation
            and p.image != target
            and p.running
            and p.sidecar_ready
        )
        # Until the SidecarSet's status is written for the new spec its counters describe the old one.
        counted = int(s.status.get("updatedReadyPods") or 0) if s.counts(target) else 0
        # A pod that ran the target Ready and flapped since may have been counted while it was Ready.
        landed = len(really) + sum(1 for p in s.pods if p.name in flaps and p.spec_image == target)
        if counted > landed:
            early.append(f"t={s.t:.2f}: status updatedReadyPods={counted}, really updated and ready {landed}")
        if done_at is None and len(really) == total == len(s.pods) and counted == total:
            done_at = s.t
    gaps = [b.t - a.t for a, b in itertools.pairwise(samples)]
    return RolloutReport(
        len(samples),
        max_not_ready,
        max_in_flight,
        max_unavailable,
        early,
        fooling,
        done_at,
        max(gaps, default=0.0),
        max_flapping,
        sum(1 for s in samples if s.image != target),
    )


def timeline(
    samples: Sequence[Sample], *, target: str, old_ids: frozenset[str], marks: dict[str, float], limit: int = 80
) -> str:
    """The rollout sample by sample, one line per change, for a failure message: time from the first
    sample, pods patched and not yet running the target / really updated / not Ready (and which of
    those are `flapping`), the status counters, and `marks` (events such as a deletion) where they
    fall."""
    if not samples:
        return "(no samples)"
    t0, lines, last = samples[0].t, [], None
    pending = sorted(marks.items(), key=lambda kv: kv[1])
    for s, flaps, flying in _walk(samples, target=target, old_ids=old_ids):
        while pending and pending[0][1] <= s.t:
            name, at = pending.pop(0)
            lines.append(f"  {at - t0:6.2f}s --- {name}")
        in_flight = sorted(p.name[-5:] for p in flying)
        really = sum(p.runs(target, old_ids) for p in s.pods)
        not_ready = sum(not p.ready for p in s.pods)
        st = s.status
        status = (
            f"og={st.get('observedGeneration')}/{s.generation} "
            f"upd={st.get('updatedPods')} updReady={st.get('updatedReadyPods')}"
        )
        flapped = ",".join(sorted(n[-5:] for n in flaps))
        row = (tuple(in_flight), really, not_ready, flapped, status)
        if row != last:
            last = row
            lines.append(
                f"  {s.t - t0:6.2f}s in flight {len(in_flight)} {','.join(in_flight)} | really {really} | "
                f"not ready {not_ready}{f' (flapping {flapped})' if flapped else ''} | {status}"
            )
    lines += [f"  {at - t0:6.2f}s --- {name}" for name, at in pending]
    if len(lines) > limit:
        lines = [*lines[: limit // 2], "  ...", *lines[-limit // 2 :]]
    return "\n".join(lines)


# -- load -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Attempt:
    index: int
    started: float
    seconds: float
    error: str = ""


class PodLoad:
    """Creates pods at a fixed rate from worker threads until stopped; every API error is kept.

    The pods carry a scheduling gate: admission is what is measured, and hundreds of pods must not
    start on the one node.
    """

    def __init__(self, api: AdminRest, namespace: str, *, apps: Sequence[str], rate: float, workers: int = 16) -> None:
        self.api = api
        self.namespace = namespace
        self.apps = tuple(apps)  # pod i is labelled app=apps[i % len(apps)]
        self.rate = rate
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pod-load")
        self._futures: list[Future[None]] = []
        self._thread = threading.Thread(target=self._schedule, name="pod-load-clock", daemon=True)
        self.started = 0.0
        self.stopped = 0.0

    def body(self, index: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"load-{index:05d}", "labels": {"app": self.apps[index % len(self.apps)]}},
            "spec": {
                "schedulingGates": [{"name": "sidecarctl.io/admission-load"}],
                "terminationGracePeriodSeconds": 0,
                "containers": [app_container()],
            },
        }

    def _create(self, index: int) -> None:
        started = time.monotonic()
        error = ""
        try:
            self.api.create(f"/api/v1/namespaces/{self.namespace}/pods", self.body(index))
        except ApiError as e:
            error = str(e)
        except Exception as e:  # connection trouble counts as a failed creation too
            error = f"{type(e).__name__}: {e}"
        with self._lock:
            self.attempts.append(Attempt(index, started - self.started, time.monotonic() - started, error))

    def _schedule(self) -> None:
        index = 0
        while not self._stop.is_set():
            due = self.started + index / self.rate
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            self._futures.append(self._pool.submit(self._create, index))
            index += 1

    def start(self) -> PodLoad:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def made_since(self, t: float) -> int:
        """Attempts (finished) that started after the monotonic time `t`."""
        with self._lock:
            return sum(1 for a in self.attempts if self.started + a.started > t)

    def stop(self) -> list[Attempt]:
        self._stop.set()
        self._thread.join()
        self.stopped = time.monotonic()
        for f in self._futures:
            f.result()
        self._pool.shutdown()
        return sorted(self.attempts, key=lambda a: a.index)


@contextlib.contextmanager
def lease_watch(api: AdminRest, path: str, *, interval: float = INTERVAL) -> Iterator[list[tuple[float, str]]]:
    """Every change of the Lease's holder, with the monotonic time it was first seen."""
    changes: list[tuple[float, str]] = []
    stop = threading.Event()

    def run() -> None:
        client = KeepAliveGet(api)
        last = None
        try:
            while not stop.is_set():
                try:
                    holder = (client.get(path).get("spec") or {}).get("holderIdentity") or ""
                except (OSError, http.client.HTTPException, ApiError):
                    holder = last
                if holder != last and holder is not None:
                    changes.append((time.monotonic(), holder))
                    last = holder
                stop.wait(interval)
        finally:
            client.close()

    thread = threading.Thread(target=run, name="lease-watch", daemon=True)
    thread.start()
    try:
        yield changes
    finally:
        stop.set()
        thread.join(timeout=10)
