"""Per-pod overrides on the real API server: injected merged, refused through kubectl with their
messages, a re-annotated running pod resized in place by the controller, rollouts that keep them.

The session's manager (--injection=auto: policies serve the plain pods, the webhook those asking
for overrides) and the fake kubelet (tests/kube/fakekubelet.py), which applies a `pods/resize`
without a restart and reports the values in the container's status.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import yaml

from sidecarsets.pods.resizestate import same_quantity
from sidecarsets.spec import names
from tests.e2e.helpers import (
    SS_PATH,
    container_status,
    kubectl,
    make_pod,
    pods,
    ready,
    set_image,
    upgradable,
    wait_injecting,
    wait_status,
)
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane
from tests.kube.fakekubelet import FakeKubelet

RESOURCES = {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}
ENV = [{"name": "LOG_LEVEL", "value": "info"}, {"name": "ZONE", "value": "eu-1"}]
BOUNDS = [
    {
        "containerName": "proxy",
        "resources": {"cpu": {"min": "50m", "max": "1"}, "memory": {"min": "16Mi", "max": "256Mi"}},
        "env": ["LOG_LEVEL"],
    }
]


def _mesh(sidecarsets: Callable[..., dict[str, Any]], app: str, *others: dict[str, Any], **spec: Any) -> str:
    """The SidecarSet of `app`: the proxy (with BOUNDS unless `overrides` is given), then `others`."""
    proxy = {"name": "proxy", "image": "proxy:1", "resources": RESOURCES, "env": ENV}
    spec.setdefault("updateStrategy", {"type": "RollingUpdate", "maxUnavailable": "100%"})
    spec.setdefault("overrides", BOUNDS)
    ss = sidecarsets(app, initContainers=[], containers=[proxy, *others], **spec)
    return str(ss["metadata"]["name"])


def _pod(name: str, app: str, asked: Any) -> dict[str, Any]:
    p = make_pod(name, app)
    if asked is not None:
        p["metadata"]["annotations"] = {names.ANN_OVERRIDES: json.dumps(asked)}
    return p


def _proxy(pod: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in pod["spec"]["containers"] if c["name"] == "proxy"), {})


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two `resources` objects with the same values (the API server writes quantities canonically)."""
    sections = set(a) | set(b)
    return all(
        set(a.get(s, {})) == set(b.get(s, {})) and all(same_quantity(str(v), str(b[s][k])) for k, v in a[s].items())
        for s in sections
    )


