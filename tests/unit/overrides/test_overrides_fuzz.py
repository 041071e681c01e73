"""The annotation fuzzed: any JSON, and JSON near the override shape, through the engine.

No exception escapes; a pod is injected only when every override is of the shape and within its
SidecarSet's bounds (judged here by a separate, plain reading of the contract), and then its sidecar
carries exactly the merged values; every other pod is refused with a message that names the
annotation. Also the overrides a SidecarSet allows, fuzzed in `spec.overrides`: never an exception.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from injector.engine import engine
from sidecarsets.overrides.annotation import REASONS
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.values import quantity
from tests.kube import builders
from tests.unit.overrides.test_injection import BOUNDS, ENABLED, NOW, RESOURCES, container, injected, mesh, pod

SS = mesh()
MILLI = {"cpu": (50, 2000), "memory": (32 * 2**20 * 1000, 2**30 * 1000)}  # BOUNDS, in milli-units
ALLOWED_ENV = {"LOG_LEVEL", "TRACE"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
quantities = st.one_of(
    st.sampled_from(["10m", "50m", "1", "2", "2500m", "0", "1Gi", "64Mi", "16Mi", "1e3", "0.5", "-1", "", "x"]),
    st.integers(-3, 5),
    st.floats(-1, 4, allow_nan=False),
    json_values,
)
sections = st.dictionaries(st.sampled_from(["cpu", "memory", "gpu"]), quantities, max_size=2)
env_entries = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"name": st.sampled_from(["LOG_LEVEL", "TRACE", "ZONE", "A=B", ""]), "value": st.text(max_size=6)}
        ),
        st.fixed_dictionaries({"name": st.just("LOG_LEVEL"), "valueFrom": json_values}),
        json_values,
    ),
    max_size=3,
)
near_shape = st.dictionaries(
    st.sampled_from(["proxy", "app", "Proxy", "", "x" * 70]),
    st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "resources": st.one_of(
                    st.fixed_dictionaries({}, optional={"requests": sections, "limits": sections}), json_values
                ),
                "env": st.one_of(env_entries, json_values),
            },
        ),
        json_values,
    ),
    max_size=3,
)


def _milli(raw: Any) -> int | None:
    """A quantity in milli-units, read plainly (strings of the kinds the strategy writes, numbers)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        return None
    try:
        return quantity.parse(quantity.json_text(raw)).milli_value()
    except quantity.QuantityError:
        return None


def _acceptable(ask: Any) -> bool:
    """The contract, read plainly: only proxy may be overridden (by BOUNDS), in range, request <= limit."""
    if not isinstance(ask, dict):
        return False
    for name, value in ask.items():
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name) or not isinstance(value, dict):
            return False
        if set(value) - {"resources", "env"}:
            return False
        resources, env = value.get("resources", {}), value.get("env", [])
        if not isinstance(resources, dict) or set(resources) - {"requests", "limits"} or not isinstance(env, list):
            return False
        asked = {}
        for section in ("requests", "limits"):
            values = resources.get(section, {})
            if not isinstance(values, dict) or set(values) - set(MILLI):
                return False
            for resource, raw in values.items():
                milli = _milli(raw)
                # Negative by its sign, not its milli value: Go's MilliValue rounds -1n up to +1m, and
                # the API server refuses any quantity below zero.
                if milli is None or quantity.parse(quantity.json_text(raw)).sign() < 0:
                    return False
                asked[(section, resource)] = milli
        names_seen = set()
        for e in env:
            if not isinstance(e, dict) or set(e) != {"name", "value"} or not isinstance(e["value"], str):
                return False
            if not isinstance(e["name"], str) or not re.fullmatch(r"[ -<>-~]{1,256}", e["name"]):
                return False
            if e["name"] in names_seen:
                return False
            names_seen.add(e["name"])
        if name != "proxy":
            continue  # ignored: nothing injects it (its shape still had to hold)
        if not names_seen <= ALLOWED_ENV:
            return False
        if any(not MILLI[r][0] <= m <= MILLI[r][1] for (_, r), m in asked.items()):
            return False
        for resource in MILLI:
            request = asked.get(("requests", resource), _milli(RESOURCES["requests"][resource]))
            limit = asked.get(("limits", resource), _milli(RESOURCES["limits"][resource]))
            if request is not None and limit is not None and request > limit:
                return False
    return True


def _check(ask: Any) -> None:
    text = json.dumps(ask)
    result = engine.inject(pod(raw=text), namespace="shop", namespace_labels=ENABLED, sidecarsets=[SS], now=NOW)
    if result.denied is None:
        assert _acceptable(ask), (ask, result.warnings)
        got = container(injected(pod(raw=text)))
        wanted = ask.get("proxy", {}) if isinstance(ask, dict) else {}
        for section, values in (wanted.get("resources") or {}).items():
            for resource, raw in values.items():
                assert got["resources"][section][resource] == quantity.json_text(raw)
        for e in wanted.get("env") or []:
            assert {"name": e["name"], "value": e["value"]} in got["env"]
    else:
        assert not _acceptable(ask), (ask, result.denied)
        assert result.denied.startswith(names.ANN_OVERRIDES) and result.refusal in REASONS, result.denied
        assert result.patch == []


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_json_is_refused_with_a_message_or_injected_as_asked(ask: Any) -> None:
    _check(ask)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(near_shape)
@example({"app": {"resources": {"requests": {"cpu": -6.518289126471504e-13}}}})  # -1n once parsed: refused
def test_json_near_the_shape_is_refused_with_a_message_or_injected_as_asked(ask: Any) -> None:
    _check(ask)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_text_never_raises(text: str) -> None:
    result = engine.inject(pod(raw=text), namespace="shop", namespace_labels=ENABLED, sidecarsets=[SS], now=NOW)
    assert result.patch or (result.denied or "").startswith(names.ANN_OVERRIDES)


@settings(max_examples=200, deadline=None)
@given(st.lists(json_values | st.just(BOUNDS[0]), max_size=3) | json_values)
def test_any_overrides_a_sidecarset_is_read_with_never_raise(overrides: Any) -> None:
    ss = SidecarSet.from_object(builders.sidecarset("mesh", overrides=overrides), tolerant=True)
    engine.inject(pod({"proxy": {"resources": {"limits": {"cpu": "1"}}}}), namespace="shop",
                  namespace_labels=ENABLED, sidecarsets=[ss], now=NOW)  # fmt: skip
