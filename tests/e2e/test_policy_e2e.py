"""Injection by MutatingAdmissionPolicy through the real API server, with the manager in `auto`.

The policies the controller keeps, the webhook narrowed to what they cannot serve, the
PolicyInjection condition, owner references, hand edits put back, and a SidecarSet moving
between the two paths.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from injector.policy.support import BINDINGS, POLICIES
from injector.policy.sync import CONDITION_NAME
from sidecarsets import names
from tests.e2e.helpers import SS_PATH, make_pod
from tests.kube.client import Kube, eventually
from tests.kube.managerharness import MWC_PATH, RunningManager

PODS = "/api/v1/namespaces/{}/pods"


def _names(items: list[dict[str, Any]] | None) -> list[str]:
    return [c["name"] for c in items or []]


def policy_condition(kube: Kube, name: str) -> dict[str, Any] | None:
    status = kube.get(f"{SS_PATH}/{name}").get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == names.CONDITION_POLICY_INJECTION), None)


def wait_condition(kube: Kube, name: str, status: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        c = policy_condition(kube, name)
        return c if c is not None and c["status"] == status else None

    return eventually(check, timeout=20, what=f"PolicyInjection of {name} is {status}")


def webhook_condition(kube: Kube) -> str | None:
    mwc = kube.get(f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}")
    hook = next(h for h in mwc["webhooks"] if h["name"] == names.MUTATING_WEBHOOK_NAME)
    found = [c["expression"] for c in hook.get("matchConditions") or [] if c["name"] == CONDITION_NAME]
    return found[0] if found else None


def injected_by(kube: Kube, ns: str, app: str, by: str, **labels: str) -> dict[str, Any]:
    """Dry-run creates until the pod comes back injected by `by` (policies take up to ~1 s to be enforced)."""

    def attempt() -> dict[str, Any] | None:
        p = kube.create(PODS.format(ns), make_pod("probe", app, **labels), dryRun="All")
        return p if (p["metadata"].get("annotations") or {}).get(names.ANN_INJECTED_BY) == by else None

    return eventually(attempt, timeout=20, interval=0.1, what=f"pods injected by {by}")


def test_a_policy_served_sidecarset_is_injected_without_the_webhook(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]], manager: RunningManager
) -> None:
    ss = sidecarsets("polshop")
    name = ss["metadata"]["name"]
    cond = wait_condition(kube, name, "True")
    assert cond["reason"] == "PolicyServed"
    policy = kube.get(f"{POLICIES}/sidecarctl-{name}")
    binding = kube.get(f"{BINDINGS}/sidecarctl-{name}")
    for obj in (policy, binding):
        owners = obj["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [("SidecarSet", name, ss["metadata"]["uid"])]
    pod = injected_by(kube, injected_ns, "polshop", "policy")
    assert _names(pod["spec"]["containers"]) == ["proxy", "app"]
    assert _names(pod["spec"]["initContainers"]) == ["proxy-init"]
    assert pod["metadata"]["annotations"][names.ANN_INJECTED_LIST] == name
    # Once the policy has settled the webhook is narrowed: the pod never reaches it.
    eventually(lambda: webhook_condition(kube) is not None, timeout=20, what="the webhook is narrowed")
    time.sleep(manager.opts.injection.policy_settle + 0.5)
    before = manager.manager.webhook.app_state.requests if hasattr(manager.manager.webhook, "app_state") else None
    stored = kube.create(PODS.format(injected_ns), make_pod("served", "polshop"))
    assert stored["metadata"]["annotations"][names.ANN_INJECTED_BY] == "policy"
    del before
