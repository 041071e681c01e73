"""Which SidecarSets MutatingAdmissionPolicies serve, which the webhook serves and why, and the
condition that narrows the webhook to the pods only it can serve.

Every pod is served by exactly one path:
- a pod that some webhook-served SidecarSet could select goes to the webhook, whole (the policies
  exclude it), so its layout is the engine's even when policy-served SidecarSets select it too;
- a pod only policy-served SidecarSets select is injected inside the API server, and never calls
  the webhook, unless its policy declines it (bookkeeping annotations the CEL cannot rewrite, a
  MergePatchJson into an annotation it already has): then the webhook serves it.
The webhook's matchCondition is therefore "W or D": some webhook-served SidecarSet selects the pod
(its namespace selector decided from the request's namespace when it names namespaces only, and
otherwise taken as matching, so the webhook is called rather than skipped), or a policy declines it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import orjson

from injector.policy import bookkeeping, cel
from injector.policy.build import NeedsWebhook
from injector.policy.generate import Generated, check_servable, generate
from sidecarsets.spec import names, selectors
from sidecarsets.spec.enums import PatchPolicy
from sidecarsets.spec.model import SidecarSet

# A policy near etcd's 1.5 MiB object limit (or with hundreds of containers) compiles slowly and
# may exceed the API server's CEL limits: such a group stays on the webhook.
MAX_POLICY_BYTES = 512 * 1024


class Mode(StrEnum):
    AUTO = "auto"  # policies where they can serve, the webhook for the rest
    WEBHOOK = "webhook"  # no policies: the webhook serves every pod
    POLICY = "policy"  # no pod webhook: a SidecarSet a policy cannot serve is refused


class Path(StrEnum):
    POLICY = "policy"
    WEBHOOK = "webhook"
    NONE = "none"  # paused, or no selector: nothing to inject


class Why(StrEnum):
    """The PolicyInjection condition's reason."""

    POLICY_SERVED = "PolicyServed"
    NEEDS_WEBHOOK = "NeedsWebhook"  # a feature a policy cannot express
    WEBHOOK_MODE = "WebhookMode"  # --injection=webhook
    UNSUPPORTED = "PolicyUnsupported"  # the API server does not enforce MutatingAdmissionPolicy
    PENDING = "Pending"  # not planned yet (support still being detected)
    NOT_INJECTING = "NotInjecting"


@dataclass(frozen=True)
class Route:
    path: Path
    why: Why
    message: str  # for people: which policy, or the feature that needs the webhook
    policy: str | None = None

    def condition(self) -> tuple[str, str, str]:
        """(status, reason, message) of the PolicyInjection condition."""
        return ("True" if self.path is Path.POLICY else "False"), str(self.why), self.message


@dataclass(frozen=True)
class Plan:
    policies: tuple[Generated, ...] = ()
    routes: dict[str, Route] = field(default_factory=dict)
    webhook_condition: str = "true"  # CEL for the pod webhook's matchCondition

    def webhook_served(self) -> list[str]:
        return sorted(name for name, route in self.routes.items() if route.path is Path.WEBHOOK)


def webhook_selects(sidecarsets: Iterable[SidecarSet]) -> str:
    """CEL over a webhook request: some of `sidecarsets` could select the pod (never narrower than exact)."""
    terms = []
    for ss in sidecarsets:
        if ss.injection_paused or selectors.is_empty(ss.selector):
            continue
        term = cel.selector(ss.selector, cel.LABELS)
        if ss.namespace_selector is not None and _names_namespaces_only(ss):
            term += " && " + cel.selector(ss.namespace_selector, '{"kubernetes.io/metadata.name": request.namespace}')
        terms.append(f"({term})")
    return " || ".join(terms) or "false"


def policy_excludes(sidecarsets: Iterable[SidecarSet]) -> str:
    """CEL inside a policy (namespaceObject available): some of `sidecarsets` selects the pod exactly."""
    terms = []
    for ss in sidecarsets:
        if ss.injection_paused or selectors.is_empty(ss.selector):
            continue
        term = cel.selector(ss.selector, cel.LABELS)
        if ss.namespace_selector is not None:
            term += " && " + cel.selector(ss.namespace_selector, "namespaceObject.metadata.labels")
        terms.append(f"({term})")
    return " || ".join(terms) or "false"


def policies_decline(sidecarsets: Iterable[SidecarSet]) -> str:
    """CEL over a webhook request: a policy-served SidecarSet selects the pod but its policy leaves it."""
    terms = []
    for ss in sidecarsets:
        why = [f"!({bookkeeping.canonical()})"]
        for patch in ss.patch_pod_metadata:
            if patch.policy is PatchPolicy.MERGE_PATCH_JSON:
                why += [f"({cel.string(k)} in {cel.ANNOTATIONS})" for k, _ in patch.annotations]
        terms.append(f"(({cel.selector(ss.selector, cel.LABELS)}) && ({' || '.join(why)}))")
    return " || ".join(terms) or "false"