def _merged(asked: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The proxy's resources and env as the SidecarSet's with the fields `asked` names replaced."""
    resources = json.loads(json.dumps(RESOURCES))
    for section, values in (asked.get("proxy", {}).get("resources") or {}).items():
        resources[section].update(values)
    env = {e["name"]: e["value"] for e in ENV}
    env.update({e["name"]: e["value"] for e in asked.get("proxy", {}).get("env") or []})
    return resources, {**env, names.ENV_IS_INJECTED: "true"}


def _ready_pods(kube: Kube, ns: str, app: str, asks: list[Any]) -> list[dict[str, Any]]:
    for i, asked in enumerate(asks):
        kube.create(f"/api/v1/namespaces/{ns}/pods", _pod(f"{app}-{i}", app, asked))

    def all_ready() -> list[dict[str, Any]] | None:
        got = pods(kube, ns, app)
        return got if len(got) == len(asks) and all(ready(p) for p in got) else None

    return eventually(all_ready, timeout=60, what=f"{len(asks)} {app} pods Ready")


PROBE = {"proxy": {"env": [{"name": "LOG_LEVEL", "value": "probe"}]}}


def _wait_ready_mesh(kube: Kube, ns: str, app: str) -> None:
    """Dry-run creates until both paths serve the new SidecarSet: a plain pod (the policy's or the
    webhook's) and a pod asking for an override (the webhook's, with the override applied)."""
    wait_injecting(kube, ns, app, lambda p: _proxy(p).get("image") == "proxy:1")

    def attempt() -> dict[str, Any]:
        p = kube.create(f"/api/v1/namespaces/{ns}/pods", _pod("probe", app, PROBE), dryRun="All")
        env = {e["name"]: e.get("value") for e in _proxy(p).get("env") or []}
        annotations = p["metadata"].get("annotations") or {}
        assert env.get("LOG_LEVEL") == "probe", f"last pod: {_proxy(p)}, {annotations}"
        assert annotations.get(names.ANN_INJECTED_BY) == names.INJECTED_BY_WEBHOOK, annotations
        return p

    eventually(attempt, timeout=20, interval=0.05, what="the webhook applies an override of the new SidecarSet")


FIVE: list[dict[str, Any]] = [
    {"proxy": {"resources": {"limits": {"cpu": "500m"}}}},
    {"proxy": {"resources": {"requests": {"memory": "48Mi"}}}},
    {"proxy": {"env": [{"name": "LOG_LEVEL", "value": "debug"}]}},
    {"proxy": {"resources": {"requests": {"cpu": "300m"}, "limits": {"cpu": "1"}}}},
    {"proxy": {"resources": {"limits": {"memory": "128Mi"}}, "env": [{"name": "LOG_LEVEL", "value": "trace"}]}},
]


def test_allowed_overrides_are_injected_with_exactly_the_merged_values(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    _mesh(sidecarsets, "merge")
    _wait_ready_mesh(kube, injected_ns, "merge")
    asks: list[dict[str, Any] | None] = [None, *FIVE]
    for i, asked in enumerate(asks):
        got = kube.create(f"/api/v1/namespaces/{injected_ns}/pods", _pod(f"merge-{i}", "merge", asked))
        proxy, anns = _proxy(got), got["metadata"]["annotations"]
        resources, env = _merged(asked or {})
        assert _same(proxy["resources"], resources), (asked, proxy["resources"])
        assert {e["name"]: e.get("value") for e in proxy["env"]} == env
        # The webhook serves pods that ask (the policies decline them); the rest the policy may.
        if asked is not None:
            assert anns[names.ANN_INJECTED_BY] == names.INJECTED_BY_WEBHOOK
            applied = {k: v for k, v in env.items() if k == "LOG_LEVEL" and v != "info"}
            assert json.loads(anns[names.ANN_OVERRIDES_ENV_APPLIED]) == ({"proxy": applied} if applied else {})


def test_each_refusal_class_says_why_through_kubectl_and_an_ignored_one_warns(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]], control_plane: ControlPlane
) -> None:
    agent = {"name": "agent", "image": "agent:1"}  # env DEBUG may be overridden, nothing else
    logger = {"name": "logger", "image": "logger:1"}  # listed nowhere in spec.overrides
    bounds = [*BOUNDS, {"containerName": "agent", "env": ["DEBUG"]}]
    name = _mesh(sidecarsets, "refuse", agent, logger, overrides=bounds)
    _wait_ready_mesh(kube, injected_ns, "refuse")
    where = f"SidecarSet {name}"
    proxy_allows = "(allowed: cpu 50m to 1; memory 16Mi to 256Mi; env LOG_LEVEL)"
    at = "sidecarctl.io/overrides[proxy]"
    cases: list[tuple[Any, str]] = [
        # Not JSON, or JSON not of the shape: refused naming where.
        ('{"proxy": ', 'sidecarctl.io/overrides: Invalid value: "{\\"proxy\\": ": not valid JSON'),
        ("[]", 'sidecarctl.io/overrides: Invalid value: "[]": must be a JSON object keyed by container name'),
        ({"proxy": {"image": "evil:1"}}, f"{at}.image: Forbidden: only resources and env may be overridden"),
        (
            {"proxy": {"resources": {"limits": {"ephemeral-storage": "1Gi"}}}},
            f"{at}.resources.limits.ephemeral-storage: Forbidden: only cpu and memory may be overridden",
        ),
        (
            {"proxy": {"env": [{"name": "LOG_LEVEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}},
            f"{at}.env[0].valueFrom: Forbidden: only a value may be set, not valueFrom",
        ),
        # Values outside their range, on either side.
        (
            {"proxy": {"resources": {"limits": {"cpu": "2"}}}},
            f'{at}.resources.limits.cpu: Forbidden: "2" is above the maximum {where} allows for container proxy '
            "(allowed: 50m to 1)",
        ),
        (
            {"proxy": {"resources": {"requests": {"memory": "8Mi"}}}},
            f'{at}.resources.requests.memory: Forbidden: "8Mi" is below the minimum {where} allows for container '
            "proxy (allowed: 16Mi to 256Mi)",
        ),
        # A name the SidecarSet does not allow: an env var, a resource its entry does not list, a
        # container it lists nowhere.
        (
            {"proxy": {"env": [{"name": "ZONE", "value": "us-2"}]}},
            f'{at}.env[ZONE]: Forbidden: "us-2": {where} allows no override of env ZONE in container proxy '
            f"{proxy_allows}",
        ),
        (
            {"agent": {"resources": {"limits": {"cpu": "200m"}}}},
            f'sidecarctl.io/overrides[agent].resources.limits.cpu: Forbidden: "200m": {where} allows no cpu '
            "override of container agent (allowed: env DEBUG)",
        ),
        (
            {"logger": {"env": [{"name": "DEBUG", "value": "1"}]}},
            f"sidecarctl.io/overrides[logger]: Forbidden: {where} allows no override of container logger "
            "(allowed: nothing)",
        ),
        # A request above its limit once merged with the SidecarSet's values.
        (
            {"proxy": {"resources": {"requests": {"cpu": "500m"}}}},
            f'{at}.resources.requests.cpu: Forbidden: "500m" is above the cpu limit "200m" after merging with '
            f"{where}'s limits (a request may not exceed its limit)",
        ),
    ]
    for i, (asked, message) in enumerate(cases):
        manifest = make_pod(f"refuse-{i}", "refuse")
        text = asked if isinstance(asked, str) else json.dumps(asked)
        manifest["metadata"]["annotations"] = {names.ANN_OVERRIDES: text}
        result = kubectl(control_plane, "-n", injected_ns, "create", "-f", "-", stdin=yaml.safe_dump(manifest))
        assert result.returncode != 0, (asked, result.stdout)
        assert "Error from server (Forbidden)" in result.stderr and message in result.stderr, result.stderr
    assert pods(kube, injected_ns, "refuse") == [], "nothing half-created"
    manifest = make_pod("refuse-ok", "refuse")
    manifest["metadata"]["annotations"] = {names.ANN_OVERRIDES: json.dumps({"gone": {"env": []}})}
    result = kubectl(control_plane, "-n", injected_ns, "create", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert result.returncode == 0, result.stderr
    assert "Warning: sidecarctl.io/overrides[gone]: no SidecarSet injects a container gone" in result.stderr
    admitted = _proxy(kube.get(f"/api/v1/namespaces/{injected_ns}/pods/refuse-ok"))
    resources, env = _merged({})
    assert _same(admitted["resources"], resources), "injected as the SidecarSet says"
    assert {e["name"]: e.get("value") for e in admitted["env"]} == env


def test_a_reannotated_running_pod_is_resized_in_place_by_the_controller(
    kube: Kube,
    injected_ns: str,
    sidecarsets: Callable[..., dict[str, Any]],
    control_plane: ControlPlane,
    kubelet: FakeKubelet,
) -> None:
    _mesh(sidecarsets, "annot")
    _wait_ready_mesh(kube, injected_ns, "annot")
    (before,) = _ready_pods(kube, injected_ns, "annot", [FIVE[0]])
    name = before["metadata"]["name"]
    asked = {"proxy": {"resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "800m"}}}}
    result = kubectl(
        control_plane,
        "-n",
        injected_ns,
        "annotate",
        "pod",
        name,
        f"{names.ANN_OVERRIDES}={json.dumps(asked)}",
        "--overwrite",
    )
    assert result.returncode == 0, result.stderr
    want, _ = _merged(asked)

    def resized() -> dict[str, Any] | None:
        got = kube.get(f"/api/v1/namespaces/{injected_ns}/pods/{name}")
        applied = container_status(got, "proxy").get("resources") or {}
        return got if _same(_proxy(got)["resources"], want) and _same(applied, want) and ready(got) else None

    after = eventually(resized, timeout=30, what="the proxy resized to the new override and applied")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert container_status(after, "proxy")["restartCount"] == 0
    assert container_status(after, "proxy")["containerID"] == container_status(before, "proxy")["containerID"]
    # Nothing more is written to it once it runs with its values.
    version = after["metadata"]["resourceVersion"]
    time.sleep(1.5)
    assert kube.get(f"/api/v1/namespaces/{injected_ns}/pods/{name}")["metadata"]["resourceVersion"] == version

    # An env change cannot be applied: an Event on the pod says so, and nothing is written to it.
    env = {"proxy": {**asked["proxy"], "env": [{"name": "LOG_LEVEL", "value": "debug"}]}}
    kubectl(
        control_plane,
        "-n",
        injected_ns,
        "annotate",
        "pod",
        name,
        f"{names.ANN_OVERRIDES}={json.dumps(env)}",
        "--overwrite",
    )

    def said() -> dict[str, Any] | None:
        items = kube.get(f"/api/v1/namespaces/{injected_ns}/events")["items"]
        return next(
            (e for e in items if e["involvedObject"].get("name") == name and e["reason"] == "OverridesNeedRecreate"),
            None,
        )

    event = eventually(said, timeout=20, what="an OverridesNeedRecreate Event on the pod")
    assert 'proxy env LOG_LEVEL: (the SidecarSet\'s) -> "debug"' in event["message"]
    got = kube.get(f"/api/v1/namespaces/{injected_ns}/pods/{name}")
    assert {e["name"]: e.get("value") for e in _proxy(got)["env"]}["LOG_LEVEL"] == "info"


def test_an_image_rollout_over_10_pods_with_5_distinct_overrides_keeps_every_override(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    name = _mesh(sidecarsets, "image")
    _wait_ready_mesh(kube, injected_ns, "image")
    asks = [FIVE[i % 5] for i in range(10)]
    before = {p["metadata"]["name"]: p for p in _ready_pods(kube, injected_ns, "image", asks)}
    wait_status(kube, name, matchedPods=10, updatedPods=10, readyPods=10)
    set_image(kube, name, "proxy:2")

    def rolled() -> list[dict[str, Any]] | None:
        got = pods(kube, injected_ns, "image")
        done = all(_proxy(p)["image"] == "proxy:2" and ready(p) for p in got)
        return got if done and container_status(got[0], "proxy")["image"] == "proxy:2" else None

    eventually(rolled, timeout=90, interval=0.2, what="every pod on proxy:2 and ready")
    wait_status(kube, name, timeout=30, matchedPods=10, updatedPods=10, readyPods=10, updatedReadyPods=10)
    after = {p["metadata"]["name"]: p for p in pods(kube, injected_ns, "image")}
    for pod_name, p in after.items():
        old, new = _proxy(before[pod_name]), _proxy(p)
        assert new["image"] == "proxy:2" and p["metadata"]["uid"] == before[pod_name]["metadata"]["uid"]
        assert _same(new["resources"], old["resources"]) and new["env"] == old["env"], pod_name
        asked = json.loads(p["metadata"]["annotations"][names.ANN_OVERRIDES])
        resources, env = _merged(asked)
        assert _same(new["resources"], resources) and {e["name"]: e["value"] for e in new["env"]} == env


def test_a_resources_rollout_changes_only_the_fields_pods_do_not_override(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    name = _mesh(sidecarsets, "res")
    _wait_ready_mesh(kube, injected_ns, "res")
    asks: list[dict[str, Any] | None] = [None, FIVE[0], FIVE[1], FIVE[3]]
    created = _ready_pods(kube, injected_ns, "res", asks)
    wait_status(kube, name, matchedPods=4, updatedPods=4, readyPods=4)
    bigger = {"requests": {"cpu": "150m", "memory": "40Mi"}, "limits": {"cpu": "400m", "memory": "96Mi"}}
    kube.patch(
        f"{SS_PATH}/{name}",
        [{"op": "replace", "path": "/spec/containers/0/resources", "value": bigger}],
        patch_type="json",
    )

    def rolled() -> list[dict[str, Any]] | None:
        # The memory limit no pod overrides: every pod takes the SidecarSet's new one.
        got = pods(kube, injected_ns, "res")
        memory = all(same_quantity(str(_proxy(p)["resources"]["limits"]["memory"]), "96Mi") for p in got)
        applied = all(_same(container_status(p, "proxy").get("resources") or {}, _proxy(p)["resources"]) for p in got)
        return got if memory and applied and all(ready(p) for p in got) else None

    eventually(rolled, timeout=90, interval=0.2, what="every pod resized and applied")
    wait_status(kube, name, timeout=30, matchedPods=4, updatedPods=4, readyPods=4, updatedReadyPods=4)
    after = {p["metadata"]["name"]: p for p in pods(kube, injected_ns, "res")}
    for p, asked in zip(created, asks, strict=True):
        got = after[p["metadata"]["name"]]
        want = json.loads(json.dumps(bigger))
        for section, values in ((asked or {}).get("proxy", {}).get("resources") or {}).items():
            want[section].update(values)
        assert _same(_proxy(got)["resources"], want), (asked, _proxy(got)["resources"])
        assert got["metadata"]["uid"] == p["metadata"]["uid"]
        assert container_status(got, "proxy")["restartCount"] == 0


def test_tightened_bounds_warn_through_kubectl_and_leave_the_pods_not_upgradable(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]], control_plane: ControlPlane
) -> None:
    name = _mesh(sidecarsets, "tight")
    _wait_ready_mesh(kube, injected_ns, "tight")
    created = _ready_pods(kube, injected_ns, "tight", [FIVE[0], FIVE[3], None])
    wait_status(kube, name, matchedPods=3, updatedPods=3, readyPods=3)
    tighter = [{"containerName": "proxy", "resources": {"cpu": {"max": "400m"}}, "env": ["LOG_LEVEL"]}]
    patch = json.dumps([{"op": "replace", "path": "/spec/overrides", "value": tighter}])
    result = kubectl(
        control_plane, "patch", f"sidecarsets.{names.VERSION}.{names.GROUP}", name, "--type=json", "-p", patch
    )
    assert result.returncode == 0, result.stderr
    assert "Warning: spec.overrides: 2 running pod(s) carry overrides outside the new bounds" in result.stderr
    outside = sorted(p["metadata"]["name"] for p in created[:2])
    for pod_name in outside:
        assert (
            f"spec.overrides: pod {injected_ns}/{pod_name}: sidecarctl.io/overrides[proxy].resources.limits.cpu"
            in result.stderr
        )

    def marked() -> list[str] | None:
        got = [p["metadata"]["name"] for p in pods(kube, injected_ns, "tight") if upgradable(p) == "False"]
        return sorted(got) if sorted(got) == outside else None

    eventually(marked, timeout=20, what="the pods outside the bounds marked not upgradable")
    set_image(kube, name, "proxy:2")
    third = created[2]["metadata"]["name"]
    eventually(
        lambda: _proxy(kube.get(f"/api/v1/namespaces/{injected_ns}/pods/{third}"))["image"] == "proxy:2",
        timeout=30,
        what="the pod within the bounds upgraded",
    )
    # The rollout of the new generation is over with the two left out, not merely not reached yet.
    generation = kube.get(f"{SS_PATH}/{name}")["metadata"]["generation"]
    wait_status(kube, name, observedGeneration=generation, matchedPods=3, updatedPods=1)
    for pod_name in outside:
        assert _proxy(kube.get(f"/api/v1/namespaces/{injected_ns}/pods/{pod_name}"))["image"] == "proxy:1", (
            "left as it is"
        )
