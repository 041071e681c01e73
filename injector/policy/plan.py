"""Which SidecarSets MutatingAdmissionPolicies serve, which the webhook serves and why, and the
condition that narrows the webhook to the pods only it can serve.

Every pod is served by exactly one path:
- a pod that some webhook-served SidecarSet could select goes to the webhook, whole (the policies
  exclude it), so its layout is the engine's even when policy-served SidecarSets select it too;
- a pod only policy-served SidecarSets select is injected inside the API server, and never calls
  the webhook, unless its policy declines it (bookkeeping annotations the CEL cannot rewrite, a
  MergePatchJson into an annotation it already has, per-pod overrides): then the webhook serves it.
The webhook's matchCondition is therefore "W or D": some webhook-served SidecarSet selects the pod
(its namespace selector decided from the request's namespace when it names namespaces only, and
otherwise taken as matching, so the webhook is called rather than skipped), or a policy declines it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from injector.policy import bookkeeping, bundle, cel, generate
from injector.policy.build import NeedsWebhook
from injector.policy.generate import Generated, GroupParts, check_servable
from injector.policy.partscache import PartsCache
from injector.policy.selecting import MAX_CONDITION_CHARS as MAX_CONDITION_CHARS
from injector.policy.selecting import MAX_EXACT_CHARS, pods_selected
from sidecarsets.spec import podindex, selectors
from sidecarsets.spec.enums import PatchPolicy
from sidecarsets.spec.model import SidecarSet

# A policy near etcd's 1.5 MiB object limit (or with hundreds of containers) compiles slowly and
# may exceed the API server's CEL limits: such a group stays on the webhook.
MAX_POLICY_BYTES = 512 * 1024
FIRST_REVISION = "waiting for the controller to record its first revision (status.latestRevision)"


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
    PENDING = "Pending"  # not planned yet: support still being detected, or no revision recorded yet
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
    awaiting: frozenset[str] = frozenset()  # on the webhook only until their first revision is recorded
    mode: Mode = Mode.WEBHOOK  # WEBHOOK also where policies cannot be used: the webhook takes every pod
    webhook_sets: tuple[SidecarSet, ...] = ()  # the active SidecarSets on the webhook, and on policies
    policy_sets: tuple[SidecarSet, ...] = ()

    def webhook_served(self) -> list[str]:
        return sorted(name for name, route in self.routes.items() if route.path is Path.WEBHOOK)

    @cached_property
    def webhook_condition(self) -> str:
        """CEL for the pod webhook's matchCondition, built when first asked: while policies settle a pass
        asks `condition(settling)` instead, and at 600 SidecarSets either costs tens of milliseconds."""
        return self.condition()

    def condition(self, settling: Iterable[SidecarSet] = ()) -> str:
        """The webhook's condition, widened to every pod `settling` selects (`webhook_condition`)."""
        if self.mode is Mode.WEBHOOK:
            return "true"
        return webhook_condition(list(self.webhook_sets), list(self.policy_sets), self.mode, settling)


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
    """CEL over a webhook request: a policy-served SidecarSet selects the pod but its policy leaves it.

    Every policy leaves a pod whose hash annotations are not in the form it can rewrite, and a pod
    that asks for per-pod overrides, so those tests are written once, behind "some policy-served
    SidecarSet could select it" read by anchors (one lookup of the label that tells the sets apart):
    every policy-served pod evaluates it, and exact selectors there would cost each pod a term per
    SidecarSet sharing its anchor's key, to send at most a few more pods (with hand-written hash
    annotations) to the webhook, which serves them right. A MergePatchJson into an annotation the
    pod already has is per SidecarSet (few have one).
    """
    sidecarsets = list(sidecarsets)
    if not sidecarsets:
        return "false"
    left = f"!({bookkeeping.canonical()}) || {bookkeeping.overrides_asked()}"
    terms = [f"(({pods_selected(sidecarsets, approximate=True)}) && ({left}))"]
    for ss in sidecarsets:
        keys = [k for patch in ss.patch_pod_metadata if patch.policy is PatchPolicy.MERGE_PATCH_JSON
                for k, _ in patch.annotations]  # fmt: skip
        if keys:
            present = " || ".join(f"({cel.string(k)} in {cel.ANNOTATIONS})" for k in keys)
            terms.append(f"(({cel.selector(ss.selector, cel.LABELS)}) && ({present}))")
    return " || ".join(terms)