def _names_namespaces_only(ss: SidecarSet) -> bool:
    sel = ss.namespace_selector or {}
    keys = set(sel.get("matchLabels") or {}) | {e.get("key") for e in sel.get("matchExpressions") or []}
    return keys <= {names.NS_NAME_LABEL}


def may_share_pods(a: SidecarSet, b: SidecarSet) -> bool:
    """Whether some pod could be selected by both (conservative: unsure means yes)."""
    both = a.namespace_selector is not None and b.namespace_selector is not None
    if both and not selectors.overlap(a.namespace_selector or {}, b.namespace_selector or {}):
        return False
    return selectors.overlap(a.selector, b.selector)


def overlap_groups(sidecarsets: list[SidecarSet]) -> list[list[SidecarSet]]:
    """Connected groups of SidecarSets that could select the same pod (most groups have one member)."""
    parent = list(range(len(sidecarsets)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(sidecarsets)):
        for j in range(i + 1, len(sidecarsets)):
            if may_share_pods(sidecarsets[i], sidecarsets[j]):
                parent[root(i)] = root(j)
    groups: dict[int, list[SidecarSet]] = {}
    for i, ss in enumerate(sidecarsets):
        groups.setdefault(root(i), []).append(ss)
    return sorted((sorted(g, key=lambda s: s.name) for g in groups.values()), key=lambda g: g[0].name)


def plan(
    sidecarsets: Iterable[SidecarSet],
    *,
    mode: Mode,
    manager_namespace: str,
    timestamp: str,
    unsupported: str | None = None,
    refused: Mapping[str, str] | None = None,
) -> Plan:
    """The routes for `sidecarsets`; `unsupported` says why this API server cannot run policies;
    `refused` names SidecarSets whose policy the API server would not take (and its message)."""
    sidecarsets = list(sidecarsets)
    active = [ss for ss in sidecarsets if not ss.injection_paused and not selectors.is_empty(ss.selector)]
    idle = Route(Path.NONE, Why.NOT_INJECTING, "injection paused or no selector: nothing is injected")
    routes = {ss.name: idle for ss in sidecarsets}
    if mode is Mode.WEBHOOK:
        routes.update({ss.name: Route(Path.WEBHOOK, Why.WEBHOOK_MODE, "--injection=webhook") for ss in active})
        return Plan((), routes, "true")
    if unsupported is not None:
        routes.update({ss.name: Route(Path.WEBHOOK, Why.UNSUPPORTED, unsupported) for ss in active})
        return Plan((), routes, "true")
    on_webhook: dict[str, str] = dict(refused or {})
    for ss in active:
        try:
            check_servable(ss)
        except NeedsWebhook as e:
            on_webhook[ss.name] = str(e)
    generated: list[Generated] = []
    for _ in range(len(active) + 1):  # a group falling back can push its overlapping neighbours' exclusions
        servable = [ss for ss in active if ss.name not in on_webhook]
        webhook_sets = [ss for ss in active if ss.name in on_webhook]
        generated, failed = _generate_groups(servable, webhook_sets, manager_namespace, timestamp)
        if not failed:
            break
        on_webhook.update(failed)
    for ss in active:
        if ss.name in on_webhook:
            routes[ss.name] = Route(Path.WEBHOOK, Why.NEEDS_WEBHOOK, on_webhook[ss.name])
    for g in generated:
        for name in g.members:
            routes[name] = Route(Path.POLICY, Why.POLICY_SERVED, f"MutatingAdmissionPolicy {g.name}", g.name)
    webhook_sets = [ss for ss in active if ss.name in on_webhook]
    policy_sets = [ss for ss in active if ss.name not in on_webhook]
    if mode is Mode.POLICY:
        condition = policies_decline(policy_sets)
    else:
        condition = f"({webhook_selects(webhook_sets)}) || ({policies_decline(policy_sets)})"
    return Plan(tuple(generated), routes, condition)


def _generate_groups(
    servable: list[SidecarSet], webhook_sets: list[SidecarSet], manager_namespace: str, timestamp: str
) -> tuple[list[Generated], dict[str, str]]:
    generated: list[Generated] = []
    failed: dict[str, str] = {}
    for group in overlap_groups(servable):
        # Only the webhook's sets that could select the group's pods need excluding (each costs CEL per pod).
        near = [w for w in webhook_sets if any(may_share_pods(w, m) for m in group)]
        exclude = policy_excludes(near) if near else None
        try:
            g = generate(group, timestamp=timestamp, manager_namespace=manager_namespace, exclude=exclude)
        except NeedsWebhook as e:
            failed.update({ss.name: f"{e} (with {', '.join(s.name for s in group)})" for ss in group})
            continue
        size = len(orjson.dumps(g.policy))
        if size > MAX_POLICY_BYTES:
            failed.update({ss.name: f"its policy would be {size} bytes, over {MAX_POLICY_BYTES}" for ss in group})
            continue
        generated.append(g)
    return generated, failed
