"""One overlap group of SidecarSets -> one JSONPatch MutatingAdmissionPolicy and its binding.

The policy is the injection engine (injector.engine.engine) written as CEL, with every SidecarSet value a
literal but those a new image changes (read from the policy's parameter object, injector.policy.params),
so a pod gets exactly what the webhook would give it: BeforeApp/AfterApp blocks in
SidecarSet order, same-name containers replaced in place, init containers sorted by name, only the
mounted volumes (the pod's own winning), shared volumes and their subPathExpr env vars, transferred
env vars, pull secrets, patchPodMetadata, the bookkeeping annotations merged with other
SidecarSets' entries, IS_INJECTED, the default-container annotation.

Why one policy per *group* (SidecarSets that could select the same pod), not per SidecarSet: the
API server applies independent policies in an order that changes whenever it recompiles them, and
the engine's result depends on the order (placement, name-ordered init containers, the older
SidecarSet winning a name). Why JSONPatch: an ApplyConfiguration cannot add a container with a
`fieldRef` env var, merges a same-name container instead of replacing it, and cannot place
containers before the app. Why `reinvocationPolicy: Never`: the guards make a second run a no-op,
and an IfNeeded policy runs twice on every pod it changes.

What a policy cannot express raises NeedsWebhook naming the feature; the webhook serves those
SidecarSets (injector.policy.plan).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson

from injector.engine.selection import precedence
from injector.policy import bookkeeping, cel
from injector.policy.build import Build, NeedsWebhook, V
from injector.policy.metadataops import MetadataOps
from injector.policy.specops import SpecOps
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names, selectors
from sidecarsets.spec.enums import PatchPolicy, UpgradeType
from sidecarsets.spec.model import SidecarSet

POLICY_API = "admissionregistration.k8s.io/v1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "sidecarctl"}
ANN_MEMBERS = "sidecarctl.io/sidecarsets"


def covers(want: Any, have: Any) -> bool:
    """`have` holds every field of `want` with its value (the API server adds defaults of its own)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and covers(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(covers, want, have))
    return bool(want == have)


def check_servable(ss: SidecarSet) -> None:
    """Raise NeedsWebhook for a feature of `ss` that a policy cannot express (or its owner keeps off them)."""
    if ss.annotations.get(names.ANN_INJECTION_PATH) == "webhook":
        raise NeedsWebhook(f"annotation {names.ANN_INJECTION_PATH}=webhook")
    if ss.canary_base is not None:
        # On the webhook, the pods a canary selects are served whole there (the base's policy leaves
        # them alone), so the engine drops the base for them; the base itself can stay on a policy.
        raise NeedsWebhook(f"canary SidecarSet (it replaces its base {ss.canary_base} in the pods it selects)")
    for sc in ss.containers + ss.init_containers:
        if sc.upgrade_type is UpgradeType.HOT:
            raise NeedsWebhook(
                f"container {sc.name}: upgradeStrategy HotUpgrade (a container pair with version annotations)"
            )
        if sc.has_resources_policy:
            raise NeedsWebhook(f"container {sc.name}: resourcesPolicy (resources computed from the pod's containers)")
    if ss.injection_revision is not None or ss.problem("spec.injectionStrategy.revision") is not None:
        raise NeedsWebhook("injectionStrategy.revision (a pin to a stored ControllerRevision)")
    merged: set[str] = set()
    for patch in ss.patch_pod_metadata:
        if patch.policy is PatchPolicy.MERGE_PATCH_JSON:
            keys = {k for k, _ in patch.annotations}
            if keys & merged:
                raise NeedsWebhook("patchPodMetadata: two MergePatchJson patches of one annotation")
            merged |= keys


@dataclass
class Generated:
    """One MutatingAdmissionPolicy and its binding, serving one or more overlap groups."""

    policy: JsonObj
    binding: JsonObj
    digests: dict[str, str] = field(default_factory=dict)  # group (its members, ",") -> its parts' digest
    params: JsonObj = field(default_factory=dict)  # its parameter object (injector.policy.params)

    @property
    def name(self) -> str:
        return str(self.policy["metadata"]["name"])

    @property
    def groups(self) -> list[list[str]]:
        """The overlap groups this policy injects, each in `injection_order`."""
        text = str(self.policy["metadata"]["annotations"][ANN_MEMBERS])
        return [g.split(",") for g in text.split(";") if g]

    @property
    def members(self) -> list[str]:
        """The SidecarSets this policy injects."""
        return [m for g in self.groups for m in g]


