"""A fake kubelet: moves pods through their lifecycle so controllers see what a node would report.

There is no container runtime here. For the namespaces it is told to manage, it binds pending
pods to a fake Node, reports them Running and Ready with containerStatuses as
`builders.container_status` shapes them (image, the imageID `builders.image_id` derives from it,
restartCount), and when a container's image changes in the spec it behaves like a kubelet
restarting that container: a short not-ready window, then the new image and imageID with
restartCount + 1. Images in `bad_images` never become ready (the restarted container stays
waiting in ImagePullBackOff). Pods being deleted are removed at once, as a kubelet would after
the containers stop, so namespace deletion completes.

Resources are reported as a 1.35 kubelet does: each container status carries the CPU and memory
it runs with, and a resize (`pods/resize` changing the spec) is applied `resize_delay` seconds
later without a restart (`PodResizeInProgress` meanwhile). For pods in `infeasible`
(namespace/name) it is not: the old values stay reported and the pod gets `PodResizePending` with
reason `Infeasible`, as on a node that cannot fit the new values.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from typing import Any

from kuberuntime import api, kubeapi
from kuberuntime.informer import Informer
from kuberuntime.jsontypes import JsonObj
from tests.kube.builders import container_status

log = logging.getLogger(__name__)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubelet:
    def __init__(self, client: kubeapi.KubeClient, *, node: str = "fake-node-1", restart_delay: float = 0.3) -> None:
        self.client = client
        self.node = node
        self.restart_delay = restart_delay
        self.namespaces: set[str] = set()
        self.bad_images: set[str] = set()
        self.infeasible: set[str] = set()  # namespace/name of pods whose resizes the node cannot fit
        self.resize_delay = 0.0
        # (ns, pod uid, container) → monotonic time at which its resize is applied
        self._resizing: dict[tuple[str, str, str], float] = {}
        # (ns, pod uid, container) → monotonic time until which the container shows as restarting
        self._restarting: dict[tuple[str, str, str], float] = {}
        # (ns, pod uid, container) → the status this kubelet last reported for it
        self._running: dict[tuple[str, str, str], JsonObj] = {}
        self._pending: set[str] = set()
        self._dirty: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self.informer: Informer[JsonObj] = Informer(
            client, "/api/v1/pods", name="fake-kubelet", transform=lambda o: o, handler=self._on_event
        )
        self.patches = 0

    async def start(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node, "type": "fake"}},
        }
        with contextlib.suppress(api.Conflict):
            await self.client.create("/api/v1/nodes", node)
        status = {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "FakeKubelet", "lastHeartbeatTime": _now()}
                ],
                "allocatable": {"cpu": "1000", "memory": "1000Gi", "pods": "100000"},
                "capacity": {"cpu": "1000", "memory": "1000Gi", "pods": "100000"},
            }
        }
        await self.client.patch(f"/api/v1/nodes/{self.node}/status", status, patch_type="strategic")
        self._task = asyncio.create_task(self.informer.run(self._stop))
        await self.informer.synced.wait()

    async def stop(self) -> None:
        """Stop watching and every pod sync in flight or scheduled: a stopped kubelet whose API
        server is gone must not go on retrying (and logging) into the tests that follow."""
        self._stop.set()
        self._task.cancel()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_event(self, kind: str, old: Any, new: Any) -> None:
        if kind == "DELETED" or new is None:
            uid = ((old or {}).get("metadata") or {}).get("uid")
            for key in [k for k in self._running if k[1] == uid]:
                del self._running[key]
            return
        meta = new.get("metadata") or {}
        if meta.get("namespace") not in self.namespaces:
            return
        self.kick(f"{meta['namespace']}/{meta['name']}")

    def kick(self, key: str, delay: float = 0.0) -> None:
        """Schedule a sync of one pod; a sync already running re-runs once it is done."""
        if self._stop.is_set():
            return
        loop = asyncio.get_running_loop()
        if delay > 0:
            loop.call_later(delay, self.kick, key)
            return
        if key in self._pending:
            self._dirty.add(key)
            return
        self._pending.add(key)
        task = loop.create_task(self._sync(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sync(self, key: str) -> None:
        retry: float | None = None
        try:
            pod = self.informer.store.get(key)
            if pod is not None:
                retry = await self._reconcile(pod)
        except api.NotFound:
            pass
        except api.ApiError as e:
            if e.status not in (409, 422):
                log.warning("fake kubelet: %s: %s", key, e)
            retry = 0.1
        except Exception:
            log.exception("fake kubelet: %s", key)
            retry = 0.5
        finally:
            self._pending.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.kick(key)
        elif retry is not None:
            self.kick(key, retry)

    async def _reconcile(self, pod: JsonObj) -> float | None:
        """Move the pod one step; return seconds until it needs another look, if it does."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        ns, name = meta["namespace"], meta["name"]
        path = f"/api/v1/namespaces/{ns}/pods/{name}"
        if meta.get("deletionTimestamp"):
            options = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
            await self.client.request("DELETE", path, body=options)
            return None
        if not spec.get("nodeName"):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
            }
            await self.client.create(f"{path}/binding", binding)
            return None
        if spec.get("nodeName") != self.node:
            return None
        status, next_check = self._desired_status(pod)
        if status is not None:
            # Strategic merge, like a kubelet: conditions merge by type, so others' conditions
            # (e.g. SidecarSetUpgradable) survive.
            await self.client.patch(f"{path}/status", {"status": status}, patch_type="strategic")
            self.patches += 1
        return next_check

    def _container_status(
        self, ns: str, pod_uid: str, c: JsonObj, prev: JsonObj | None, now_mono: float, *, resizable: bool = True
    ) -> tuple[JsonObj, float | None]:
        name, image = c["name"], c.get("image", "")
        rkey = (ns, pod_uid, name)
        # Like a real kubelet, what runs is known locally: the informer's copy of our own last
        # status write may lag, and acting on it would restart a container a second time.
        prev = self._running.get(rkey, prev)
        restarts = int((prev or {}).get("restartCount", 0))
        started = (((prev or {}).get("state") or {}).get("running") or {}).get("startedAt") or _now()
        if prev is not None and prev.get("image") != image:
            # The spec image changed: the kubelet kills the container and starts the new image.
            if rkey not in self._restarting:
                self._restarting[rkey] = now_mono + self.restart_delay
            until = self._restarting[rkey]
            if now_mono < until:
                st = {**prev, "ready": False, "started": False}
                st["state"] = {"waiting": {"reason": "ContainerCreating"}}
                return st, until - now_mono
            del self._restarting[rkey]
            restarts += 1
            started = _now()
        if image in self.bad_images:
            waiting = {"reason": "ImagePullBackOff", "message": f"fake: image {image} is bad"}
            st = container_status(
                name, image, ready=False, restarts=restarts, imageID="", started=False, state={"waiting": waiting}
            )
        else:
            st = container_status(
                name,
                image,
                restarts=restarts,
                containerID=f"fake://{ns}/{pod_uid}/{name}/{restarts}",
                started=True,
                state={"running": {"startedAt": started}},
            )
        # What it runs with: the spec's resources once a resize is applied; on a node that cannot fit
        # it, the last ones.
        asked, before = c.get("resources") or {}, (prev or {}).get("resources") or {}
        applied, wait = asked, None
        if prev is not None and asked != before:
            if not resizable:
                applied = before
            else:
                until = self._resizing.setdefault(rkey, now_mono + self.resize_delay)
                if now_mono < until:
                    applied, wait = before, until - now_mono
                else:
                    del self._resizing[rkey]
        if applied:
            st["resources"] = applied
        self._running[rkey] = st
        return st, wait

    def _desired_status(self, pod: JsonObj) -> tuple[JsonObj | None, float | None]:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        ns = meta["namespace"]
        now_mono = asyncio.get_running_loop().time()
        prev_by_name = {s.get("name"): s for s in status.get("containerStatuses") or []}
        statuses: list[JsonObj] = []
        next_check: float | None = None
        resizable = f"{ns}/{meta['name']}" not in self.infeasible
        for c in spec.get("containers") or []:
            prev = prev_by_name.get(c["name"])
            st, wait = self._container_status(ns, meta["uid"], c, prev, now_mono, resizable=resizable)
            statuses.append(st)
            if wait is not None:
                next_check = min(wait, next_check or wait)
        init_statuses = []
        for c in spec.get("initContainers") or []:
            if c.get("restartPolicy") == "Always":  # native sidecar: keeps running
                prev_init = {s.get("name"): s for s in status.get("initContainerStatuses") or []}
                prev = prev_init.get(c["name"])
                st, wait = self._container_status(ns, meta["uid"], c, prev, now_mono, resizable=resizable)
                init_statuses.append(st)
                if wait is not None:
                    next_check = min(wait, next_check or wait)
            else:
                completed = {"terminated": {"exitCode": 0, "reason": "Completed"}}
                init_statuses.append(container_status(c["name"], c.get("image", ""), state=completed))
        ready = all(s["ready"] for s in statuses) and all(s["ready"] for s in init_statuses)
        old_conds = {c.get("type"): c for c in status.get("conditions") or []}

        def cond(kind: str, value: bool) -> JsonObj:
            text = "True" if value else "False"
            prev = old_conds.get(kind)
            since = prev.get("lastTransitionTime") if prev and prev.get("status") == text else _now()
            return {"type": kind, "status": text, "lastTransitionTime": since}

        desired: JsonObj = {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": "10.244.0.1",
            "startTime": status.get("startTime") or _now(),
            "conditions": [
                cond("PodScheduled", True),
                cond("Initialized", True),
                cond("ContainersReady", ready),
                cond("Ready", ready),
            ],
            "containerStatuses": statuses,
        }
        if init_statuses:
            desired["initContainerStatuses"] = init_statuses
        # Only running containers are resized: a completed init container (its status carries no
        # resources) is never behind, or a pod with one would show PodResizeInProgress for ever.
        running = [
            *spec.get("containers", []),
            *(c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"),
        ]
        asked = {c["name"]: c.get("resources") or {} for c in running}
        behind = [
            s["name"]
            for s in [*statuses, *init_statuses]
            if s["name"] in asked and (s.get("resources") or {}) != asked[s["name"]]
        ]
        if behind and not resizable:
            message = f"Node didn't have enough capacity for {', '.join(behind)} (fake kubelet)"
            pending = {"type": "PodResizePending", "status": "True", "reason": "Infeasible", "message": message}
            since = (old_conds.get("PodResizePending") or {}).get("lastTransitionTime") or _now()
            desired["conditions"].append({**pending, "lastTransitionTime": since})
        elif behind or "PodResizeInProgress" in old_conds:
            desired["conditions"].append(cond("PodResizeInProgress", bool(behind)))
        current = {k: status.get(k) for k in desired}
        current["conditions"] = [{k: (old_conds.get(c["type"]) or {}).get(k) for k in c} for c in desired["conditions"]]
        if current == desired:
            return None, next_check
        return desired, next_check
