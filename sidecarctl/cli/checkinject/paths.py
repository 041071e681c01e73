"""Which path injects a SidecarSet, and so a pod: a named MutatingAdmissionPolicy, or the webhook.

A SidecarSet's path is what the manager reports (its PolicyInjection condition, our policies'
members); without a report, what its spec alone allows (injector.policy.generate.check_servable).
A pod any webhook-served SidecarSet selects goes to the webhook whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli.checkinject.verdicts import Route, Verdict
from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet


def policy_members(policies: list[JsonObj]) -> dict[str, str]:
    """SidecarSet -> the MutatingAdmissionPolicy of ours that holds it (injector.policysync.stored)."""
    from injector.policysync import stored

    return {member: stored.name_of(p) for p in reversed(policies) for member in stored.members(p)}


def route_of(ss: SidecarSet, members: dict[str, str]) -> Route:
    """The path the manager reports for `ss` (its PolicyInjection condition, the policy that holds
    it); without a report, what the spec alone says (injector.policy.generate.check_servable)."""
    from injector.policy.build import NeedsWebhook
    from injector.policy.generate import check_servable

    if ss.injection_paused or selectors.is_empty(ss.selector):
        return Route("none", None, "injection paused or no selector: nothing is injected")
    conditions = [c for c in ss.status.get("conditions") or [] if isinstance(c, dict)]
    cond = next((c for c in conditions if c.get("type") == names.CONDITION_POLICY_INJECTION), None)
    holder = members.get(ss.name)
    if cond is not None:
        message = str(cond.get("message") or "")
        if cond.get("status") == "True":
            named = message.split()[-1] if message.startswith("MutatingAdmissionPolicy ") else None
            return Route("policy", holder or named, message or "PolicyServed")
        return Route("webhook", None, f"{cond.get('reason') or 'NeedsWebhook'}: {message}".rstrip(": "))
    if holder is not None:
        return Route("policy", holder, f"MutatingAdmissionPolicy {holder}")
    try:
        check_servable(ss)
    except NeedsWebhook as e:
        return Route("webhook", None, f"NeedsWebhook: {e}")
    return Route("unknown", None, f"no {names.CONDITION_POLICY_INJECTION} condition yet (is the manager running?)")


def pod_route(verdicts: Sequence[Verdict], *, overrides: bool = False) -> Route:
    """A pod that any webhook-served SidecarSet selects, or that asks for per-pod overrides, goes to
    the webhook whole (injector.policy.plan)."""
    selecting = [v for v in verdicts if v.selects]
    if not selecting:
        return Route("none", None, "no SidecarSet selects the pod")
    if overrides:
        return Route("webhook", None, f"the pod asks for per-pod overrides ({names.ANN_OVERRIDES})")
    for v in selecting:
        if v.route.path == "webhook":
            return Route("webhook", None, f"SidecarSet {v.sidecarset} needs the webhook ({v.route.reason})")
    unknown = [v.sidecarset for v in selecting if v.route.path != "policy"]
    if unknown:
        return Route("unknown", None, f"the path of SidecarSet {', '.join(unknown)} is not reported")
    held = sorted({v.route.policy or "?" for v in selecting})
    return Route("policy", ", ".join(held), f"MutatingAdmissionPolicy {', '.join(held)} (no webhook call)")
