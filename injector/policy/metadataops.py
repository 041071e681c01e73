"""CEL for the pod's metadata in a policy: the injected label, patchPodMetadata, the bookkeeping
annotations merged with other SidecarSets' entries, and the default-container annotation.

One part of the policy generator (injector.policy.generate): every annotation is collected first
and written at the end in as few operations as the pod allows.
"""

from __future__ import annotations

import json

from injector.policy import bookkeeping, cel
from injector.policy.build import NeedsWebhook, Part
from sidecarsets.spec import names
from sidecarsets.spec.enums import PatchPolicy
from sidecarsets.spec.model import SidecarSet


class MetadataOps(Part):
    """Labels and annotations of the policy's patch."""

    # -- labels and annotations ----------------------------------------------------------------------
    def _annotation(self, key: str, value: str, when: str | None = None) -> None:
        self.b.annotations.append((key, value, None if when in (None, "true") else when))

    def _annotation_ops(self) -> str:
        """One op per annotation on a pod that has some; one op adding them all to a pod with none
        (most new pods: fewer operations is a cheaper patch for the API server).

        Each value is in both branches. One written always and built by CEL (the bookkeeping
        annotations, a third of a group's text) is a variable, so the API server type-checks it once:
        it checks an expression in time that grows faster than its length, at every policy write and
        again to enforce it. A value written only `when` something holds stays in place: bound ahead
        of the test it would be evaluated where it may fail (the first app of a pod without one)."""
        per_key = []
        entries = []
        for n, (key, value, when) in enumerate(self.b.annotations):
            if when is None and not _is_literal(value):
                value = self.b.var(f"ann{n}", value)
            op = cel.patch_op("add", cel.string("/metadata/annotations/" + cel.pointer(key)), value)
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
            f"[{cel.patch_op('add', cel.string('/metadata/annotations'), whole)}]"
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
            ours = " + ".join(only_if(i, f"[{self._entry(ss, without_image)}]") for i, ss in enumerate(g))
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

    def _entry(self, ss: SidecarSet, without_image: bool) -> str:
        """CEL: the SidecarSet's entry in a hash annotation. What a new image changes in it (its hash,
        its revision, the time) is read from the parameter object, so the bump rewrites no CEL."""
        return bookkeeping.entry(
            ss,
            without_image=without_image,
            time=self.b.param("time", json.dumps(self.timestamp)),
            quoted_hash=self.quoted_hash(ss),
            revision=self.b.param(f"{ss.name}:revision", bookkeeping.revision_text(ss)),
        )

    def _metadata(self, anns: str, entries: str, entries_wi: str, apps: str) -> None:
        label = cel.string("/metadata/labels/" + cel.pointer(names.POD_INJECTED_LABEL))
        whole = "{" + cel.string(names.POD_INJECTED_LABEL) + ': "true"}'
        self.b.ops.append(
            f"has(object.metadata.labels) ? [{cel.patch_op('add', label, cel.string('true'))}] : "
            f"[{cel.patch_op('add', cel.string('/metadata/labels'), whole)}]"
        )
        written = self._patch_pod_metadata(anns)
        self._bookkeeping(anns, entries, entries_wi, apps, written)
        self.b.ops.append(self._annotation_ops())


def _json(value: str) -> str:
    return json.dumps(value)


def _is_literal(expr: str) -> bool:
    """Whether `expr` is a CEL string literal (cel.string): nothing to check twice."""
    try:
        return isinstance(json.loads(expr), str)
    except ValueError:
        return False
