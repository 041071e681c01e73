"""Why a SidecarSet is (not) in a pod: the verdicts behind `sidecarctl check-inject`.

The webhook, the policies and the controller answer "inject?" and "upgrade?" with yes or no; people
need the rule that said no. So the questions are asked of the product's own code, in its order
(injector.engine.eligibility for the pod, then the SidecarSet's pause, namespace scope and pod
selector as injector.engine.selection reads them, then that selection itself for canaries and
container-name conflicts), and only where the product answers yes/no does a small function here
walk the same inputs to name the failing part (`selector_failures`, whose answer the unit tests
hold to `selectors.matches` term by term). The state of a sidecar in the pod is the controller's:
its matching (sidecarsets.rollout.status), its pod predicates (sidecarsets.pods.podstate) and, for
an outdated one, the rollout glance `sidecarctl status` shows (sidecarsets.rollout.glance).
Pure: the command reads the objects and writes the reports (text or JSON).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from injector.engine import eligibility, selection
from kuberuntime.jsontypes import JsonObj, mapping
from sidecarctl.cli.clusterread import namespace_labels
from sidecarsets.pods import missed, podstate
from sidecarsets.pods.projection import PodProjection, project
from sidecarsets.rollout import rolloutsim, status
from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet

# Reason codes (the JSON's `reasons[].code`), in the order the product applies the rules.
SYSTEM_NAMESPACE = "SystemNamespace"
NAMESPACE_NOT_LABELLED = "NamespaceNotLabelled"
OPTED_OUT = "OptedOut"
POD_INACTIVE = "PodInactive"
INJECTION_PAUSED = "InjectionPaused"
NAMESPACE_EXCLUDED = "NamespaceExcluded"
SELECTOR_MISMATCH = "SelectorMismatch"
REPLACED_BY_CANARY = "ReplacedByCanary"
CONFLICT = "Conflict"

# States of a SidecarSet in a pod (the JSON's `state`); the first three fail the check.
MISSING, OUTDATED, UPGRADING = "missing", "outdated", "upgrading"
CURRENT, WOULD_INJECT, ABSENT, PRESENT = "current", "would-inject", "absent", "present"
FAILING = frozenset({MISSING, OUTDATED, UPGRADING})


@dataclass(frozen=True)
class Reason:
    code: str
    message: str

    def as_json(self) -> JsonObj:
        return asdict(self)


@dataclass(frozen=True)
class Route:
    """How pods a SidecarSet selects get it: `policy` (named), `webhook`, `none`, or `unknown`."""

    path: str
    policy: str | None
    reason: str

    def as_json(self) -> JsonObj:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """One SidecarSet against one pod."""

    sidecarset: str
    reasons: tuple[Reason, ...]  # why it does not select the pod; empty: it does
    route: Route
    state: str
    revision: str | None  # the revision the pod records for it
    current_revision: str | None  # the SidecarSet's status.latestRevision
    detail: str  # why missing, outdated or upgrading; "" otherwise

    @property
    def selects(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class PodReport:
    namespace: str
    name: str
    template_of: str | None  # "deployment/web" for a workload's pod template without pods
    phase: str
    injected_by: str | None
    gate: Reason | None
    route: Route
    verdicts: tuple[Verdict, ...]

    @property
    def ok(self) -> bool:
        return not any(v.state in FAILING for v in self.verdicts)


@dataclass
class Cluster:
    """What the command read and made of it: the SidecarSets (sorted by name), the namespaces, each
    SidecarSet's path, and where each outdated pod stands in its SidecarSet's rollout."""

    sidecarsets: list[SidecarSet]
    namespaces: list[JsonObj]
    manager_namespace: str
    routes: dict[str, Route] = field(default_factory=dict)
    # (SidecarSet, namespace/pod) -> why the controller has not upgraded that outdated pod (yet)
    held: dict[tuple[str, str], str] = field(default_factory=dict)

    # namespace name -> its labels, as `sidecarctl status` reads them (clusterread.namespace_labels)
    labels: dict[str, dict[str, str]] = field(init=False)

    def __post_init__(self) -> None:
        self._by_name = {str((n.get("metadata") or {}).get("name")): n for n in self.namespaces}
        self.labels = namespace_labels(self.namespaces)

    def namespace(self, name: str) -> JsonObj | None:
        """The namespace object; None when it was not read."""
        return self._by_name.get(name)


# ---------------------------------------------------------------------------------------------
# Selectors, term by term


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
    sel = ss.namespace_selector or {}
    pinned = (sel.get("matchLabels") or {}).get(names.NS_NAME_LABEL)
    if set(sel) == {"matchLabels"} and set(sel["matchLabels"]) == {names.NS_NAME_LABEL}:
        return [f"it is for namespace {pinned} only (spec.namespace), not {namespace}"]
    if namespace_labels is None:
        return [f"the labels of namespace {namespace} are not known"]
    labels = {**namespace_labels, names.NS_NAME_LABEL: namespace}
    found = selector_failures(sel, labels, where="spec.namespaceSelector", what=f"namespace {namespace}")
    return found or [f"spec.namespaceSelector excludes namespace {namespace}"]


# ---------------------------------------------------------------------------------------------
# Selection


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


# ---------------------------------------------------------------------------------------------
# Paths


def pod_route(verdicts: Sequence[Verdict]) -> Route:
    """A pod that any webhook-served SidecarSet selects goes to the webhook whole (injector.policy.plan)."""
    selecting = [v for v in verdicts if v.selects]
    if not selecting:
        return Route("none", None, "no SidecarSet selects the pod")
    for v in selecting:
        if v.route.path == "webhook":
            return Route("webhook", None, f"SidecarSet {v.sidecarset} needs the webhook ({v.route.reason})")
    unknown = [v.sidecarset for v in selecting if v.route.path != "policy"]
    if unknown:
        return Route("unknown", None, f"the path of SidecarSet {', '.join(unknown)} is not reported")
    held = sorted({v.route.policy or "?" for v in selecting})
    return Route("policy", ", ".join(held), f"MutatingAdmissionPolicy {', '.join(held)} (no webhook call)")


# ---------------------------------------------------------------------------------------------
# What the pod has


def has_all(ss: SidecarSet, pod: PodProjection) -> bool:
    """The pod lists the SidecarSet and carries each of its sidecars, as the controller counts it."""
    return ss.name in pod.injected and podstate.has_sidecars(
        pod, cold=ss.cold_names, hot=ss.hot_names, native_init=ss.native_init_names, hot_init=ss.hot_init_names
    )


def counted(ss: SidecarSet, pod: PodProjection, namespace_labels: Mapping[str, str] | None) -> bool:
    """The controller counts and upgrades the pod for the SidecarSet (status.matched_pods: listed, all
    sidecars there, active, namespace scope, pod selector), whatever the injection rules (paused
    injection, the namespace label, opting out, a canary) say of new pods."""
    return bool(status.matched_pods(ss, [pod], {} if namespace_labels is None else {pod.namespace: namespace_labels}))


def outdated(ss: SidecarSet, pod: PodProjection, namespace_labels: Mapping[str, str] | None) -> bool:
    """Counted at another hash than its spec's: the controller's "not updated"."""
    return counted(ss, pod, namespace_labels) and not podstate.is_updated(pod, sidecarset=ss.name, spec_hash=ss.hash)


def _state(
    ss: SidecarSet, raw: Mapping[str, Any], pod: PodProjection, *, selects: bool, template: bool, cluster: Cluster
) -> tuple[str, str]:
    """(state, detail) of `ss` in the pod. Sidecars in the pod are judged as the controller counts
    them (`counted`), not by whether they would be injected now; only those it does not count are
    merely present. A pod that does not run (Pending: no node has started it) is current when it
    records the spec's hash: it starts with exactly those sidecars. A running pod is current once
    the kubelet also reports every image the controller patched in."""
    if template:
        return (WOULD_INJECT, "") if selects else (ABSENT, "")
    if not has_all(ss, pod):
        if not selects:
            return ABSENT, ""
        if ss.name in pod.injected:
            return MISSING, f"listed in {names.ANN_INJECTED_LIST} but sidecars are not in the pod"
        ns = cluster.namespace(pod.namespace) or {}
        return MISSING, missed.reason(missed.PodFacts.of(raw), ss, labelled_at=missed.label_time(ns))
    if not counted(ss, pod, cluster.labels.get(pod.namespace)):
        return PRESENT, "in the pod, but the controller does not count it: it does not select the pod now"
    key = f"{pod.namespace}/{pod.name}"
    if not podstate.is_updated(pod, sidecarset=ss.name, spec_hash=ss.hash):
        return OUTDATED, cluster.held.get((ss.name, key), "its rollout could not be placed (pods not listed)")
    if pod.phase == "Running" and podstate.upgrade_in_flight(
        pod, sidecarset=ss.name, containers=ss.container_names_in_pod
    ):
        return UPGRADING, f"the new image is not reported running yet ({rolloutsim.not_ready_reason(ss, pod)})"
    if pod.phase != "Running":
        return CURRENT, f"not running (phase {pod.phase or 'unknown'}): it starts with this version"
    return CURRENT, ""


def report(raw: Mapping[str, Any], cluster: Cluster, *, template_of: str | None = None) -> PodReport:
    """Every SidecarSet of the cluster against one pod (or a workload's pod template)."""
    meta = raw.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    ns_labels = cluster.labels.get(namespace)
    gate, reasons = selection_reasons(
        raw,
        cluster.sidecarsets,
        namespace=namespace,
        namespace_labels=ns_labels,
        manager_namespace=cluster.manager_namespace,
    )
    pod = project(raw)
    verdicts = []
    for ss in cluster.sidecarsets:
        why = tuple(reasons[ss.name])
        state, detail = _state(ss, raw, pod, selects=not why, template=template_of is not None, cluster=cluster)
        entry = pod.hash_for(ss.name)
        latest = ss.status.get("latestRevision")
        verdicts.append(
            Verdict(
                ss.name,
                why,
                cluster.routes.get(ss.name) or Route("unknown", None, "not reported"),
                state,
                (entry.controller_revision or None) if entry is not None and template_of is None else None,
                latest if isinstance(latest, str) and latest else None,
                detail,
            )
        )
    injected_by = (meta.get("annotations") or {}).get(names.ANN_INJECTED_BY)
    return PodReport(
        namespace,
        str(meta.get("name") or ""),
        template_of,
        pod.phase,
        injected_by if isinstance(injected_by, str) and template_of is None else None,
        gate,
        pod_route(verdicts),
        tuple(verdicts),
    )
