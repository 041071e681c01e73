"""Per-pod overrides at injection, through the engine on whole pods (the webhook's and the CLI's path).

The sidecar is the SidecarSet's with only the fields the pod names replaced: each resource field
alone, resources and env together, over a resourcesPolicy's computed values, on a native sidecar
and on both halves of a HotUpgrade pair. Every refusal class refuses the whole pod with its message;
an override of a container nothing injects here is ignored with a warning; the env applied is recorded.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest

from injector.engine import engine
from sidecarsets.overrides.annotation import INVALID, NOT_ALLOWED, OUT_OF_RANGE, REQUEST_ABOVE_LIMIT
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

NOW = "2024-01-01T00:00:00Z"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}}
ENV = [{"name": "LOG_LEVEL", "value": "info"}, {"name": "ZONE", "value": "a"}]
BOUNDS = [
    {
        "containerName": "proxy",
        "resources": {"cpu": {"min": "50m", "max": "2"}, "memory": {"min": "32Mi", "max": "1Gi"}},
        "env": ["LOG_LEVEL", "TRACE"],
    }
]


def mesh(**spec: Any) -> SidecarSet:
    spec.setdefault("containers", [builders.container("proxy", "proxy:1", resources=RESOURCES, env=ENV)])
    spec.setdefault("overrides", BOUNDS)
    return SidecarSet.from_object(builders.sidecarset("mesh", **spec))


def pod(overrides: Any = None, *, raw: str | None = None, **spec: Any) -> dict[str, Any]:
    out = builders.pod("web-0", labels={"app": "web"}, **spec)
    if overrides is not None or raw is not None:
        out["metadata"]["annotations"] = {names.ANN_OVERRIDES: raw if raw is not None else json.dumps(overrides)}
    return out


def inject(p: dict[str, Any], *sets: SidecarSet) -> engine.InjectionResult:
    return engine.inject(p, namespace="shop", namespace_labels=ENABLED, sidecarsets=list(sets) or [mesh()], now=NOW)


def injected(p: dict[str, Any], *sets: SidecarSet) -> dict[str, Any]:
    result = inject(p, *sets)
    assert result.denied is None, result.denied
    out: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(p), result.patch)
    return out


def container(p: dict[str, Any], name: str = "proxy", key: str = "containers") -> dict[str, Any]:
    return next(c for c in p["spec"][key] if c["name"] == name)


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env") or []}


# -- merged field by field ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "resource", "value"),
    [("requests", "cpu", "500m"), ("limits", "cpu", "2"), ("requests", "memory", "100Mi"), ("limits", "memory", "1Gi")],
)
def test_one_resource_field_alone_replaces_only_itself(section: str, resource: str, value: str) -> None:
    got = container(injected(pod({"proxy": {"resources": {section: {resource: value}}}})))
    want = copy.deepcopy(RESOURCES)
    want[section][resource] = value
    assert got["resources"] == want
    assert env(got) == {"LOG_LEVEL": "info", "ZONE": "a", names.ENV_IS_INJECTED: "true"}


def test_env_alone_replaces_only_that_var_in_place_and_keeps_the_resources() -> None:
    got = container(injected(pod({"proxy": {"env": [{"name": "LOG_LEVEL", "value": "debug"}]}})))
    assert got["resources"] == RESOURCES
    assert [e["name"] for e in got["env"]] == ["LOG_LEVEL", "ZONE", names.ENV_IS_INJECTED]
    assert env(got)["LOG_LEVEL"] == "debug" and env(got)["ZONE"] == "a"


def test_an_allowed_var_the_sidecarset_does_not_set_is_added() -> None:
    got = container(injected(pod({"proxy": {"env": [{"name": "TRACE", "value": "1"}]}})))
    assert env(got) == {"LOG_LEVEL": "info", "ZONE": "a", "TRACE": "1", names.ENV_IS_INJECTED: "true"}


def test_resources_and_env_together() -> None:
    ask = {
        "proxy": {
            "resources": {"requests": {"cpu": "200m"}, "limits": {"memory": "256Mi"}},
            "env": [{"name": "LOG_LEVEL", "value": "debug"}],
        }
    }
    p = injected(pod(ask))
    got = container(p)
    assert got["resources"] == {
        "requests": {"cpu": "200m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    assert env(got)["LOG_LEVEL"] == "debug"
    assert json.loads(p["metadata"]["annotations"][names.ANN_OVERRIDES_ENV_APPLIED]) == {
        "proxy": {"LOG_LEVEL": "debug"}
    }


def test_a_sidecar_without_resources_gets_only_what_the_pod_names() -> None:
    ss = mesh(containers=[builders.container("proxy", "proxy:1")])
    got = container(injected(pod({"proxy": {"resources": {"limits": {"cpu": "500m"}}}}), ss))
    assert got["resources"] == {"limits": {"cpu": "500m"}}


def test_a_resources_policy_sidecar_takes_the_override_over_the_computed_value() -> None:
    policy = {"targetContainersMode": "sum", "resourcesExpr": {"limits": {"cpu": "cpu*50%", "memory": "200Mi"}}}
    ss = mesh(containers=[builders.container("proxy", "proxy:1", resourcesPolicy=policy)])
    app = builders.container("app", "app:1", resources={"limits": {"cpu": "2", "memory": "1Gi"}})
    computed = container(injected(pod(containers=[app]), ss))["resources"]
    assert computed == {"limits": {"cpu": "1", "memory": "200Mi"}}
    got = container(injected(pod({"proxy": {"resources": {"limits": {"cpu": "1500m"}}}}, containers=[app]), ss))
    assert got["resources"] == {"limits": {"cpu": "1500m", "memory": "200Mi"}}


def test_an_overridden_var_wins_over_one_transferred_from_the_app() -> None:
    transfer = [{"sourceContainerName": "app", "envName": "TRACE"}]
    ss = mesh(containers=[builders.container("proxy", "proxy:1", transferEnv=transfer)])
    app = builders.container("app", "app:1", env=[{"name": "TRACE", "value": "from-app"}])
    got = container(injected(pod({"proxy": {"env": [{"name": "TRACE", "value": "mine"}]}}, containers=[app]), ss))
    assert [e for e in got["env"] if e["name"] == "TRACE"] == [{"name": "TRACE", "value": "mine"}]


def test_a_native_sidecar_and_both_halves_of_a_hotupgrade_pair_take_the_override() -> None:
    native = builders.container("proxy", "proxy:1", restartPolicy="Always", resources=RESOURCES)
    p = injected(pod({"proxy": {"resources": {"limits": {"cpu": "2"}}}}), mesh(containers=[], initContainers=[native]))
    assert container(p, key="initContainers")["resources"]["limits"]["cpu"] == "2"
    strategy = {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "e:1"}
    hot = builders.container("proxy", "proxy:1", resources=RESOURCES, upgradeStrategy=strategy)
    p = injected(pod({"proxy": {"resources": {"limits": {"cpu": "2"}}}}), mesh(containers=[hot]))
    assert [container(p, n)["resources"]["limits"]["cpu"] for n in ("proxy-1", "proxy-2")] == ["2", "2"]


def test_without_the_annotation_nothing_changes_and_nothing_is_recorded() -> None:
    p = injected(pod())
    assert container(p)["resources"] == RESOURCES
    assert names.ANN_OVERRIDES_ENV_APPLIED not in p["metadata"]["annotations"]


def test_a_record_the_pod_came_with_is_emptied() -> None:
    p = pod({"proxy": {"resources": {"limits": {"cpu": "2"}}}})
    p["metadata"]["annotations"][names.ANN_OVERRIDES_ENV_APPLIED] = '{"proxy":{"LOG_LEVEL":"forged"}}'
    assert injected(p)["metadata"]["annotations"][names.ANN_OVERRIDES_ENV_APPLIED] == "{}"


def test_an_override_of_a_container_nothing_injects_here_is_ignored_with_a_warning() -> None:
    result = inject(pod({"app": {"env": [{"name": "A", "value": "b"}]}, "proxy": {}}))
    assert result.denied is None and result.patch
    assert result.warnings == (
        "sidecarctl.io/overrides[app]: no SidecarSet injects a container app into this pod; its override is ignored",
    )
    assert [(o.container, o.verdict) for o in result.overrides] == [("app", "ignored"), ("proxy", "applied")]


def test_a_pod_no_sidecarset_selects_is_left_alone_whatever_its_annotation() -> None:
    p = pod(raw="not json")
    p["metadata"]["labels"] = {"app": "other"}
    result = inject(p)
    assert result.patch == [] and result.denied is None and result.skipped == engine.SKIP_NO_MATCH


# -- refused like a LimitRange -----------------------------------------------------------------

REFUSALS = [
    (
        {"proxy": {"resources": {"limits": {"cpu": "4"}}}},
        OUT_OF_RANGE,
        'sidecarctl.io/overrides[proxy].resources.limits.cpu: Forbidden: "4" is above the maximum SidecarSet mesh '
        "allows for container proxy (allowed: 50m to 2)",
    ),
    (
        {"proxy": {"resources": {"requests": {"memory": "16Mi"}}}},
        OUT_OF_RANGE,
        'sidecarctl.io/overrides[proxy].resources.requests.memory: Forbidden: "16Mi" is below the minimum '
        "SidecarSet mesh allows for container proxy (allowed: 32Mi to 1Gi)",
    ),
    (
        {"proxy": {"env": [{"name": "ZONE", "value": "b"}]}},
        NOT_ALLOWED,
        'sidecarctl.io/overrides[proxy].env[ZONE]: Forbidden: "b": SidecarSet mesh allows no override of env ZONE '
        "in container proxy (allowed: cpu 50m to 2; memory 32Mi to 1Gi; env LOG_LEVEL, TRACE)",
    ),
    (
        {"proxy": {"resources": {"requests": {"cpu": "1500m"}}}},
        REQUEST_ABOVE_LIMIT,
        'sidecarctl.io/overrides[proxy].resources.requests.cpu: Forbidden: "1500m" is above the cpu limit "1" '
        "after merging with SidecarSet mesh's limits (a request may not exceed its limit)",
    ),
    (
        {"proxy": {"resources": {"limits": {"memory": "32Mi"}}}},
        REQUEST_ABOVE_LIMIT,
        'sidecarctl.io/overrides[proxy].resources.limits.memory: Forbidden: "32Mi" is below the memory request '
        '"64Mi" after merging with SidecarSet mesh\'s requests (a request may not exceed its limit)',
    ),
    (
        {"proxy": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}}},
        REQUEST_ABOVE_LIMIT,
        'sidecarctl.io/overrides[proxy].resources.requests.cpu: Forbidden: "2" is above the cpu limit "1500m" '
        "after merging with the pod's limits (a request may not exceed its limit)",
    ),
]


@pytest.mark.parametrize(("ask", "reason", "message"), REFUSALS)
def test_each_refusal_refuses_the_pod_naming_sidecarset_container_field_value_and_range(
    ask: Any, reason: str, message: str
) -> None:
    result = inject(pod(ask))
    assert (result.denied, result.refusal, result.patch) == (message, reason, [])


def test_a_sidecarset_that_allows_nothing_refuses_any_override_of_its_sidecars() -> None:
    result = inject(pod({"proxy": {"resources": {"limits": {"cpu": "1"}}}}), mesh(overrides=None))
    assert result.refusal == NOT_ALLOWED
    assert result.denied == (
        "sidecarctl.io/overrides[proxy]: Forbidden: SidecarSet mesh allows no override of container proxy "
        "(allowed: nothing)"
    )


def test_a_field_the_entry_does_not_list_is_refused() -> None:
    ss = mesh(overrides=[{"containerName": "proxy", "env": ["LOG_LEVEL"]}])
    result = inject(pod({"proxy": {"resources": {"requests": {"cpu": "200m"}}}}), ss)
    assert result.refusal == NOT_ALLOWED
    assert result.denied == (
        'sidecarctl.io/overrides[proxy].resources.requests.cpu: Forbidden: "200m": SidecarSet mesh allows no cpu '
        "override of container proxy (allowed: env LOG_LEVEL)"
    )


def test_every_refused_override_is_named_and_nothing_is_half_applied() -> None:
    agent = builders.container("agent", "agent:1")
    ss = mesh(containers=[builders.container("proxy", "proxy:1", resources=RESOURCES), agent])
    ask = {"proxy": {"resources": {"limits": {"cpu": "9"}}}, "agent": {"env": [{"name": "A", "value": "1"}]}}
    result = inject(pod(ask), ss)
    assert result.patch == [] and result.denied is not None
    assert "overrides[proxy].resources.limits.cpu" in result.denied and "overrides[agent]" in result.denied
    assert [o.verdict for o in result.overrides] == ["refused", "refused"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", 'sidecarctl.io/overrides: Invalid value: "{": not valid JSON'),
        ("[]", 'sidecarctl.io/overrides: Invalid value: "[]": must be a JSON object keyed by container name'),
        ('{"Proxy": {}}', 'sidecarctl.io/overrides: Invalid value: "Proxy": a key must be a container name'),
        ('{"proxy": []}', 'sidecarctl.io/overrides[proxy]: Invalid value: "[]": must be an object with resources'),
        ('{"proxy": {"image": "x"}}', "sidecarctl.io/overrides[proxy].image: Forbidden: only resources and env may be"),
        (
            '{"proxy": {"resources": {"claims": []}}}',
            "sidecarctl.io/overrides[proxy].resources.claims: Forbidden: only requests and limits may be overridden",
        ),
        (
            '{"proxy": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}',
            "sidecarctl.io/overrides[proxy].resources.limits.nvidia.com/gpu: Forbidden: only cpu and memory",
        ),
        (
            '{"proxy": {"resources": {"limits": {"cpu": "lots"}}}}',
            'sidecarctl.io/overrides[proxy].resources.limits.cpu: Invalid value: "lots": not a quantity',
        ),
        (
            '{"proxy": {"resources": {"limits": {"cpu": "-1"}}}}',
            'sidecarctl.io/overrides[proxy].resources.limits.cpu: Invalid value: "-1": must not be negative',
        ),
        (
            '{"proxy": {"env": [{"name": "LOG_LEVEL", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}}',
            "sidecarctl.io/overrides[proxy].env[0].valueFrom: Forbidden: only a value may be set, not valueFrom",
        ),
        ('{"proxy": {"env": [{"name": "L", "value": 3}]}}', "sidecarctl.io/overrides[proxy].env[0].value: Invalid"),
        (
            '{"proxy": {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}}',
            'sidecarctl.io/overrides[proxy].env[1].name: Duplicate value: "A"',
        ),
        ("x" * 20000, "sidecarctl.io/overrides: Too long: 20000 bytes, at most 16384"),
    ],
)
def test_an_annotation_not_of_the_shape_refuses_the_pod_naming_where(raw: str, message: str) -> None:
    result = inject(pod(raw=raw))
    assert result.refusal == INVALID and result.patch == []
    assert result.denied is not None and result.denied.startswith(message), result.denied