def webhook_condition(
    webhook_sets: list[SidecarSet], policy_sets: list[SidecarSet], mode: Mode, settling: Iterable[SidecarSet] = ()
) -> str:
    """The pod webhook's matchCondition: its own SidecarSets' selectors exact while they are cheap to
    compile (MAX_EXACT_CHARS) and the whole fits (MAX_CONDITION_CHARS), else read by anchors.

    `settling`: policy-served SidecarSets whose policy may not be enforced yet (injector.policysync):
    the webhook takes every pod they select, as if they were its own, all sorted by name. So during a
    burst a SidecarSet whose revision is recorded, moving from the webhook to its unwritten policy,
    leaves the text as it was: each change of it is a write of the webhook configuration that
    kube-apiserver compiles again (about 25 writes a policy when it was widened term by term)."""
    settling = list(settling)
    if settling:
        held = {ss.name for ss in settling}
        policy_sets = [ss for ss in policy_sets if ss.name not in held]
        if mode is not Mode.POLICY:
            own = {ss.name: ss for ss in (*webhook_sets, *settling)}
            webhook_sets = [own[name] for name in sorted(own)]
    declines = policies_decline(policy_sets)
    if mode is Mode.POLICY:
        return f"({declines}) || ({pods_selected(settling, approximate=True)})" if settling else declines
    selected = pods_selected(webhook_sets)
    condition = f"({selected}) || ({declines})"
    if len(selected) > MAX_EXACT_CHARS or len(condition) > MAX_CONDITION_CHARS:
        condition = f"({pods_selected(webhook_sets, approximate=True)}) || ({declines})"
    return condition


def may_share_pods(a: SidecarSet, b: SidecarSet) -> bool:
    """Whether some pod could be selected by both (conservative: unsure means yes)."""
    both = a.namespace_selector is not None and b.namespace_selector is not None
    if both and not selectors.overlap(a.namespace_selector or {}, b.namespace_selector or {}):
        return False
    return selectors.overlap(a.selector, b.selector)


class OverlapIndex:
    """Which of some SidecarSets may share pods with a given one, without comparing every pair.

    Two SidecarSets whose pod selectors each require one value out of disjoint sets for the same
    label key (`team: t1` and `team: t2`, the usual case) can never select one pod; only the others
    are compared (`may_share_pods`). At 1,000 SidecarSets that is a few thousand comparisons a pass
    instead of half a million.
    """

    def __init__(self, sidecarsets: Iterable[SidecarSet]) -> None:
        self.sidecarsets = list(sidecarsets)
        self._by_key: dict[str, dict[str, list[int]]] = {}
        self._loose: list[int] = []  # no label block: a candidate for every query
        # Anchored on the label that tells them apart (`team` in `{team: t7, tier: web}`, not `tier`).
        self.chosen = podindex.Anchors(ss.selector for ss in self.sidecarsets)
        for i, ss in enumerate(self.sidecarsets):
            anchor = self.chosen.block(ss.selector)
            if anchor is None:
                self._loose.append(i)
                continue
            for value in anchor[1]:
                self._by_key.setdefault(anchor[0], {}).setdefault(value, []).append(i)

    def sharing(self, ss: SidecarSet) -> list[int]:
        """Indices of the SidecarSets that may share pods with `ss` (compared exactly).

        Every label `ss` requires prunes: an entry anchored on one of those keys is a candidate only
        under a value `ss` allows. Pruning by the one anchor `ss` would have among these SidecarSets
        compared every entry whenever that anchor's key was not theirs (`{team: p7, kind: p}` against
        webhook-served `{team: wK, kind: w}` chose `kind`, all 0 shared: 1,000 comparisons a query)."""
        required = _required_values(ss.selector)
        near: set[int] = set(self._loose)
        for key, by_value in self._by_key.items():
            allowed = required.get(key)
            if allowed is None:
                near.update(i for members in by_value.values() for i in members)
            else:
                near.update(i for v in allowed & by_value.keys() for i in by_value[v])
        return [i for i in sorted(near) if self.sidecarsets[i] is not ss and may_share_pods(ss, self.sidecarsets[i])]


def _required_values(selector: Mapping[str, Any] | None) -> dict[str, set[str]]:
    """Label key -> the values a pod `selector` matches must carry under it (matchLabels, `In`)."""
    required: dict[str, set[str]] = {}
    for alternative in podindex.requirements(selector) or ():
        if alternative and all(kind == "label" for kind, _, _ in alternative):
            key = alternative[0][1]
            values = {str(v) for _, _, v in alternative}
            required[key] = required[key] & values if key in required else values
    return required


