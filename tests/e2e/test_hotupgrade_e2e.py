"""HotUpgrade against the real API server: injected as the `<n>-1` / `<n>-2` pair, then rolled.

Pods created through the webhook get the pair (the real image and the empty one) with the version
and working annotations, and the API server's defaults on top (the version vars' fieldRef gets
`apiVersion: v1`). A new image is then rolled out over the fake kubelet, which restarts a
container whose image changed with a not-ready window: sampled every 50 ms, every pod keeps a
ready container of the pair on a real image (the old or the new one) until the rollout ends with
the serving container on the new image and the idle one on the empty image.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from sidecarsets.spec import names
from tests.e2e.helpers import create_ready_pods, pods, ready, set_image, wait_injecting, wait_status
from tests.kube.client import Kube
from tests.kube.fakekubelet import FakeKubelet
from tests.kube.managerharness import RunningManager

EMPTY = "empty:1"
OLD, NEW = "envoy:1", "envoy:2"
PAIR = ("envoy-1", "envoy-2")
COUNT = 5
VERSION_KEYS = (names.ANN_VERSION_PREFIX, names.ANN_VERSION_ALT_PREFIX)


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"]["containers"]}


def _statuses(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}


def _working(pod: dict[str, Any]) -> str:
    value = orjson.loads(pod["metadata"]["annotations"][names.ANN_WORKING_HOT])
    return str(value["envoy"])


def _version_env(container: str) -> list[dict[str, Any]]:
    return [
        {
            "name": env,
            "valueFrom": {
                "fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{prefix}{container}']"}
            },
        }
        for env, prefix in (
            (names.ENV_SIDECARSET_VERSION, names.ANN_VERSION_PREFIX),
            (names.ENV_SIDECARSET_VERSION_ALT, names.ANN_VERSION_ALT_PREFIX),
        )
    ]


def _serving(pod: dict[str, Any]) -> list[str]:
    """The containers of the pair that the kubelet reports ready on a real image."""
    st = _statuses(pod)
    return [c for c in PAIR if c in st and st[c]["ready"] and st[c]["image"] in (OLD, NEW)]


def _rolled(pod: dict[str, Any]) -> bool:
    """The serving container is on NEW, the idle one on the empty image, in the spec and as run."""
    spec, st = _containers(pod), _statuses(pod)
    work = _working(pod)
    idle = PAIR[1] if work == PAIR[0] else PAIR[0]
    return (
        spec[work]["image"] == NEW
        and spec[idle]["image"] == EMPTY
        and all(c in st and st[c]["ready"] for c in PAIR)
        and st[work]["image"] == NEW
        and st[idle]["image"] == EMPTY
        and ready(pod)
    )


def test_hot_upgrade_injects_the_pair_and_rolls_a_new_image_with_one_container_always_serving(
    kube: Kube,
    injected_ns: str,
    manager: RunningManager,
    kubelet: FakeKubelet,
    sidecarsets: Callable[..., dict[str, Any]],
) -> None:
    ss = sidecarsets(
        "hot",
        initContainers=[],
        containers=[
            {
                "name": "envoy",
                "image": OLD,
                "env": [{"name": "LOG_LEVEL", "value": "info"}],
                "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": EMPTY},
            }
        ],
        updateStrategy={"type": "RollingUpdate", "maxUnavailable": "100%"},
    )
    name = ss["metadata"]["name"]
    wait_injecting(kube, injected_ns, "hot", lambda p: "envoy-1" in _containers(p))

    created = create_ready_pods(kube, injected_ns, "hot", COUNT)
    for pod in created:
        where = pod["metadata"]["name"]
        assert [c["name"] for c in pod["spec"]["containers"]] == ["envoy-1", "envoy-2", "app"], where
        first, second = (_containers(pod)[c] for c in PAIR)
        assert (first["image"], second["image"]) == (OLD, EMPTY), where
        base = [{"name": "LOG_LEVEL", "value": "info"}, {"name": names.ENV_IS_INJECTED, "value": "true"}]
        assert first["env"] == [*base, *_version_env("envoy-1")], where
        assert second["env"] == [*base, *_version_env("envoy-2")], where
        annotations = pod["metadata"]["annotations"]
        assert annotations[names.ANN_WORKING_HOT] == '{"envoy":"envoy-1"}', where
        assert [annotations[f"{p}envoy-{i}"] for i in (1, 2) for p in VERSION_KEYS] == ["1", "0", "0", "1"], where
        assert orjson.loads(annotations[names.ANN_HASH])[name]["sidecarList"] == ["envoy"], where
        assert annotations[names.ANN_INJECTED_BY] == names.INJECTED_BY_WEBHOOK, where
    wait_status(kube, name, matchedPods=COUNT, updatedPods=COUNT, readyPods=COUNT, updatedReadyPods=COUNT)

    restarts_before = {p["metadata"]["name"]: {c: _statuses(p)[c]["restartCount"] for c in PAIR} for p in created}
    t0 = time.monotonic()
    set_image(kube, name, NEW)
    samples = 0
    seen_new_serving = False
    seen_restarting = 0  # samples with a container of some pair not ready: the swaps were watched
    deadline = t0 + 60
    while True:
        got = pods(kube, injected_ns, "hot")
        assert len(got) == COUNT
        samples += 1
        for pod in got:
            serving = _serving(pod)
            assert serving, (
                f"sample {samples}: {pod['metadata']['name']} has no ready container of the pair on a real image: "
                f"{_statuses(pod)}"
            )
            st = _statuses(pod)
            seen_new_serving |= any(st[c]["image"] == NEW for c in serving)
        seen_restarting += any(not _statuses(p)[c]["ready"] for p in got for c in PAIR)
        if all(_rolled(p) for p in got):
            break
        assert time.monotonic() < deadline, f"rollout not done in 60 s: {[_statuses(p) for p in got]}"
        time.sleep(0.05)
    rolled = time.monotonic() - t0
    assert seen_new_serving and seen_restarting, (samples, seen_restarting)
    final = wait_status(kube, name, matchedPods=COUNT, updatedPods=COUNT, readyPods=COUNT, updatedReadyPods=COUNT)
    settled = time.monotonic() - t0
    assert final["updatedPods"] == COUNT and final["updatedReadyPods"] == COUNT

    for pod in got:
        where = pod["metadata"]["name"]
        annotations = pod["metadata"]["annotations"]
        assert _working(pod) == "envoy-2", where
        # As Kruise: the upgraded container's version is the SidecarSet's resourceVersion at the
        # upgrade, which its partner also records as its alt; the flip zeroes the emptied one.
        version = annotations[names.ANN_VERSION_PREFIX + "envoy-2"]
        assert version.isdigit() and version not in ("0", "1"), where
        assert [annotations[f"{p}envoy-{i}"] for i in (1, 2) for p in VERSION_KEYS] == ["0", version, version, "0"], (
            where
        )
        st = _statuses(pod)
        # Each container of the pair restarted once: -2 onto NEW, then -1 onto the empty image.
        assert {c: st[c]["restartCount"] - restarts_before[where][c] for c in PAIR} == {"envoy-1": 1, "envoy-2": 1}
        assert st["app"]["restartCount"] == 0, "the app container is never touched"
    print(
        f"\nhot upgrade of {COUNT} pods: every pair on {NEW} + {EMPTY} in {rolled:.2f}s "
        f"({samples} samples, {seen_restarting} during a container restart; status {settled:.2f}s; "
        f"kubelet restart delay {kubelet.restart_delay}s)"
    )
