"""`sidecarctl preview` predicts the batches the controller then runs, and writes nothing;
`sidecarctl status` reports the rollout while it runs and after.

20 pods in four zones, three of them canaries; a SidecarSet with partition 4, maxUnavailable 3, a
weight priority (canaries first, then zone z0) and a scatter over every zone. The preview runs as a
subprocess against the real API server (its requests are told apart in the audit log by their
User-Agent), then the new image is applied and the controller's pod patches are read from the audit
log, in order, and grouped into batches.

The preview's batches assume each batch comes back ready before the next is planned. A node whose
pods come back one at a time lets the controller plan in between, with smaller batches, and the
scatter order depends on how many pods are left; so the test makes each batch come back at once:
the new image is a "bad" image for the fake kubelet (the patched pods stay not ready and the
controller waits with its budget spent), and between batches the rollout is paused, the batch's pods
are let become ready, and the rollout is resumed. `paused` changes no hash and no revision.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from sidecarsets.spec import names
from tests.e2e.helpers import (
    SS_PATH,
    image_of,
    make_pod,
    pods,
    ready,
    set_image,
    sidecarctl,
    status_of,
    wait_injecting,
    wait_status,
)
from tests.kube.audit import audit_events
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import RunningManager

APP = "pvw"
PODS = 20
MAX_UNAVAILABLE = 3
PARTITION = 4
NEW_IMAGE = "proxy:preview-2"
CANARIES = (3, 10, 17)
STRATEGY = {
    "maxUnavailable": MAX_UNAVAILABLE,
    "partition": PARTITION,
    "priorityStrategy": {
        "weightPriority": [
            {"weight": 100, "matchSelector": {"matchLabels": {"tier": "canary"}}},
            {"weight": 10, "matchSelector": {"matchLabels": {"zone": "z0"}}},
        ]
    },
    "scatterStrategy": [{"key": "zone", "value": "*"}],
}
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def _when(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()


def patched_batches(cp: ControlPlane, start: int, namespace: str, gap: float = 0.5) -> list[list[str]]:
    """The controller's successful image patches of pods in `namespace`, in the order they were
    received, cut into batches where more than `gap` seconds pass between two."""
    patches = sorted(
        (
            e
            for e in audit_events(cp, start)
            if e["verb"] == "patch"
            and (e.get("objectRef") or {}).get("resource") == "pods"
            and not (e.get("objectRef") or {}).get("subresource")
            and (e.get("objectRef") or {}).get("namespace") == namespace
            and (e.get("responseStatus") or {}).get("code", 0) < 300
        ),
        key=_when,
    )
    batches: list[list[str]] = []
    last = None
    for e in patches:
        if last is None or _when(e) - last > gap:
            batches.append([])
        batches[-1].append(f"{namespace}/{e['objectRef']['name']}")
        last = _when(e)
    return batches


def with_new_image(kube: Kube, ns: str) -> set[str]:
    return {p["metadata"]["name"] for p in pods(kube, ns, APP) if image_of(p, "proxy") == NEW_IMAGE}


def next_wave(kube: Kube, ns: str, done: set[str], *, settle: float = 1.5, timeout: float = 10.0) -> set[str]:
    """The pods the controller patches next: waited for until none is added for `settle` seconds;
    empty when none comes within `timeout` (the partition holds the rest)."""
    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    since = time.monotonic()
    while True:
        now = with_new_image(kube, ns) - done
        if now != seen:
            seen, since = now, time.monotonic()
        if seen and time.monotonic() - since >= settle:
            return seen
        if not seen and time.monotonic() > deadline:
            return set()
        time.sleep(0.1)


def set_paused(kube: Kube, name: str, paused: bool) -> None:
    obj = kube.patch(f"{SS_PATH}/{name}", {"spec": {"updateStrategy": {"paused": paused}}})
    generation = obj["metadata"]["generation"]
    eventually(
        lambda: status_of(kube, name).get("observedGeneration") == generation,
        timeout=20,
        what=f"the controller observed paused={paused}",
    )


def status_json(cp: ControlPlane, name: str) -> dict[str, Any]:
    proc = sidecarctl("status", name, "--kubeconfig", str(cp.kubeconfig), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_preview_predicts_the_batches_and_writes_nothing(
    aloop: BackgroundLoop,
    control_plane: ControlPlane,
    kube: Kube,
    manager: RunningManager,
    kubelet: FakeKubelet,
    injected_ns: str,
    sidecarsets: Callable[..., dict[str, Any]],
    tmp_path: Path,
) -> None:
    ns, cp = injected_ns, control_plane
    ss = sidecarsets(APP, initContainers=[], updateStrategy=STRATEGY)
    name = ss["metadata"]["name"]
    wait_injecting(kube, ns, APP, lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    for i in range(PODS):
        labels = {"zone": f"z{i % 4}", **({"tier": "canary"} if i in CANARIES else {})}
        kube.create(f"/api/v1/namespaces/{ns}/pods", make_pod(f"{APP}-{i:02d}", APP, **labels))
    eventually(
        lambda: len(got := pods(kube, ns, APP)) == PODS and all(ready(p) for p in got), timeout=60, what="20 pods Ready"
    )
    wait_status(kube, name, matchedPods=PODS, updatedPods=PODS, readyPods=PODS, timeout=60)

    # -- the preview -------------------------------------------------------------------------
    stored = kube.get(f"{SS_PATH}/{name}")
    spec = json.loads(json.dumps(stored["spec"]))
    spec["containers"][0]["image"] = NEW_IMAGE
    manifest = tmp_path / "sidecarset.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {"apiVersion": names.API_VERSION, "kind": "SidecarSet", "metadata": {"name": name}, "spec": spec}
        )
    )
    versions = {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods(kube, ns, APP)}
    before = cp.audit_log.stat().st_size
    started = time.time()
    proc = sidecarctl("preview", "-f", str(manifest), "--kubeconfig", str(cp.kubeconfig), "-o", "json")
    finished = time.time()
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    doc = json.loads(proc.stdout)
    text = sidecarctl("preview", "-f", str(manifest), "--kubeconfig", str(cp.kubeconfig))
    assert text.returncode == 0, text.stderr
    print(f"\n--- sidecarctl preview -f sidecarset.yaml\n{text.stdout}---", flush=True)

    predicted = [b["pods"] for b in doc["rollout"]["batches"]]
    assert doc["new"] is False and doc["inPlace"] is True
    assert doc["rollout"]["matched"] == PODS and doc["rollout"]["maxUnavailable"] == MAX_UNAVAILABLE
    assert [len(b) for b in predicted] == [3, 3, 3, 3, 3, 1]
    assert doc["rollout"]["end"]["stage"] == "partition" and len(doc["rollout"]["kept"]) == PARTITION
    canaries = {f"{ns}/{APP}-{i:02d}" for i in CANARIES}
    assert set(predicted[0]) == canaries, "priority: the canaries go first"
    assert doc["newPods"] and all(p["containers"][0]["image"] == NEW_IMAGE for p in doc["newPods"])

    # It wrote nothing: no write request with its User-Agent, and every pod as it was.
    time.sleep(1.0)  # the audit backend writes an event once the response is sent
    mine = [e for e in audit_events(cp, before) if e.get("userAgent", "").startswith("sidecarctl-preview")]
    assert mine, "the preview's requests are in the audit log"
    assert {e["verb"] for e in mine} <= {"get", "list"}, sorted({e["verb"] for e in mine})
    assert not [e for e in mine if e["verb"] in WRITES]
    during = [
        e
        for e in audit_events(cp, before)
        if e["verb"] in WRITES and started <= _when(e) <= finished and (e.get("objectRef") or {}).get("namespace") == ns
    ]
    assert during == [], f"writes in the test namespace while the preview ran: {during}"
    assert {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in pods(kube, ns, APP)} == versions

    # -- the rollout, one batch at a time -------------------------------------------------------
    rollout_start = cp.audit_log.stat().st_size
    waves: list[set[str]] = []
    done: set[str] = set()
    checked_status = False
    kubelet.bad_images.add(NEW_IMAGE)
    try:
        set_image(kube, name, NEW_IMAGE)
        for _ in range(len(predicted) + 2):
            wave = next_wave(kube, ns, done)
            if not wave:
                break
            waves.append(wave)
            done |= wave
            if len(waves) == 2 and not checked_status:
                # During the rollout: batch 2 is upgrading (its pods do not come up yet).
                wait_status(kube, name, updatedPods=len(done), readyPods=PODS - len(wave), timeout=20)
                st = status_json(cp, name)
                assert st["counts"]["matchedPods"] == PODS
                assert st["counts"]["updatedPods"] == len(done)
                assert st["counts"]["readyPods"] == PODS - len(wave)
                assert {u["pod"] for u in st["upgrading"]} == {f"{ns}/{n}" for n in wave}
                assert all("ImagePullBackOff" in u["reason"] for u in st["upgrading"]), st["upgrading"]
                assert st["stage"] == "waiting", st
                shown = sidecarctl("status", name, "--kubeconfig", str(cp.kubeconfig))
                assert shown.returncode == 0 and "Upgrading now (3):" in shown.stdout, shown.stdout + shown.stderr
                print(f"\n--- sidecarctl status {name} (batch 2 upgrading)\n{shown.stdout}---", flush=True)
                checked_status = True
            set_paused(kube, name, True)
            kubelet.bad_images.discard(NEW_IMAGE)

            async def kick(batch: set[str] = wave) -> None:
                for pod_name in batch:
                    kubelet.kick(f"{ns}/{pod_name}")

            aloop.run(kick())
            wait_status(kube, name, updatedPods=len(done), readyPods=PODS, updatedReadyPods=len(done), timeout=30)
            kubelet.bad_images.add(NEW_IMAGE)
            set_paused(kube, name, False)
    finally:
        kubelet.bad_images.discard(NEW_IMAGE)
    time.sleep(1.0)
    actual = patched_batches(cp, rollout_start, ns)
    print(
        f"\npreview batches: {[sorted(b) for b in predicted]}\n"
        f"patched batches (audit log): {[sorted(b) for b in actual]}\n"
        f"waves seen on the pods: {[sorted(w) for w in waves]}",
        flush=True,
    )
    assert [set(b) for b in actual] == [set(b) for b in predicted]
    assert [{f"{ns}/{n}" for n in w} for w in waves] == [set(b) for b in predicted]
    assert sum(len(b) for b in actual) == len({k for b in actual for k in b}), "a pod patched twice"

    # -- after it ---------------------------------------------------------------------------------
    upgraded = sum(len(b) for b in predicted)
    wait_status(kube, name, matchedPods=PODS, updatedPods=upgraded, readyPods=PODS, updatedReadyPods=upgraded)
    st = status_json(cp, name)
    assert st["counts"] == {
        "matchedPods": PODS,
        "updatedPods": upgraded,
        "readyPods": PODS,
        "updatedReadyPods": upgraded,
    }
    assert st["live"] == st["counts"]
    assert st["stage"] == "partition" and st["upgrading"] == [] and st["notUpgradable"] == []
    assert st["observedGeneration"] == st["generation"]
    one = sidecarctl("status", name, "--kubeconfig", str(cp.kubeconfig))
    every = sidecarctl("status", "--kubeconfig", str(cp.kubeconfig))
    assert one.returncode == 0 and every.returncode == 0, one.stderr + every.stderr
    row = next(line for line in every.stdout.splitlines() if line.startswith(name + " "))
    assert row.split()[1:4] == [str(PODS), str(upgraded), str(PODS)]
    print(f"\n--- sidecarctl status {name}\n{one.stdout}--- sidecarctl status\n{every.stdout}---", flush=True)