@dataclass(frozen=True)
class GroupParts:
    """One overlap group as a part of a policy: CEL that still names its variables unprefixed.

    `common`: gates every group of the policy shares; `gates`: this group's own, its selector
    first; `patch`: its JSONPatch operations.
    """

    members: tuple[str, ...]
    sidecarsets: tuple[SidecarSet, ...]
    variables: tuple[tuple[str, str], ...]
    common: tuple[str, ...]
    gates: tuple[str, ...]
    patch: str
    # What the CEL reads from the policy's parameter object (injector.policy.params): left out of
    # `digest`, so a change of these alone (a new image) leaves the CEL as the API server compiled it.
    params: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return ",".join(self.members)

    # Both read at every pass of the sync (packing, the stored policies' digests): worked out once.
    @cached_property
    def digest(self) -> str:
        text = repr((self.variables, self.gates, self.patch))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @cached_property
    def size(self) -> int:
        """The bytes the group adds to a policy (its variables, gates and patch), near enough to pack by."""
        return len(orjson.dumps([self.variables, self.gates, self.patch]))


def policy_name(group: list[SidecarSet]) -> str:
    """`sidecarctl-<members>`; a long list is cut and given a digest of the whole, so names never collide."""
    name = "sidecarctl-" + "-".join(ss.name for ss in sorted(group, key=lambda s: s.name))
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return name[:240].rstrip("-.") + "-" + digest


