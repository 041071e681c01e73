"""The pod webhook waits for a reconnecting SidecarSet watch before it decides (injector.http.snapshotwait).

A SidecarSet created while the webhook's watch reconnects (a 410 from a kube-apiserver whose watch
cache started later, then a read of the whole state) reaches the store when the read finishes: a
pod that arrived meanwhile must get it. A watch that stays behind past the bound does not stop pod
creation: the pod is decided from the snapshot as it is, and the answer says so.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Coroutine
from typing import Any

import orjson

from injector.http import admission, decisions
from injector.http.decisions import WebhookSettings
from injector.http.snapshotwait import BEHIND_WARNING, SnapshotWait
from sidecarsets.store import TemplateStore
from tests.http.test_inject_app import NOW, pod, review, shop_store, sidecarset


def _inject(store: TemplateStore, wait: SnapshotWait) -> Coroutine[Any, Any, decisions.Decision]:
    """The pod webhook's decision on an `app: web` pod in the labelled namespace."""
    settings = WebhookSettings(clock=lambda: NOW, snapshot_wait=wait, replay=None)
    return decisions.inject(admission.parse(orjson.dumps(review(pod(app="web")))), store, settings)


def _decide(store: TemplateStore, wait: SnapshotWait, *, later: Any = None) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        task = asyncio.create_task(_inject(store, wait))
        await asyncio.sleep(0.05)
        assert not task.done(), "decided while the SidecarSet watch is behind"
        if later is not None:
            later()
        decision = await task
        answer: dict[str, Any] = orjson.loads(decision.body)["response"]
        return answer

    return asyncio.run(main())


def _containers(answer: dict[str, Any]) -> list[str]:
    ops = orjson.loads(base64.b64decode(answer["patch"])) if answer.get("patch") else []
    return [op["value"]["name"] for op in ops if op["path"].startswith("/spec/containers")]


def test_a_pod_arriving_while_the_watch_reconnects_gets_the_sidecarset_the_read_brings() -> None:
    store = shop_store()
    store.on_sidecarset("DELETED", sidecarset(), None)  # the snapshot before the watch failed
    current = asyncio.Event()

    def read_done() -> None:  # the whole state read again: the new SidecarSet, then current
        store.on_sidecarset("ADDED", None, sidecarset())
        current.set()

    answer = _decide(store, SnapshotWait([current], timeout=5.0), later=read_done)
    assert answer["allowed"] and "proxy" in _containers(answer)
    assert BEHIND_WARNING not in (answer.get("warnings") or [])


def test_a_watch_still_behind_after_the_bound_lets_the_pod_through_from_the_snapshot_with_a_warning() -> None:
    store = shop_store()
    answer = _decide(store, SnapshotWait([asyncio.Event()], timeout=0.2))
    assert answer["allowed"] and "proxy" in _containers(answer)  # what the snapshot holds
    assert BEHIND_WARNING in answer["warnings"]


def test_current_watches_cost_no_wait() -> None:
    store = shop_store()
    current = asyncio.Event()
    current.set()

    async def main() -> dict[str, Any]:
        decision = await asyncio.wait_for(_inject(store, SnapshotWait([current], timeout=5.0)), timeout=0.05)
        result: dict[str, Any] = orjson.loads(decision.body)["response"]
        return result

    answer = asyncio.run(main())
    assert "proxy" in _containers(answer) and not answer.get("warnings")
