"""What `sidecarctl check-inject` says of a pod: reasons, paths, states, each verdict and the report,
and the cluster it read them from.

The reason codes and states are the JSON's (`reasons[].code`, `state`); the rules that find them are
in sidecarctl.cli.checkinject.rules (selection), .paths (the injection path) and .state (the
sidecars in the pod); .report puts one pod's verdicts together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kuberuntime.jsontypes import JsonObj, resolve
from sidecarctl.cli.clusterread import namespace_labels
from sidecarsets.overrides.merge import Outcome
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
    # Each container override the pod asks for (sidecarctl.io/overrides), as the webhook judges it now.
    overrides: tuple[Outcome, ...] = ()

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
        self._by_name = {str(resolve(n, "metadata", "name")): n for n in self.namespaces}
        self.labels = namespace_labels(self.namespaces)

    def namespace(self, name: str) -> JsonObj | None:
        """The namespace object; None when it was not read."""
        return self._by_name.get(name)
