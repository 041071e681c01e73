"""SidecarSets indexed by what a pod must carry for each of them to select it.

Admission asks "which SidecarSets select this pod?" for every pod; checking every SidecarSet's
selectors makes a pod's cost grow with the cluster's SidecarSets (109 µs per pod at 300 against
43 µs at one, mostly selector evaluation). Each SidecarSet is filed under one necessary condition,
its anchor: the namespace when its namespace selector names namespaces only (by
`kubernetes.io/metadata.name`), else one label its pod selector requires (`matchLabels`, or an
`In` expression: one entry per value), else a label key it requires (`Exists`). A pod's candidates
are the SidecarSets filed under its namespace or one of its labels, plus the few without any
anchor (selectors made only of `NotIn` / `DoesNotExist`); the caller still evaluates the full
selectors on those, so the index can only narrow, never decide. Kruise indexes SidecarSets by
namespace for the same reason.

Which requirement is the anchor matters as soon as a selector has several: with
`{team: t7, tier: web}` on 300 SidecarSets, filing each under `tier=web` makes every web pod a
candidate of all 300. So the anchor is chosen against the SidecarSets indexed together
(`Anchors`): the requirement the fewest of them share, a label value before a bare key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

Anchor = tuple[str, str, str | None]  # ("ns", name, None) | ("label", key, value) | ("key", key, None)


def anchors(ss: SidecarSet, chosen: Anchors | None = None) -> list[Anchor] | None:
    """The entries `ss` is filed under (a pod it selects has at least one); None: it has no anchor."""
    ns = _namespace_names(ss.namespace_selector)
    if ns is not None:
        return [("ns", n, None) for n in ns]
    return (chosen or NO_POPULATION).of(ss.selector)


def requirements(selector: Mapping[str, Any] | None) -> list[list[Anchor]] | None:
    """Every way a pod matching `selector` must carry a label, each a list of which it carries one:
    a `matchLabels` entry, an `In` expression (one anchor per value), an `Exists` key. None when
    the selector requires no label; [] when it matches no pod (absent or empty, as the model reads it)."""
    if not selector or (not selector.get("matchLabels") and not selector.get("matchExpressions")):
        return []
    found: list[list[Anchor]] = [[("label", str(k), str(v))] for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        if e.get("operator") == "In" and e.get("values"):
            found.append([("label", str(e.get("key")), str(v)) for v in e["values"]])
        elif e.get("operator") == "Exists":
            found.append([("key", str(e.get("key")), None)])
    return found or None


class Anchors:
    """Chooses each selector's anchor against a population of selectors (those indexed together):
    of the labels it requires, the one the fewest of them share (summed over an `In` list's
    values), a label value before a bare key, then the fewest values, then by key: the same
    population always gives the same choice."""

    def __init__(self, selectors: Iterable[Mapping[str, Any] | None] = ()) -> None:
        self.shared: Counter[Anchor] = Counter()
        for selector in selectors:
            self.shared.update({a for alternative in requirements(selector) or () for a in alternative})

    def _cost(self, alternative: list[Anchor]) -> tuple[bool, int, int, str]:
        bare_key = any(kind == "key" for kind, _, _ in alternative)
        return bare_key, sum(self.shared[a] for a in alternative), len(alternative), alternative[0][1]

    def of(self, selector: Mapping[str, Any] | None) -> list[Anchor] | None:
        """The pod labels (or keys) one of which a pod matching `selector` must carry; None when the
        selector requires no label, [] when it matches no pod."""
        found = requirements(selector)
        if found is None:
            return None
        return min(found, key=self._cost) if found else []

    def block(self, selector: Mapping[str, Any] | None) -> tuple[str, frozenset[str]] | None:
        """(key, values): a pod `selector` matches carries that label with one of those values; None
        when the anchor is a key alone, or there is none."""
        found = self.of(selector)
        if not found or any(kind != "label" for kind, _, _ in found):
            return None
        return found[0][1], frozenset(str(v) for _, _, v in found)


NO_POPULATION = Anchors()


def label_anchors(selector: Mapping[str, Any] | None) -> list[Anchor] | None:
    """`Anchors().of(selector)`: the anchor of a selector considered alone."""
    return NO_POPULATION.of(selector)


def label_block(selector: Mapping[str, Any] | None) -> tuple[str, frozenset[str]] | None:
    """`Anchors().block(selector)`: the label block of a selector considered alone."""
    return NO_POPULATION.block(selector)


def _namespace_names(selector: Mapping[str, Any] | None) -> list[str] | None:
    """The namespaces a selector on the name label alone can match, or None when it is no such selector."""
    if not selector:
        return None
    allowed: set[str] | None = None
    for key, value in (selector.get("matchLabels") or {}).items():
        if key != names.NS_NAME_LABEL:
            return None
        allowed = {str(value)} if allowed is None else allowed & {str(value)}
    for e in selector.get("matchExpressions") or []:
        if e.get("key") != names.NS_NAME_LABEL:
            return None
        if e.get("operator") == "In":
            values = {str(v) for v in e.get("values") or []}
            allowed = values if allowed is None else allowed & values
        elif e.get("operator") not in ("NotIn", "Exists"):
            return None  # DoesNotExist (matches none) or an unknown operator: not indexed by name
    return None if allowed is None else sorted(allowed)


class PodIndex:
    """`candidates(namespace, labels)`: the SidecarSets that may select such a pod, in the given order."""

    __slots__ = ("_by_key", "_by_label", "_by_namespace", "_loose", "by_name", "pinning", "sidecarsets")

    def __init__(self, sidecarsets: Sequence[SidecarSet]) -> None:
        self.sidecarsets = tuple(sidecarsets)
        # Kept here, with the index, so a snapshot rebuilt for a namespace change does not walk every SidecarSet.
        self.by_name: Mapping[str, SidecarSet] = MappingProxyType({ss.name: ss for ss in self.sidecarsets})
        self.pinning = any(ss.injection_revision is not None for ss in self.sidecarsets)  # some pin new pods
        self._by_namespace: dict[str, list[int]] = {}
        self._by_label: dict[tuple[str, str], list[int]] = {}
        self._by_key: dict[str, list[int]] = {}
        self._loose: list[int] = []  # no anchor: a candidate for every pod
        chosen = Anchors(ss.selector for ss in self.sidecarsets if _namespace_names(ss.namespace_selector) is None)
        for i, ss in enumerate(self.sidecarsets):
            found = anchors(ss, chosen)
            if found is None:
                self._loose.append(i)
                continue
            for kind, key, value in found:
                if kind == "ns":
                    self._by_namespace.setdefault(key, []).append(i)
                elif kind == "label":
                    self._by_label.setdefault((key, str(value)), []).append(i)
                else:
                    self._by_key.setdefault(key, []).append(i)

    def candidates(self, namespace: str, labels: Mapping[str, str]) -> tuple[SidecarSet, ...]:
        hits: set[int] = set(self._loose)
        hits.update(self._by_namespace.get(namespace, ()))
        if self._by_label or self._by_key:
            for key, value in labels.items():
                if type(key) is not str or type(value) is not str:
                    continue  # a malformed pod (the engine names the field); no anchor is anything but text
                found = self._by_label.get((key, value))
                if found:
                    hits.update(found)
                found = self._by_key.get(key)
                if found:
                    hits.update(found)
        if not hits:
            return ()
        sets = self.sidecarsets
        return tuple(sets[i] for i in sorted(hits))