class Generator(SpecOps, MetadataOps):
    """`Generator(group, timestamp=..., manager_namespace=..., exclude=...).parts()`.

    `timestamp` is written as every entry's `updateTimestamp` (CEL has no clock, and at admission a
    pod has no creation time yet). `exclude` is CEL for pods the webhook serves whole (some
    webhook-served SidecarSet could select them): the policy leaves those alone.
    """

    def __init__(
        self, group: list[SidecarSet], *, timestamp: str, manager_namespace: str, exclude: str | None = None
    ) -> None:
        for ss in group:
            check_servable(ss)
        self.group = sorted(group, key=lambda s: s.injection_order)  # the engine's order of SidecarSets
        self.single = len(self.group) == 1
        self.timestamp = timestamp
        self.manager_namespace = manager_namespace
        self.exclude = exclude
        self.b = Build()

    # -- per-SidecarSet runtime truth ---------------------------------------------------------------
    def _matching(self, entries: str, cnames: str, inames: str, labels: str) -> None:
        """ok_i for a group: selected, no cross-list name clash, not beaten by an older member, not recorded."""
        g = self.group
        by_age = sorted(range(len(g)), key=lambda i: precedence(g[i]))  # the engine's: cluster sets win
        claimed: list[int] = []
        for i in by_age:
            ss = g[i]
            match = cel.selector(None if selectors.is_empty(ss.selector) else ss.selector, labels)
            if (scope := cel.in_scope(ss)) is not None:
                match += " && " + scope
            older = [j for j in claimed if not g[j].all_container_names.isdisjoint(ss.all_container_names)]
            beaten = "".join(f" && !{V}chosen{j}" for j in older)
            # As the engine: conflicts are settled among the matching members before recorded ones drop out.
            self.b.var(f"chosen{i}", f"({match}) && !({_cross(ss, cnames, inames)}){beaten}")
            recorded = f"{entries}.exists(e, {bookkeeping.recorded_test(ss, self.quoted_hash(ss))})"
            self.b.var(f"ok{i}", f"{V}chosen{i} && !({recorded})")
            claimed.append(i)

    # -- the objects ---------------------------------------------------------------------------------
    def generate_ops(self) -> None:
        """Fill the Build: variables, patch operations, declining conditions."""
        b = self.b
        anns = b.var("anns", "has(object.metadata.annotations) ? object.metadata.annotations : {}")
        labels = b.var("labels", "has(object.metadata.labels) ? object.metadata.labels : {}")
        cnames = b.var("cnames", "object.spec.containers.map(c, c.name)")
        inames = b.var("inames", "has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.name) : []")
        entries, entries_wi = (
            b.var(
                var,
                f'({cel.string(key)} in {anns} ? {anns}[{cel.string(key)}] : "").findAll({cel.string(bookkeeping.ENTRY_RE)})',
            )
            for var, key in (("hashEntries", names.ANN_HASH), ("hashWIEntries", names.ANN_HASH_WITHOUT_IMAGE))
        )
        apps = b.var(
            "apps",
            'object.spec.containers.filter(c, !(has(c.env) && c.env.exists(e, e.name == "IS_INJECTED" && '
            'has(e.value) && e.value == "true")))',
        )
        if not self.single:
            self._matching(entries, cnames, inames, labels)
        self._containers(apps, cnames, inames)
        self._volumes()
        self._metadata(anns, entries, entries_wi, apps)

    def _gates(self) -> tuple[list[str], list[str]]:
        """(gates every group of a policy shares, this group's own gates), each CEL named in a
        trailing comment. The shared ones are the policy's matchCondition, which reads no variables
        (they are written out); the group's own start its variable, selector first, so that the
        other groups of a policy cost one selector each, and read the policy's variables."""
        common = [
            ("not-deleting", "!has(object.metadata.deletionTimestamp)"),
            (
                "not-terminal",
                '!has(object.status) || !has(object.status.phase) || !(object.status.phase in ["Succeeded", "Failed"])',
            ),
            ("hash-annotations-canonical", bookkeeping.canonical()),
            ("no-per-pod-overrides", f"!({bookkeeping.overrides_asked()})"),
        ]
        labels = V + "labels"
        own = [("a-member-selects-the-pod", " || ".join(f"({cel.selector(ss.selector, labels)})" for ss in self.group))]
        if self.single:
            ss = self.group[0]
            if (scope := cel.in_scope(ss)) is not None:
                own.append(("in-a-selected-namespace", scope))
            own.append(
                (
                    "not-yet-injected",
                    f"!{V}hashEntries.exists(e, {bookkeeping.recorded_test(ss, self.quoted_hash(ss))})",
                )
            )
            own.append(("no-name-clash-with-the-other-list", f"!({_cross(ss, V + 'cnames', V + 'inames')})"))
        else:
            own.append(("some-member-to-inject", " || ".join(V + f"ok{i}" for i in range(len(self.group)))))
        own += [(f"declined-{j}", expr) for j, expr in enumerate(self.b.declines)]
        if self.exclude:
            own.append(("not-for-the-webhook", f"!({self.exclude})"))
        return [f"({expr}) // {name}\n" for name, expr in common], [f"({expr}) // {name}\n" for name, expr in own]

    def parts(self) -> GroupParts:
        """The group as one part of a policy (injector.policy.bundle)."""
        self.generate_ops()
        common, own = self._gates()
        patch = " +\n".join(f"({op})" for op in self.b.ops)
        # The keys it reads are those of this version of its CEL: a kube-apiserver enforces the CEL it
        # compiled last (a second or more after a write) but reads the parameter object as it is now, so
        # a version's keys stay in the object until every server has its successor (injector.policysync).
        version = hashlib.sha256(repr((self.b.variables, own, patch)).encode()).hexdigest()[:12]

        def keyed(text: str) -> str:
            return text.replace(cel.PARAM_KEY, f"{cel.PARAM_KEY}{version}/")

        return GroupParts(
            members=tuple(ss.name for ss in self.group),
            sidecarsets=tuple(self.group),
            variables=tuple((n, keyed(e)) for n, e in self.b.variables),
            common=tuple(common),
            gates=tuple(keyed(g) for g in own),
            patch=keyed(patch),
            params=tuple(sorted((f"{version}/{k}", v) for k, v in self.b.params.items())),
        )


def _cross(ss: SidecarSet, cnames: str, inames: str) -> str:
    """CEL: a container of `ss` is named like a pod init container, or an init container like a container."""
    terms = []
    if ss.containers:
        terms.append(f"{cel.strings(c.name for c in ss.containers)}.exists(n, n in {inames})")
    if ss.init_containers:
        terms.append(f"{cel.strings(c.name for c in ss.init_containers)}.exists(n, n in {cnames})")
    return " || ".join(terms) or "false"


def parts(group: list[SidecarSet], *, timestamp: str, manager_namespace: str, exclude: str | None = None) -> GroupParts:
    """`group` as a part of a policy (NeedsWebhook when a policy cannot inject it)."""
    return Generator(group, timestamp=timestamp, manager_namespace=manager_namespace, exclude=exclude).parts()
