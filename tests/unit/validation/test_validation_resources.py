"""resourcesPolicy validation: the cases of Kruise's sidecarset_resources_policy_test.go and
sidecarset_validating_test.go, with Kruise's messages, at /validate-sidecarset's entry point."""

from __future__ import annotations

from typing import Any

import pytest

from sidecarsets.validation import validate_sidecarset
from sidecarsets.validation.resources import expression_problem
from tests.kube import builders

P = "spec.containers[0].resourcesPolicy"


def errors(policy: dict[str, Any], **container: Any) -> list[str]:
    sidecar = builders.container("agent", "agent:1", resourcesPolicy=policy, **container)
    return [str(e) for e in validate_sidecarset(builders.sidecarset("agents", containers=[sidecar]))]


def policy(mode: str = "sum", regex: str | None = ".*", **expr: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"targetContainersMode": mode, "resourcesExpr": expr}
    if regex is not None:
        out["targetContainersNameRegex"] = regex
    return out


LIMITS = {"cpu": "max(cpu*50%, 50m)", "memory": "max(memory*50%, 100Mi)"}


@pytest.mark.parametrize(
    "value",
    [
        policy("sum", limits=LIMITS, requests=LIMITS),
        policy("max", limits={"cpu": "cpu*50%"}),
        policy("sum", requests={"cpu": "cpu*50%"}),
        policy("sum", regex=None, limits={"cpu": "cpu"}),  # the regex defaults to .*
        policy("sum", limits={"cpu": "0.5*cpu - 0.3*max(0, cpu-4) + 0.3*max(0, cpu-8)"}),
        policy("sum", limits={"cpu": "max( cpu * 0.5 , 50m )", "memory": "memory*50%"}),
        policy("sum", limits={"cpu": "cpu * 2m"}),  # passes here, fails at pod creation, as in Kruise
        policy("sum", limits={"cpu": ""}),  # an empty expression is not evaluated
    ],
)
def test_valid(value: dict[str, Any]) -> None:
    assert errors(value) == []


def test_resources_and_a_policy_together() -> None:
    for resources in ({"limits": {"cpu": "1"}}, {"requests": {"memory": "1Gi"}}):
        [found] = errors(policy(limits={"cpu": "bad expression"}), resources=resources)
        assert found.startswith(f"{P}: Invalid value: {{")
        assert found.endswith(": resourcesPolicy and resources cannot be configured together")


def test_empty_regex() -> None:
    assert errors(policy(regex="", limits=LIMITS)) == [
        f"{P}.targetContainersNameRegex: Required value: invalid empty regex"
    ]


@pytest.mark.parametrize("regex", ["[invalid(regex", "(?=app)", r"(a)\1"])
def test_bad_regex(regex: str) -> None:
    [found] = errors(policy(regex=regex, limits=LIMITS))
    assert found.startswith(f"{P}.targetContainersNameRegex: Invalid value: ")
    assert ": invalid regex pattern: error parsing regexp: " in found


def test_neither_limits_nor_requests() -> None:
    assert errors(policy()) == [
        f"{P}.resourcesExpr: Invalid value: {{}}: at least one of limits or requests must be configured"
    ]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("invalid expression @#$", "undefined variable: invalid"),
        ("max(cpu*50%, 50m", "parse error: syntax error at line 1, col 17"),
        ("max(cpu*50%)", "max function requires exactly 2 arguments, got 1"),
        ("invalidvar * 50%", "undefined variable: invalidvar"),
        ("invalid_cpu_expr", "undefined variable: invalid_cpu_expr"),
        ("cpu +*/ 50%", "parse error: syntax error at line 1, col 7"),
        ("memory*50%", "undefined variable: memory"),  # the other resource's variable
        ("cpu - 2", "calculation result is negative: -1"),  # refused at cpu=1, as in Kruise
    ],
)
def test_bad_cpu_expressions(expr: str, message: str) -> None:
    for section in ("limits", "requests"):
        value: dict[str, Any] = {"targetContainersMode": "sum", "resourcesExpr": {section: {"cpu": expr}}}
        found = errors(value)
        assert found == [f'{P}.resourcesExpr.{section}.cpu: Invalid value: "{expr}": invalid expression: {message}']


def test_bad_memory_expression() -> None:
    found = errors(policy(limits={"memory": "bad_memory_expr"}, requests={"memory": "bad_memory_expr"}))
    assert found == [
        f'{P}.resourcesExpr.{section}.memory: Invalid value: "bad_memory_expr": '
        "invalid expression: undefined variable: bad_memory_expr"
        for section in ("limits", "requests")
    ]


def test_mode_is_required_and_enumerated() -> None:
    no_mode = {"resourcesExpr": {"limits": LIMITS}}
    assert errors(no_mode) == [f"{P}.targetContainersMode: Required value"]
    assert errors(policy("avg", limits=LIMITS)) == [
        f'{P}.targetContainersMode: Unsupported value: "avg": supported values: "sum", "max"'
    ]


def test_only_native_init_containers_may_have_a_policy() -> None:
    plain = builders.container("setup", "setup:1", resourcesPolicy=policy(limits=LIMITS))
    native = builders.container("vault", "vault:1", restartPolicy="Always", resourcesPolicy=policy(limits=LIMITS))
    obj = builders.sidecarset("agents", init_containers=[plain, native])
    found = [str(e) for e in validate_sidecarset(obj)]
    assert len(found) == 1
    assert found[0].startswith("spec.initContainers[0].resourcesPolicy: Invalid value: {")
    assert found[0].endswith(": resourcesPolicy is only supported for containers with RestartPolicy Always")


@pytest.mark.parametrize(
    ("expr", "variable"),
    [
        ("cpu*50%", "cpu"),
        ("max(cpu*50%, 50m)", "cpu"),
        ("min(cpu*50%, 100m)", "cpu"),
        ("max( cpu * 0.5 , 50m )", "cpu"),
        ("memory*50%", "memory"),
        ("max(min(cpu*50%, 100m), 50m)", "cpu"),
    ],
)
def test_kruise_expression_table_valid(expr: str, variable: str) -> None:
    assert expression_problem(expr, variable=variable) is None


def test_overlong_expressions_are_refused() -> None:
    problem = expression_problem("1+" * 600 + "1", variable="cpu")
    assert problem is not None and "longer than" in problem
