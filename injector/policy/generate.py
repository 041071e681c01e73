"""One overlap group of SidecarSets -> one JSONPatch MutatingAdmissionPolicy and its binding.

The policy is the injection engine (injector.engine) written as CEL, with every SidecarSet value a
literal, so a pod gets exactly what the webhook would give it: BeforeApp/AfterApp blocks in
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
import json
from dataclasses import dataclass, field
from typing import Any

from injector.policy import bookkeeping, cel, podfields
from kuberuntime.jsontypes import JsonObj
from sidecarsets import names, selectors
from sidecarsets.enums import InjectPolicy, PatchPolicy, UpgradeType
from sidecarsets.model import SidecarSet
from sidecarsets.sidecar import SidecarContainer

V = cel.VARIABLES
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


class NeedsWebhook(Exception):
    """The SidecarSet (or group) cannot be served by a policy; the message names the feature."""


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
    policy: JsonObj
    binding: JsonObj

    @property
    def name(self) -> str:
        return str(self.policy["metadata"]["name"])

    @property
    def members(self) -> list[str]:
        """The SidecarSets this policy injects, in name order."""
        return str(self.policy["metadata"]["annotations"][ANN_MEMBERS]).split(",")


@dataclass
class _Build:
    """The policy being written: named CEL variables, patch operations, declining conditions."""

    variables: list[tuple[str, str]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    declines: list[str] = field(default_factory=list)
    annotations: list[tuple[str, str, str | None]] = field(default_factory=list)  # key, value, written when

    def var(self, name: str, expr: str) -> str:
        self.variables.append((name, expr))
        return V + name


def policy_name(group: list[SidecarSet]) -> str:
    """`sidecarctl-<members>`; a long list is cut and given a digest of the whole, so names never collide."""
    name = "sidecarctl-" + "-".join(ss.name for ss in sorted(group, key=lambda s: s.name))
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return name[:240].rstrip("-.") + "-" + digest


class Generator:
    """`Generator(group, timestamp=..., manager_namespace=..., exclude=...).generate()`.

    `timestamp` is written as every entry's `updateTimestamp` (CEL has no clock, and at admission a
    pod has no creation time yet). `exclude` is CEL for pods the webhook serves whole (some
    webhook-served SidecarSet could select them): the policy leaves those alone.
    """

    def __init__(
        self, group: list[SidecarSet], *, timestamp: str, manager_namespace: str, exclude: str | None = None
    ) -> None:
        for ss in group:
            check_servable(ss)
        self.group = sorted(group, key=lambda s: s.name)  # the engine applies SidecarSets in name order
        self.single = len(self.group) == 1
        self.timestamp = timestamp
        self.manager_namespace = manager_namespace
        self.exclude = exclude
        self.b = _Build()

    # -- per-SidecarSet runtime truth ---------------------------------------------------------------
    def ok(self, i: int) -> str:
        """CEL: SidecarSet i is injected into this pod (always true for a group of one: the binding gates it)."""
        return "true" if self.single else V + f"ok{i}"

    def _matching(self, entries: str, cnames: str, inames: str, labels: str) -> None:
        """ok_i for a group: selected, no cross-list name clash, not beaten by an older member, not recorded."""
        g = self.group
        by_age = sorted(range(len(g)), key=lambda i: (g[i].creation_timestamp, g[i].name))
        claimed: list[int] = []
        for i in by_age:
            ss = g[i]
            match = cel.selector(None if selectors.is_empty(ss.selector) else ss.selector, labels)
            if ss.namespace_selector is not None:
                match += " && " + cel.selector(ss.namespace_selector, "(namespaceObject.metadata.labels)")
            older = [j for j in claimed if not g[j].all_container_names.isdisjoint(ss.all_container_names)]
            beaten = "".join(f" && !{V}chosen{j}" for j in older)
            # As the engine: conflicts are settled among the matching members before recorded ones drop out.
            self.b.var(f"chosen{i}", f"({match}) && !({_cross(ss, cnames, inames)}){beaten}")
            recorded = f"{entries}.exists(e, {bookkeeping.recorded_test(ss)})"
            self.b.var(f"ok{i}", f"{V}chosen{i} && !({recorded})")
            claimed.append(i)

    # -- containers ---------------------------------------------------------------------------------
    def _shared(self, apps: str) -> tuple[str | None, str | None, str | None]:
        every = [sc for ss in self.group for sc in ss.containers + ss.init_containers]
        mounts = env = devices = None
        if any(sc.share_volumes for sc in every):
            mounts = self.b.var(
                "sharedMounts",
                f"{apps}.map(c, has(c.volumeMounts) ? c.volumeMounts : []).flatten().map(m, {podfields.mount('m')})",
            )
            refs = 'm.subPathExpr.findAll("\\\\$\\\\([^()]+\\\\)").map(r, r.substring(2, size(r) - 1))'
            env = self.b.var(
                "sharedEnv",
                f'{apps}.map(c, has(c.volumeMounts) && has(c.env) ? c.volumeMounts.map(m, has(m.subPathExpr) && m.subPathExpr != "" ? '
                f"c.env.filter(e, e.name in {refs}) : []).flatten() : []).flatten().map(e, {podfields.env('e')})",
            )
        if any(sc.share_volume_devices for sc in every):
            devices = self.b.var(
                "sharedDevices",
                f"{apps}.map(c, has(c.volumeDevices) ? c.volumeDevices : []).flatten().map(d, {podfields.device('d')})",
            )
        return mounts, env, devices

    def _transferred(self, sc: SidecarContainer, labels: str, anns: str) -> list[str]:
        parts = []
        for te in sc.transfer_env:
            if te.source_field_path is None:
                source = cel.string(te.source_container_name or "")
            elif te.source_field_path == "metadata.name":
                source = '(has(object.metadata.name) ? string(object.metadata.name) : "")'
            else:
                section, _, rest = te.source_field_path.partition("['")
                key = rest[:-2]
                where = labels if section.endswith("labels") else anns
                source = f'({cel.string(key)} in {where} ? string({where}[{cel.string(key)}]) : "")'
            # As the engine: in the (sorted) order of the names, each var's last definition in the source.
            parts.append(
                f"object.spec.containers.filter(c, c.name == {source}).map(c, has(c.env) ? "
                f"{cel.strings(te.env_names)}.map(n, c.env.filter(e, e.name == n)).filter(l, size(l) > 0)"
                f".map(l, l[size(l) - 1]) : []).flatten().map(e, {podfields.env('e')})"
            )
        return parts

    def _container(self, key: str, sc: SidecarContainer, shared: tuple[str | None, str | None, str | None]) -> str:
        """CEL for the container as it goes into the pod (engine._sidecar)."""
        mounts, shared_env, devices = shared
        c = sc.fresh_container()
        own_env = [e for e in c.get("env") or [] if e.get("name") != names.ENV_IS_INJECTED]
        own_env.append({"name": names.ENV_IS_INJECTED, "value": "true"})
        items = [f"{cel.string(k)}: dyn({cel.literal(v)})" for k, v in c.items() if k not in _LISTS]
        parts = self._transferred(sc, V + "labels", V + "anns")
        if sc.share_volumes and shared_env is not None:
            parts.append(shared_env)
        env = cel.literal(own_env)
        if parts:
            extra = self.b.var(f"extraEnv{key}", " + ".join(parts))
            env += " + " + _unique(extra, "name", [e["name"] for e in own_env])
        items.append(f'"env": dyn({env})')
        own_mounts = c.get("volumeMounts") or []
        if sc.share_volumes and mounts is not None:
            unique = _unique(mounts, "mountPath", [m["mountPath"] for m in own_mounts])
            items.append(f'"volumeMounts": dyn({cel.literal(own_mounts)} + {unique})')
        elif "volumeMounts" in c:
            items.append(f'"volumeMounts": dyn({cel.literal(own_mounts)})')
        own_devices = c.get("volumeDevices") or []
        if sc.share_volume_devices and devices is not None:
            unique = _unique(devices, "devicePath", [d["devicePath"] for d in own_devices])
            items.append(f'"volumeDevices": dyn({cel.literal(own_devices)} + {unique})')
        elif "volumeDevices" in c:
            items.append(f'"volumeDevices": dyn({cel.literal(own_devices)})')
        return self.b.var(f"c{key}", "{" + ", ".join(items) + "}")

    def _place(
        self, path: str, existing: str, items: list[tuple[str, InjectPolicy, str, str]], *, optional: bool
    ) -> None:
        """Operations for one container list (engine placement): replace same names, Before block, append."""
        if not items:
            return

        def when(ok: str, more: str) -> str:
            return more if ok == "true" else f"{ok} && {more}"

        replace = " + ".join(
            f'({when(ok, f"{cel.string(n)} in {existing}")} ? [JSONPatch{{op: "replace", path: '
            f"{cel.string(path + '/')} + string({existing}.indexOf({cel.string(n)})), value: {e}}}] : [])"
            for ok, _, n, e in items
        )
        absent = [(ok, p, f"({when(ok, f'!({cel.string(n)} in {existing})')} ? [{e}] : [])") for ok, p, n, e in items]
        key = path.rsplit("/", 1)[1]
        before = self.b.var(
            f"before_{key}", " + ".join(x for _, p, x in absent if p == InjectPolicy.BEFORE_APP) or "[]"
        )
        after = self.b.var(f"after_{key}", " + ".join(x for _, p, x in absent if p != InjectPolicy.BEFORE_APP) or "[]")
        adds = (
            f'lists.range(size({before})).map(j, JSONPatch{{op: "add", path: {cel.string(path + "/")} + string(j), '
            f'value: {before}[j]}}) + {after}.map(x, JSONPatch{{op: "add", path: {cel.string(path + "/-")}, value: x}})'
        )
        if optional:  # the whole list is added when the pod has none
            whole = f'[JSONPatch{{op: "add", path: {cel.string(path)}, value: {before} + {after}}}]'
            self.b.ops.append(
                f"(size({existing}) == 0 ? (size({before}) + size({after}) > 0 ? {whole} : []) : ({replace}) + {adds})"
            )
        else:
            self.b.ops.append(f"({replace}) + {adds}")

    def _containers(self, apps: str, cnames: str, inames: str) -> None:
        shared = self._shared(apps)
        inits: list[tuple[str, InjectPolicy, str, str]] = []
        conts: list[tuple[str, InjectPolicy, str, str]] = []
        for i, ss in enumerate(self.group):
            for k, sc in enumerate(ss.init_containers):
                inits.append((self.ok(i), sc.inject_policy, sc.name, self._container(f"{i}_i{k}", sc, shared)))
            for k, sc in enumerate(ss.containers):
                conts.append((self.ok(i), sc.inject_policy, sc.name, self._container(f"{i}_c{k}", sc, shared)))
        inits.sort(key=lambda t: t[2])  # the engine sorts injected init containers by name
        self._place("/spec/initContainers", inames, inits, optional=True)
        self._place("/spec/containers", cnames, conts, optional=False)

    # -- volumes and pull secrets --------------------------------------------------------------------
    def _append_named(self, path: str, list_field: str, per_member: list[list[JsonObj]]) -> None:
        if not any(per_member):
            return
        have = self.b.var(
            f"have_{list_field}", f"has(object.spec.{list_field}) ? object.spec.{list_field}.map(v, v.name) : []"
        )
        if self.single:
            first: list[JsonObj] = []
            for v in per_member[0]:
                if all(x["name"] != v["name"] for x in first):
                    first.append(v)
            new = self.b.var(f"new_{list_field}", f"{cel.literal(first)}.filter(v, !(v.name in {have}))")
        else:
            candidates = " + ".join(f"({self.ok(i)} ? {cel.literal(v)} : [])" for i, v in enumerate(per_member) if v)
            every = self.b.var(f"all_{list_field}", candidates)
            new = self.b.var(
                f"new_{list_field}",
                f"lists.range(size({every})).filter(j, !({every}[j].name in {have}) && "
                f"!{every}.slice(0, j).exists(x, x.name == {every}[j].name)).map(j, {every}[j])",
            )
        self.b.ops.append(
            f'(size({new}) == 0 ? [] : size({have}) == 0 ? [JSONPatch{{op: "add", path: {cel.string(path)}, value: {new}}}] : '
            f'{new}.map(x, JSONPatch{{op: "add", path: {cel.string(path + "/-")}, value: x}}))'
        )

    def _volumes(self) -> None:
        volumes = []
        for ss in self.group:
            mounted = [ss.volume(n) for sc in ss.init_containers + ss.containers for n in sc.mounted_volume_names()]
            volumes.append([v for v in mounted if v is not None])
        self._append_named("/spec/volumes", "volumes", volumes)
        self._append_named(
            "/spec/imagePullSecrets", "imagePullSecrets", [list(ss.image_pull_secrets) for ss in self.group]
        )

    # -- labels and annotations ----------------------------------------------------------------------
    def _annotation(self, key: str, value: str, when: str | None = None) -> None:
        self.b.annotations.append((key, value, None if when in (None, "true") else when))

    def _annotation_ops(self) -> str:
        """One op per annotation on a pod that has some; one op adding them all to a pod with none
        (most new pods: fewer operations is a cheaper patch for the API server)."""
        per_key = []
        entries = []
        for key, value, when in self.b.annotations:
            op = f'JSONPatch{{op: "add", path: {cel.string("/metadata/annotations/" + cel.pointer(key))}, value: {value}}}'
            per_key.append(f"[{op}]" if when is None else f"({when} ? [{op}] : [])")
            k = cel.string(key)
            entries.append(
                f"{k}: dyn({value})"
                if when is None
                else f"?{k}: ({when}) ? optional.of(dyn({value})) : optional.none()"
            )
        whole = "{" + ", ".join(entries) + "}"
        return (
            f"has(object.metadata.annotations) ? ({' + '.join(per_key) or '[]'}) : "
            f'[JSONPatch{{op: "add", path: "/metadata/annotations", value: {whole}}}]'
        )

    def _patch_pod_metadata(self, anns: str) -> set[str]:
        """patchPodMetadata folded per key in the engine's order; returns the keys surely written."""
        per_key: dict[str, list[tuple[int, PatchPolicy, str]]] = {}
        for i, ss in enumerate(self.group):
            for patch in ss.patch_pod_metadata:
                for k, v in patch.annotations:
                    per_key.setdefault(k, []).append((i, patch.policy, v))
        written: set[str] = set()
        for key, steps in per_key.items():
            present = f"({cel.string(key)} in {anns})"
            presence, value, merged = present, f"({anns}[{cel.string(key)}])", False
            for i, policy, v in steps:
                ok = self.ok(i)
                if policy is PatchPolicy.MERGE_PATCH_JSON:
                    # Into an absent key the value is written as is; a JSON merge into a present one is the webhook's.
                    if merged or presence != present:
                        raise NeedsWebhook(
                            "patchPodMetadata: MergePatchJson after another patch of the same annotation"
                        )
                    merged = True
                    self.b.declines.append(f"!({present}{'' if ok == 'true' else ' && ' + ok})")
                if policy is PatchPolicy.OVERWRITE:
                    value = cel.string(v) if ok == "true" else f"({ok} ? {cel.string(v)} : {value})"
                else:  # Retain, and MergePatchJson into an absent key
                    value = (
                        f"({presence} ? {value} : {cel.string(v)})"
                        if ok == "true"
                        else f"({ok} && !{presence} ? {cel.string(v)} : {value})"
                    )
                presence = "true" if ok == "true" else f"({ok} || {presence})"
            if presence == "true":
                written.add(key)
            self._annotation(key, value, None if presence == "true" else presence)
        return written

    def _bookkeeping(self, anns: str, entries: str, entries_wi: str, apps: str, written: set[str]) -> None:
        g = self.group

        def only_if(i: int, value: str) -> str:
            return value if self.single else f"({self.ok(i)} ? {value} : [])"

        def keep(found: str) -> str:
            ours = [
                f"(e.startsWith({cel.string(_json(ss.name) + ':')}){'' if self.single else ' && ' + self.ok(i)})"
                for i, ss in enumerate(g)
            ]
            return f"{found}.filter(e, !({' || '.join(ours)}))"

        for key, found, without_image in (
            (names.ANN_HASH, entries, False),
            (names.ANN_HASH_WITHOUT_IMAGE, entries_wi, True),
        ):
            ours = " + ".join(
                only_if(
                    i, cel.strings([bookkeeping.entry_text(ss, timestamp=self.timestamp, without_image=without_image)])
                )
                for i, ss in enumerate(g)
            )
            self._annotation(key, f'"{{" + ({keep(found)} + {ours}).sort().join(",") + "}}"')
        listed = (
            f'({cel.string(names.ANN_INJECTED_LIST)} in {anns} ? {anns}[{cel.string(names.ANN_INJECTED_LIST)}] : "")'
        )
        members = " + ".join(only_if(i, cel.strings([ss.name])) for i, ss in enumerate(g))
        self._annotation(
            names.ANN_INJECTED_LIST,
            f'({listed}.split(",").map(x, x.trim()).filter(x, x != "") + {members}).distinct().sort().join(",")',
        )
        if names.ANN_DEFAULT_CONTAINER not in written:
            if any(names.ANN_DEFAULT_CONTAINER in dict(p.annotations) for ss in g for p in ss.patch_pod_metadata):
                raise NeedsWebhook("patchPodMetadata of kubectl.kubernetes.io/default-container in a group")
            sidecars = " + ".join(
                only_if(i, cel.strings([c.name for c in ss.containers])) for i, ss in enumerate(g) if ss.containers
            )
            names_of = self.b.var("sidecarNames", sidecars or "[]")
            first_app = self.b.var("firstApp", f"{apps}.map(c, c.name).filter(n, !(n in {names_of}))")
            dc = cel.string(names.ANN_DEFAULT_CONTAINER)
            self._annotation(
                names.ANN_DEFAULT_CONTAINER, f"{first_app}[0]", f"!({dc} in {anns}) && size({first_app}) > 0"
            )
        self._annotation(names.ANN_INJECTED_BY, cel.string(names.INJECTED_BY_POLICY))

    def _metadata(self, anns: str, entries: str, entries_wi: str, apps: str) -> None:
        label = cel.string("/metadata/labels/" + cel.pointer(names.POD_INJECTED_LABEL))
        whole = "{" + cel.string(names.POD_INJECTED_LABEL) + ': "true"}'
        self.b.ops.append(
            f'has(object.metadata.labels) ? [JSONPatch{{op: "add", path: {label}, value: "true"}}] : '
            f'[JSONPatch{{op: "add", path: "/metadata/labels", value: {whole}}}]'
        )
        written = self._patch_pod_metadata(anns)
        self._bookkeeping(anns, entries, entries_wi, apps, written)
        self.b.ops.append(self._annotation_ops())

    # -- the objects ---------------------------------------------------------------------------------
    def generate(self) -> Generated:
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
        return Generated(self._policy(), self._binding())

    def _conditions(self) -> tuple[list[JsonObj], list[str]]:
        """(matchConditions, guards the mutation must check): conditions that need `namespaceObject`
        cannot be matchConditions (it is empty there), nor can ones that read `variables`."""
        conds = [
            ("not-deleting", "!has(object.metadata.deletionTimestamp)"),
            (
                "not-terminal",
                '!has(object.status) || !has(object.status.phase) || !(object.status.phase in ["Succeeded", "Failed"])',
            ),
            ("hash-annotations-canonical", bookkeeping.canonical()),
        ]
        if self.single:
            ss = self.group[0]
            conds.append(("not-yet-injected", f"!({bookkeeping.recorded(ss)})"))
            conds.append(("no-name-clash-with-the-other-list", f"!({_cross_inline(ss)})"))
        else:
            conds.append(
                (
                    "some-member-selects-the-pod",
                    " || ".join(f"({cel.selector(ss.selector, cel.LABELS)})" for ss in self.group),
                )
            )
            conds.append(("some-member-to-inject", " || ".join(V + f"ok{i}" for i in range(len(self.group)))))
        conds += [
            (f"declined-{j}", expr.replace(V + "anns", cel.ANNOTATIONS)) for j, expr in enumerate(self.b.declines)
        ]
        if self.exclude:
            conds.append(("not-for-the-webhook", f"!({self.exclude})"))
        plain: list[str] = []
        guards: list[str] = []
        for name, expr in conds:
            inlined = cel.inline_variables(expr, self.b.variables)
            (guards if "namespaceObject" in inlined else plain).append(f"({inlined}) // {name}\n")
        # One expression, not one per gate: each matchCondition is a program evaluation of its own.
        return [{"name": "sidecarctl-gates", "expression": "&& ".join(plain)}], guards

    def _policy(self) -> JsonObj:
        plain, guards = self._conditions()
        variables = list(self.b.variables)
        patch = " +\n".join(f"({op})" for op in self.b.ops)
        if guards:
            variables.append(("guard", "&& ".join(guards)))
            patch = "!variables.guard ? [] :\n" + patch
        group = self.group
        return {
            "apiVersion": POLICY_API,
            "kind": "MutatingAdmissionPolicy",
            "metadata": {
                "name": policy_name(group),
                "labels": dict(MANAGED_BY),
                "annotations": {ANN_MEMBERS: ",".join(ss.name for ss in group)},
            },
            "spec": {
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ],
                    "namespaceSelector": {
                        "matchExpressions": [
                            {"key": names.NS_INJECTION_LABEL, "operator": "In", "values": [names.NS_INJECTION_ENABLED]},
                            {
                                "key": names.NS_NAME_LABEL,
                                "operator": "NotIn",
                                "values": sorted([*names.SYSTEM_NAMESPACES, self.manager_namespace]),
                            },
                        ]
                    },
                    "objectSelector": {
                        "matchExpressions": [{"key": names.POD_INJECT_LABEL, "operator": "NotIn", "values": ["false"]}]
                    },
                },
                "matchConditions": plain,
                "variables": [{"name": n, "expression": e} for n, e in variables],
                "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
            },
        }

    def _binding(self) -> JsonObj:
        spec: JsonObj = {"policyName": policy_name(self.group)}
        if self.single:
            ss = self.group[0]
            resources: JsonObj = {"objectSelector": {"matchExpressions": cel.as_expressions(ss.selector)}}
            if ss.namespace_selector is not None:
                resources["namespaceSelector"] = {"matchExpressions": cel.as_expressions(ss.namespace_selector)}
            spec["matchResources"] = resources
        return {
            "apiVersion": POLICY_API,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": policy_name(self.group), "labels": dict(MANAGED_BY)},
            "spec": spec,
        }


