"""Why a SidecarSet does (not) select a pod, in the product's own order and words.

The pod-wide gate is injector.engine.eligibility's; a SidecarSet's pause, namespace scope and pod
selector are read as injector.engine.selection reads them, and that selection itself decides canaries
and container-name conflicts. Where the product only answers yes or no, the functions here walk the
same inputs to name the failing part (`selector_failures`, held by the unit tests to
`selectors.matches` term by term).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from injector.engine import eligibility, selection
from kuberuntime.jsontypes import mapping
from sidecarctl.cli.checkinject.verdicts import (
    CONFLICT,
    INJECTION_PAUSED,
    NAMESPACE_EXCLUDED,
    NAMESPACE_NOT_LABELLED,
    OPTED_OUT,
    POD_INACTIVE,
    REPLACED_BY_CANARY,
    SELECTOR_MISMATCH,
    SYSTEM_NAMESPACE,
    Reason,
)
from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet


def _term_text(key: str, op: str, values: Sequence[str]) -> str:
    if op in ("Exists", "DoesNotExist"):
        return f"{key} {op}"
    return f"{key} {op} ({', '.join(values)})"


def _has(labels: Mapping[str, str], key: str, what: str) -> str:
    return f"the {what} has {key}={labels[key]}" if key in labels else f"the {what} has no label {key}"


def selector_failures(
    selector: Mapping[str, Any] | None, labels: Mapping[str, str], *, where: str, what: str = "pod"
) -> list[str]:
    """Each term of `selector` that `labels` fail, said with the value found; empty when it matches.

    Every term is judged by `selectors.matches` on that term alone, and a LabelSelector is the
    conjunction of its terms, so this is empty exactly when `selectors.matches` says yes (a nil or
    ill-formed selector fails as a whole)."""
    if selector is None:
        return [f"{where} is not set: it selects nothing"]
    try:
        selectors.validate(selector)
    except selectors.SelectorError as e:
        return [f"{where} is invalid ({e}): it selects nothing"]
    out = []
    for key, value in (selector.get("matchLabels") or {}).items():
        if not selectors.matches({"matchLabels": {key: value}}, labels):
            out.append(f"{where} matchLabels {key}={value}: {_has(labels, key, what)}")
    for expr in selector.get("matchExpressions") or []:
        if not selectors.matches({"matchExpressions": [expr]}, labels):
            term = _term_text(expr["key"], expr["operator"], expr.get("values") or [])
            out.append(f"{where} matchExpressions {term}: {_has(labels, expr['key'], what)}")
    return out


def pod_selector_failures(ss: SidecarSet, labels: Mapping[str, str]) -> list[str]:
    """Why `ss.matches_pod(labels)` is False (empty when True): an empty selector selects no pod."""
    if selectors.is_empty(ss.selector):
        return ["spec.selector is empty: it selects no pod"]
    return selector_failures(ss.selector, labels, where="spec.selector")


def namespace_failures(ss: SidecarSet, namespace: str, namespace_labels: Mapping[str, str] | None) -> list[str]:
    """Why `ss.matches_namespace` is False (empty when True)."""
    if ss.matches_namespace(namespace, namespace_labels):
        return []
    if ss.namespaced:
        if ss.namespace != namespace:
            return [f"it is a {names.NAMESPACED_KIND} of namespace {ss.namespace}, not {namespace}"]
        label = f"{names.NS_NAMESPACED_SIDECARSETS_LABEL}={names.NS_NAMESPACED_SIDECARSETS_DISABLED}"
        return [f"namespace {namespace} is labelled {label}"]
    sel = ss.namespace_selector or {}
    pinned = (sel.get("matchLabels") or {}).get(names.NS_NAME_LABEL)
    if set(sel) == {"matchLabels"} and set(sel["matchLabels"]) == {names.NS_NAME_LABEL}:
        return [f"it is for namespace {pinned} only (spec.namespace), not {namespace}"]
    if namespace_labels is None:
        return [f"the labels of namespace {namespace} are not known"]
    labels = {**namespace_labels, names.NS_NAME_LABEL: namespace}
    found = selector_failures(sel, labels, where="spec.namespaceSelector", what=f"namespace {namespace}")
    return found or [f"spec.namespaceSelector excludes namespace {namespace}"]


def _gate(
    pod: Mapping[str, Any], namespace: str, namespace_labels: Mapping[str, str] | None, manager_namespace: str
) -> Reason | None:
    """The pod-wide rule that keeps every SidecarSet out, as the webhook and policies apply it."""
    skip = eligibility.skip_reason(
        pod,
        namespace=namespace,
        namespace_labels=namespace_labels,
        operation="CREATE",
        manager_namespace=manager_namespace,
        require_namespace_label=True,
    )
    if skip is None:
        return None
    if skip == eligibility.SKIP_SYSTEM_NAMESPACE:
        which = "the manager's namespace" if namespace == manager_namespace else "a system namespace"
        return Reason(SYSTEM_NAMESPACE, f"namespace {namespace} is never injected ({which})")
    if skip == eligibility.SKIP_NAMESPACE_NOT_LABELLED:
        value = (namespace_labels or {}).get(names.NS_INJECTION_LABEL)
        has = (
            f"it has {names.NS_INJECTION_LABEL}={value}"
            if value is not None
            else f"it has no {names.NS_INJECTION_LABEL} label"
        )
        return Reason(
            NAMESPACE_NOT_LABELLED,
            f"namespace {namespace} is not labelled {names.NS_INJECTION_LABEL}={names.NS_INJECTION_ENABLED} ({has})",
        )
    if skip == eligibility.SKIP_OPTED_OUT:
        return Reason(OPTED_OUT, f'the pod has the label {names.POD_INJECT_LABEL}="false" (opted out)')
    return Reason(POD_INACTIVE, "the pod is terminal (Succeeded or Failed) or being deleted")


def _own_reasons(
    ss: SidecarSet, namespace: str, ns_labels: Mapping[str, str] | None, labels: Mapping[str, str]
) -> list[Reason]:
    out = []
    if ss.injection_paused:
        out.append(Reason(INJECTION_PAUSED, "injection is paused (spec.injectionStrategy.paused: true)"))
    out += [Reason(NAMESPACE_EXCLUDED, m) for m in namespace_failures(ss, namespace, ns_labels)]
    if not ss.matches_pod(labels):
        out += [Reason(SELECTOR_MISMATCH, m) for m in pod_selector_failures(ss, labels)]
    return out


def selection_reasons(
    pod: Mapping[str, Any],
    sidecarsets: Sequence[SidecarSet],
    *,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
    manager_namespace: str,
) -> tuple[Reason | None, dict[str, list[Reason]]]:
    """(the pod-wide reason, each SidecarSet's reasons for not selecting the pod; empty: it does)."""
    meta = pod.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    gate = _gate(pod, namespace, namespace_labels, manager_namespace)
    own = {ss.name: _own_reasons(ss, namespace, namespace_labels, labels) for ss in sidecarsets}
    out = {name: ([gate] if gate else []) + found for name, found in own.items()}
    matching = [ss for ss in sidecarsets if not own[ss.name]]
    # The engine's own choice among them, as for a new pod: without the hashes the pod records, so
    # that "already injected" does not hide a SidecarSet (the pod's containers stay: they decide clashes).
    fresh = copy.deepcopy(dict(pod))
    fresh["metadata"] = {k: v for k, v in dict(meta).items() if k != "annotations"}
    spec = mapping(fresh, "spec")
    fresh["spec"] = {**spec, "containers": spec.get("containers") or []}
    warnings: list[str] = []
    chosen = selection.select(
        matching, namespace=namespace, namespace_labels=namespace_labels, pod=fresh, warnings=warnings
    )
    kept = {ss.name for ss in chosen.todo} if isinstance(chosen, selection.Selection) else set()
    canaries: dict[str, list[str]] = {}
    for ss in matching:
        if ss.canary_base is not None:
            canaries.setdefault(ss.canary_base, []).append(ss.name)
    for ss in matching:
        if ss.name in canaries:
            which = ", ".join(sorted(canaries[ss.name]))
            out[ss.name].append(
                Reason(REPLACED_BY_CANARY, f"canary SidecarSet {which} selects the pod and replaces it")
            )
        elif ss.name not in kept:
            said = [w for w in warnings if w.startswith(f"SidecarSet {ss.name} is not injected")]
            out[ss.name].append(Reason(CONFLICT, said[0] if said else "it conflicts with another SidecarSet"))
    return gate, out
