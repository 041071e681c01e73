"""resourcesPolicy at injection: the cases of Kruise's sidecarset_resources_test.go (targets,
aggregation, expressions) through sidecarsets.spec.resourcespolicy, then through the engine on whole pods."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from injector.engine import engine
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.reading import Reader
from sidecarsets.spec.resourcespolicy import (
    ResourcesPolicy,
    ResourcesPolicyError,
    computed_resources,
    read_resources_policy,
)
from tests.kube import builders

NOW = "2024-01-01T00:00:00Z"


def policy(mode: str = "sum", regex: str = ".*", limits: Any = None, requests: Any = None) -> ResourcesPolicy:
    raw: dict[str, Any] = {"targetContainersMode": mode, "targetContainersNameRegex": regex, "resourcesExpr": {}}
    if limits is not None:
        raw["resourcesExpr"]["limits"] = limits
    if requests is not None:
        raw["resourcesExpr"]["requests"] = requests
    found = read_resources_policy(Reader(tolerant=False), raw, "resourcesPolicy")
    assert found is not None
    return found


def app(name: str, limits: dict[str, str] | None = None, requests: dict[str, str] | None = None, **kw: Any) -> Any:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return builders.container(name, f"{name}:1", resources=resources, **kw)


def spec(*containers: Any, init: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"containers": list(containers)}
    if init is not None:
        out["initContainers"] = init
    return out


TWO_APPS = spec(
    app("app1", {"cpu": "200m", "memory": "200Mi"}, {"cpu": "50m", "memory": "100Mi"}),
    app("app2", {"cpu": "400m", "memory": "400Mi"}, {"cpu": "100m", "memory": "200Mi"}),
)
ENGINES = spec(
    app("large.engine.v4", {"cpu": "200m", "memory": "200Mi"}, {"cpu": "50m", "memory": "100Mi"}),
    app("large.engine.v8", {"cpu": "400m", "memory": "400Mi"}, {"cpu": "100m", "memory": "200Mi"}),
)
HALF = {"cpu": "cpu*50%", "memory": "200Mi"}
HALF_AT_LEAST = {"cpu": "max(cpu*50%, 50m)", "memory": "200Mi"}


def test_sum_with_percentages() -> None:
    p = policy("sum", ".*", HALF, {"cpu": "cpu*50%", "memory": "100Mi"})
    assert computed_resources(p, TWO_APPS, frozenset()) == {
        "limits": {"cpu": "300m", "memory": "200Mi"},
        "requests": {"cpu": "75m", "memory": "100Mi"},
    }


def test_max_with_a_regex() -> None:
    p = policy("max", "^large.engine.v.*$", HALF_AT_LEAST, {"cpu": "max(cpu*50%, 50m)", "memory": "100Mi"})
    assert computed_resources(p, ENGINES, frozenset()) == {
        "limits": {"cpu": "200m", "memory": "200Mi"},
        "requests": {"cpu": "50m", "memory": "100Mi"},
    }


def test_a_regex_that_selects_one_container() -> None:
    p = policy("sum", "^large.engine.v4$", HALF_AT_LEAST, {"cpu": "max(cpu*50%, 50m)", "memory": "100Mi"})
    assert computed_resources(p, ENGINES, frozenset()) == {
        "limits": {"cpu": "100m", "memory": "200Mi"},
        "requests": {"cpu": "50m", "memory": "100Mi"},
    }


def test_the_regex_searches_unanchored() -> None:
    p = policy("sum", "engine", {"cpu": "cpu"})
    assert computed_resources(p, ENGINES, frozenset()) == {"limits": {"cpu": "600m"}}


def test_no_target_refuses() -> None:
    with pytest.raises(ResourcesPolicyError, match=r'^no containers match the regex pattern "\^nonexistent\$"$'):
        computed_resources(policy("sum", "^nonexistent$", HALF), ENGINES, frozenset())


def test_sum_without_every_limit_leaves_the_limit_unbounded() -> None:
    pod = spec(
        app("app1", {"cpu": "200m", "memory": "200Mi"}, {"cpu": "100m", "memory": "100Mi"}),
        app("app2", {"memory": "400Mi"}, {"cpu": "50m", "memory": "200Mi"}),
    )
    p = policy("sum", ".*", {"cpu": "cpu*50%", "memory": "memory*30%"}, {"cpu": "cpu*30%", "memory": "memory*20%"})
    assert computed_resources(p, pod, frozenset()) == {
        "limits": {"memory": "180Mi"},
        "requests": {"cpu": "45m", "memory": "60Mi"},
    }


def test_max_without_every_limit_leaves_the_limit_unbounded() -> None:
    pod = spec(
        app("app1", {"cpu": "200m", "memory": "200Mi"}, {"cpu": "100m", "memory": "100Mi"}),
        app("app2", {"cpu": "400m"}, {"cpu": "200m"}),
    )
    p = policy("max", ".*", {"cpu": "cpu*40%", "memory": "memory*30%"}, {"cpu": "cpu*25%", "memory": "memory*20%"})
    assert computed_resources(p, pod, frozenset()) == {
        "limits": {"cpu": "160m"},
        "requests": {"cpu": "50m", "memory": "20Mi"},
    }


def test_sum_with_a_container_without_requests() -> None:
    pod = spec(
        app("app1", {"cpu": "200m", "memory": "200Mi"}, {"cpu": "100m", "memory": "100Mi"}),
        app("app2", {"cpu": "400m", "memory": "400Mi"}),
    )
    p = policy("sum", ".*", {"cpu": "cpu*50%", "memory": "memory*30%"}, {"cpu": "cpu*30%", "memory": "memory*20%"})
    assert computed_resources(p, pod, frozenset()) == {
        "limits": {"cpu": "300m", "memory": "180Mi"},
        "requests": {"cpu": "30m", "memory": "20Mi"},
    }


def test_native_sidecars_count_and_plain_init_containers_do_not() -> None:
    pod = spec(
        app("app2", {"cpu": "600m", "memory": "1200Mi"}, {"cpu": "300m", "memory": "600Mi"}),
        init=[
            app("app1", {"cpu": "400m", "memory": "800Mi"}, {"cpu": "200m", "memory": "400Mi"}, restartPolicy="Always"),
            app("app2", {"cpu": "400m", "memory": "800Mi"}),
        ],
    )
    p = policy(
        "sum",
        "^app.*$",
        {"cpu": "max(cpu*30%, 50m)", "memory": "max(memory*25%, 100Mi)"},
        {"cpu": "cpu*20%", "memory": "memory*15%"},
    )
    assert computed_resources(p, pod, frozenset()) == {
        "limits": {"cpu": "300m", "memory": "500Mi"},
        "requests": {"cpu": "100m", "memory": "150Mi"},
    }


def test_the_sidecarsets_own_containers_are_not_targets() -> None:
    pod = spec(
        app("app1", {"cpu": "1"}),
        app("app2", {"cpu": "2"}),
        app("sidecar1", {"cpu": "4"}),
        init=[
            app("init-sidecar1", {"cpu": "8"}, restartPolicy="Always"),
            app("plain-init-container", {"cpu": "16"}),
            app("sidecar-container", {"cpu": "32"}, restartPolicy="Always"),
        ],
    )
    p = policy("sum", "^.*$", {"cpu": "cpu"})
    assert computed_resources(p, pod, frozenset({"init-sidecar1", "sidecar1"})) == {"limits": {"cpu": "35"}}


def test_a_constant_limit_needs_an_aggregate_but_a_request_does_not() -> None:
    pod = spec(app("app", requests={"memory": "1Gi"}))
    p = policy("sum", ".*", {"memory": "200Mi"}, {"cpu": "max(cpu*50%, 50m)", "memory": "cpu*50%"})
    # No limit: skipped. No cpu request: 0, so max() gives 50m. An expression that does not name
    # `memory` binds `cpu`, to the value of the resource computed: half the memory request here.
    assert computed_resources(p, pod, frozenset()) == {"requests": {"cpu": "50m", "memory": "512Mi"}}


def test_plain_number_results_are_milli_units() -> None:
    pod = spec(app("app", {"cpu": "2", "memory": "2Mi"}, {"cpu": "2", "memory": "2Mi"}))
    p = policy("sum", ".*", {"cpu": "1", "memory": "1.5"}, {"memory": "0.5"})
    # A constant expression never names `memory`, so a memory constant is read as cpu: milli-units.
    assert computed_resources(p, pod, frozenset()) == {
        "limits": {"cpu": "1", "memory": "1500m"},
        "requests": {"memory": "500m"},
    }


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"cpu": "cpu * 2m"},
            'failed to evaluate CPU limits expression: failed to parse expression "cpu * 2m": '
            "multiplication of two quantities",
        ),
        (
            {"memory": "memory - 1Gi"},
            "failed to evaluate memory limits expression: failed to parse expression "
            '"memory - 1Gi": calculation result is negative: -424Mi',
        ),
    ],
)
def test_expression_errors_refuse_with_kruises_message(limits: dict[str, str], message: str) -> None:
    with pytest.raises(ResourcesPolicyError) as err:
        computed_resources(policy("sum", ".*", limits), TWO_APPS, frozenset())
    assert str(err.value) == message


def test_a_bad_regex_refuses() -> None:
    with pytest.raises(ResourcesPolicyError, match=r'^failed to get target containers: invalid regex pattern "\[app":'):
        computed_resources(policy("sum", "[app", HALF), TWO_APPS, frozenset())


def test_a_malformed_quantity_in_the_pod_names_the_field() -> None:
    pod = spec(app("app", {"cpu": "lots"}))
    with pytest.raises(
        ResourcesPolicyError, match=r'^spec.containers\[0\].resources.limits\[cpu\]: Invalid value: "lots"'
    ):
        computed_resources(policy("sum", ".*", HALF), pod, frozenset())


def test_yaml_numbers_are_quantities() -> None:
    pod = spec(app("app", {"cpu": 2, "memory": 1.5}))  # type: ignore[dict-item]
    assert computed_resources(policy("sum", ".*", {"cpu": "cpu", "memory": "memory"}), pod, frozenset()) == {
        "limits": {"cpu": "2", "memory": "1500m"}
    }


# --- through the engine ---------------------------------------------------------------------------


def resourced(name: str = "agent", **expr: Any) -> SidecarSet:
    sidecar = builders.container(
        name,
        "agent:1",
        resourcesPolicy={"targetContainersMode": "sum", "targetContainersNameRegex": ".*", "resourcesExpr": expr},
    )
    return SidecarSet.from_object(builders.sidecarset("agents", containers=[sidecar]))


def inject(pod: Any, *sets: SidecarSet) -> engine.InjectionResult:
    return engine.inject(
        pod, namespace="shop", namespace_labels=None, sidecarsets=list(sets), now=NOW, require_namespace_label=False
    )


def test_the_engine_gives_the_sidecar_its_computed_resources() -> None:
    pod = builders.pod(containers=[app("app", {"cpu": "1", "memory": "1Gi"})])
    result = inject(pod, resourced(limits={"cpu": "cpu*25%", "memory": "memory*25%"}))
    assert result.denied is None and result.warnings == ()
    out = jsonpatch.apply_patch(pod, result.patch)
    agent = next(c for c in out["spec"]["containers"] if c["name"] == "agent")
    assert agent["resources"] == {"limits": {"cpu": "250m", "memory": "256Mi"}}
    assert "resources" not in builders.container("agent", "agent:1")  # the SidecarSet's own stays unchanged


def test_the_engine_refuses_a_pod_the_policy_cannot_size() -> None:
    pod = builders.pod(containers=[app("app", {"cpu": "1"})])
    ss = resourced(limits={"cpu": "cpu"})
    ss_regex = SidecarSet.from_object(
        builders.sidecarset(
            "agents",
            containers=[
                builders.container(
                    "agent",
                    "agent:1",
                    resourcesPolicy={
                        "targetContainersMode": "max",
                        "targetContainersNameRegex": "^db$",
                        "resourcesExpr": {"limits": {"cpu": "cpu"}},
                    },
                )
            ],
        )
    )
    assert inject(pod, ss).denied is None
    result = inject(pod, ss_regex)
    assert result.patch == []
    assert result.denied == (
        'SidecarSet agents, container agent: resourcesPolicy: no containers match the regex pattern "^db$"'
    )


def test_the_engine_excludes_every_injected_sidecarsets_containers() -> None:
    # `proxy` comes from another SidecarSet injected into the same pod: it is not an app container.
    other = SidecarSet.from_object(builders.sidecarset("mesh", containers=[app("proxy", {"cpu": "8"})]))
    pod = builders.pod(containers=[app("app", {"cpu": "1"}), app("proxy", {"cpu": "8"})])
    out = jsonpatch.apply_patch(pod, inject(pod, other, resourced(limits={"cpu": "cpu"})).patch)
    agent = next(c for c in out["spec"]["containers"] if c["name"] == "agent")
    assert agent["resources"] == {"limits": {"cpu": "1"}}