_LISTS = ("env", "volumeMounts", "volumeDevices")


def _json(value: str) -> str:
    return json.dumps(value)


def _unique(values: str, key: str, taken: list[str]) -> str:
    """The items of `values` whose `key` is not in `taken` and not seen earlier in `values`."""
    return (
        f"lists.range(size({values})).filter(j, !({values}[j].{key} in {cel.strings(taken)}) && "
        f"!{values}.slice(0, j).exists(x, x.{key} == {values}[j].{key})).map(j, {values}[j])"
    )


def _cross(ss: SidecarSet, cnames: str, inames: str) -> str:
    """CEL: a container of `ss` is named like a pod init container, or an init container like a container."""
    terms = []
    if ss.containers:
        terms.append(f"{cel.strings(c.name for c in ss.containers)}.exists(n, n in {inames})")
    if ss.init_containers:
        terms.append(f"{cel.strings(c.name for c in ss.init_containers)}.exists(n, n in {cnames})")
    return " || ".join(terms) or "false"


def _cross_inline(ss: SidecarSet) -> str:
    terms = []
    if ss.containers:
        names_ = cel.strings(c.name for c in ss.containers)
        terms.append(
            f"(has(object.spec.initContainers) && {names_}.exists(n, object.spec.initContainers.exists(c, c.name == n)))"
        )
    if ss.init_containers:
        names_ = cel.strings(c.name for c in ss.init_containers)
        terms.append(f"{names_}.exists(n, object.spec.containers.exists(c, c.name == n))")
    return " || ".join(terms) or "false"


def generate(
    group: list[SidecarSet], *, timestamp: str, manager_namespace: str, exclude: str | None = None
) -> Generated:
    """The policy and binding that inject `group` (NeedsWebhook when a policy cannot)."""
    return Generator(group, timestamp=timestamp, manager_namespace=manager_namespace, exclude=exclude).generate()
