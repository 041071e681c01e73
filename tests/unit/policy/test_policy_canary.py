"""A canary SidecarSet stays on the webhook; its base may stay on a policy that leaves the canary's pods alone.

Why this is enough: the webhook is called for every pod the canary could select and serves it whole
(the engine drops the base there), while the base's policy excludes exactly the pods the canary
selects. The differential tier (tests/e2e/test_policy_differential_e2e.py) shows the stored pods
agree with webhook mode for the golden canary cases.
"""

from __future__ import annotations

from typing import Any

from injector.policy import plan, selecting
from injector.policy.plan import Mode, Path, Why
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

TS = "2024-01-01T00:00:00Z"
NS = "sidecarctl-system"


def ss(name: str, selector: dict[str, Any], **meta: Any) -> SidecarSet:
    return SidecarSet.from_object(builders.sidecarset(name, selector=selector, metadata=meta or None))


def canary(name: str, base: str, selector: dict[str, Any]) -> SidecarSet:
    return ss(name, selector, annotations={names.ANN_CANARY: "true", names.ANN_BASE: base})


WEB = {"matchLabels": {"app": "web"}}
WEB_CANARY = {"matchLabels": {"app": "web", "track": "canary"}}


def test_a_canary_needs_the_webhook_and_says_why() -> None:
    p = plan.plan(
        [ss("mesh", WEB), canary("mesh-canary", "mesh", WEB_CANARY)], mode=Mode.AUTO, manager_namespace=NS, timestamp=TS
    )
    route = p.routes["mesh-canary"]
    assert (route.path, route.why) == (Path.WEBHOOK, Why.NEEDS_WEBHOOK)
    assert "canary" in route.message and "mesh" in route.message
    # The base is still served by a policy, which leaves the canary's pods to the webhook.
    base = p.routes["mesh"]
    assert base.path is Path.POLICY
    [generated] = p.policies
    go = next(v["expression"] for v in generated.policy["spec"]["variables"] if v["name"] == "groups0")
    assert plan.policy_excludes([canary("mesh-canary", "mesh", WEB_CANARY)]) in go
    assert p.webhook_condition.startswith(f"({selecting.pods_selected([canary('mesh-canary', 'mesh', WEB_CANARY)])})")


def test_only_a_real_canary_is_routed() -> None:
    half = ss("mesh-canary", WEB_CANARY, annotations={names.ANN_CANARY: "false", names.ANN_BASE: "mesh"})
    no_base = ss("other", WEB_CANARY, annotations={names.ANN_CANARY: "true"})
    p = plan.plan([ss("mesh", WEB), half, no_base], mode=Mode.AUTO, manager_namespace=NS, timestamp=TS)
    assert {name: route.path for name, route in p.routes.items()} == {
        "mesh": Path.POLICY,
        "mesh-canary": Path.POLICY,
        "other": Path.POLICY,
    }


def test_policy_mode_cannot_serve_a_canary() -> None:
    p = plan.plan(
        [ss("mesh", WEB), canary("mesh-canary", "mesh", WEB_CANARY)],
        mode=Mode.POLICY,
        manager_namespace=NS,
        timestamp=TS,
    )
    assert p.routes["mesh-canary"].path is Path.WEBHOOK
    assert p.webhook_served() == ["mesh-canary"]
