"""When a SidecarSet's new bounds allow less than its old ones (and so may leave running pods
outside them), and which pods they leave outside."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecarsets.overrides import merge
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

OLD = [{"containerName": "proxy", "resources": {"cpu": {"min": "50m", "max": "2"}}, "env": ["A", "B"]}]


def ss(bounds: Any) -> SidecarSet:
    return SidecarSet.from_object(builders.sidecarset("mesh", overrides=bounds))


@pytest.mark.parametrize(
    ("new", "narrower"),
    [
        (OLD, False),
        ([{"containerName": "proxy", "resources": {"cpu": {"min": "10m", "max": "4"}}, "env": ["A", "B", "C"]}], False),
        ([{"containerName": "proxy", "resources": {"cpu": {"max": "2"}}, "env": ["A", "B"]}], False),  # min dropped
        ([{"containerName": "proxy", "resources": {"cpu": {"min": "100m", "max": "2"}}, "env": ["A", "B"]}], True),
        ([{"containerName": "proxy", "resources": {"cpu": {"min": "50m", "max": "1"}}, "env": ["A", "B"]}], True),
        ([{"containerName": "proxy", "resources": {"cpu": {"min": "50m", "max": "2"}}, "env": ["A"]}], True),
        ([{"containerName": "proxy", "env": ["A", "B"]}], True),  # cpu no longer overridable
        (None, True),
    ],
)
def test_tightened_is_any_bound_that_now_excludes_a_value_it_allowed(new: Any, narrower: bool) -> None:
    assert merge.tightened(ss(OLD), ss(new)) is narrower
    assert merge.tightened(ss(None), ss(new)) is False, "from nothing allowed, nothing can be tightened"


def test_outside_names_the_refusal_of_the_first_override_the_bounds_exclude() -> None:
    text = json.dumps({"proxy": {"resources": {"limits": {"cpu": "1500m"}}}, "gone": {"env": []}})
    assert merge.outside(ss(OLD), text) is None
    assert merge.outside(ss(OLD), None) is None
    tighter = ss([{"containerName": "proxy", "resources": {"cpu": {"max": "1"}}}])
    assert merge.outside(tighter, text) == (
        'sidecarctl.io/overrides[proxy].resources.limits.cpu: Forbidden: "1500m" is above the maximum SidecarSet '
        "mesh allows for container proxy (allowed: at most 1)"
    )
    assert (merge.outside(tighter, "{") or "").startswith('sidecarctl.io/overrides: Invalid value: "{"')


def test_a_namespaced_sidecarsets_refusal_names_its_kind_and_namespace() -> None:
    bounds = [{"containerName": "proxy", "resources": {"cpu": {"max": "1"}}}]
    tenant = SidecarSet.from_object(builders.namespaced_sidecarset("mesh", "shop", overrides=bounds))
    text = json.dumps({"proxy": {"resources": {"limits": {"cpu": "1500m"}}}})
    assert merge.outside(tenant, text) == (
        'sidecarctl.io/overrides[proxy].resources.limits.cpu: Forbidden: "1500m" is above the maximum '
        "NamespacedSidecarSet shop/mesh allows for container proxy (allowed: at most 1)"
    )
    # The same bounds on the cluster's `mesh` are its own (the cache of refusals is keyed by owner).
    assert "maximum SidecarSet mesh allows" in (merge.outside(ss(bounds), text) or "")