def overlap_groups(sidecarsets: list[SidecarSet]) -> list[list[SidecarSet]]:
    """Connected groups of SidecarSets that could select the same pod (most groups have one member)."""
    parent = list(range(len(sidecarsets)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index = OverlapIndex(sidecarsets)
    for i, ss in enumerate(sidecarsets):
        for j in index.sharing(ss):
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
    previous: Mapping[str, str] | None = None,
    cache: PartsCache | None = None,
    await_revisions: bool = False,
) -> Plan:
    """The routes for `sidecarsets`; `unsupported` says why this API server cannot run policies;
    `refused` names SidecarSets whose policy the API server would not take (and its message);
    `previous` maps SidecarSets to the policy that injects them now (injector.policy.bundle.pack);
    `await_revisions` keeps a SidecarSet without a recorded revision on the webhook (the cluster's
    sync; a file explained offline has no status)."""
    sidecarsets = list(sidecarsets)
    active = [ss for ss in sidecarsets if not ss.injection_paused and not selectors.is_empty(ss.selector)]
    idle = Route(Path.NONE, Why.NOT_INJECTING, "injection paused or no selector: nothing is injected")
    routes = {ss.name: idle for ss in sidecarsets}
    if mode is Mode.WEBHOOK:
        routes.update({ss.name: Route(Path.WEBHOOK, Why.WEBHOOK_MODE, "--injection=webhook") for ss in active})
        return Plan((), routes)
    if unsupported is not None:
        routes.update({ss.name: Route(Path.WEBHOOK, Why.UNSUPPORTED, unsupported) for ss in active})
        return Plan((), routes)
    on_webhook: dict[str, str] = dict(refused or {})
    for ss in active:
        try:
            check_servable(ss)
        except NeedsWebhook as e:
            on_webhook[ss.name] = str(e)
    # A policy records the SidecarSet's revision in each pod, as the webhook does. Written before the
    # controller has recorded the first one, it must be written again moments later, and a policy of
    # many groups takes the API server seconds to compile each time: the webhook serves a new
    # SidecarSet until then. With --injection=policy there is no webhook to wait on.
    waiting = (
        {ss.name for ss in active if ss.latest_revision is None and ss.name not in on_webhook}
        if mode is Mode.AUTO and await_revisions
        else set()
    )
    on_webhook.update({name: FIRST_REVISION for name in waiting})
    cache = cache if cache is not None else PartsCache()
    groups: list[GroupParts] = []
    for _ in range(len(active) + 1):  # a group falling back can push its overlapping neighbours' exclusions
        servable = [ss for ss in active if ss.name not in on_webhook]
        webhook_sets = [ss for ss in active if ss.name in on_webhook]
        groups, failed = _generate_groups(
            servable, webhook_sets, manager_namespace, timestamp, cache, loose_to_webhook=mode is Mode.AUTO
        )
        if not failed:
            break
        on_webhook.update(failed)
    for ss in active:
        if ss.name in on_webhook:
            why = Why.PENDING if ss.name in waiting else Why.NEEDS_WEBHOOK
            routes[ss.name] = Route(Path.WEBHOOK, why, on_webhook[ss.name])
    oldest_first = sorted(groups, key=lambda g: min((ss.creation_timestamp, ss.name) for ss in g.sidecarsets))
    generated = tuple(
        cache.policy(name, packed, manager_namespace=manager_namespace)
        for name, packed in bundle.pack(oldest_first, previous or {})
    )
    cache.prune()
    for g in generated:
        for name in g.members:
            routes[name] = Route(Path.POLICY, Why.POLICY_SERVED, f"MutatingAdmissionPolicy {g.name}", g.name)
    webhook_sets = [ss for ss in active if ss.name in on_webhook]
    policy_sets = [ss for ss in active if ss.name not in on_webhook]
    return Plan(generated, routes, frozenset(waiting), mode, tuple(webhook_sets), tuple(policy_sets))


def _generate_groups(
    servable: list[SidecarSet],
    webhook_sets: list[SidecarSet],
    manager_namespace: str,
    timestamp: str,
    cache: PartsCache,
    *,
    loose_to_webhook: bool,
) -> tuple[list[GroupParts], dict[str, str]]:
    """The groups' policy parts, and the SidecarSets no policy serves (with why).

    `loose_to_webhook`: a group with a SidecarSet whose selector requires no pod label (only
    `NotIn` or `DoesNotExist`) goes to the webhook. Its policy's condition would hold for every pod of
    every injection-enabled namespace, each paying the group's CEL; the webhook's condition tests its
    selector exactly, a few label lookups, and only its pods call the webhook.
    """
    generated: list[GroupParts] = []
    failed: dict[str, str] = {}
    near_index = OverlapIndex(webhook_sets)
    for group in overlap_groups(servable):
        loose = [ss.name for ss in group if podindex.label_anchors(ss.selector) is None]
        if loose_to_webhook and loose:
            why = (
                f"the selector of {', '.join(loose)} requires no pod label: its policy would be evaluated for every "
                "pod of every injection-enabled namespace; the webhook's condition tests it exactly"
            )
            failed.update({ss.name: why for ss in group})
            continue
        # Only the webhook's sets that could select the group's pods need excluding (each costs CEL per pod).
        near = tuple(webhook_sets[i] for i in sorted({i for m in group for i in near_index.sharing(m)}))
        models = (*group, *near)
        key: tuple[object, ...] = (tuple(ss.name for ss in group), tuple(w.name for w in near), timestamp)
        parts = cache.get(key, models)
        if parts is None:
            exclude = policy_excludes(near) if near else None
            try:
                parts = generate.parts(group, timestamp=timestamp, manager_namespace=manager_namespace, exclude=exclude)
            except NeedsWebhook as e:
                failed.update({ss.name: f"{e} (with {', '.join(s.name for s in group)})" for ss in group})
                continue
            cache.put(key, models, parts)
        size = parts.size
        if size > MAX_POLICY_BYTES:
            failed.update({ss.name: f"its policy would be {size} bytes, over {MAX_POLICY_BYTES}" for ss in group})
            continue
        generated.append(parts)
    return generated, failed
