"""The leader's Pod Security view: which selected namespaces a SidecarSet's sidecars would break.

Kept current from the namespace watch: only namespaces with a `pod-security.kubernetes.io/` label
can refuse or warn about anything, so only those are held, and a change to their Pod Security
labels asks every SidecarSet's status again (`on_change`), which is how relabelling a namespace
reaches the `PodSecurity` condition within a reconcile. The checks themselves are
sidecarsets.validation.podsecurity, the same the validating webhook warns with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sidecarsets.controller import metrics
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import podsecurity


def _policy_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if k.startswith(podsecurity.LABEL)}


class PodSecurityView:
    def __init__(self, *, manager_namespace: str, on_change: Callable[[], None] | None = None) -> None:
        self.skip: Iterable[str] = (*names.SYSTEM_NAMESPACES, manager_namespace)
        self.on_change = on_change
        self._namespaces: dict[str, Mapping[str, str]] = {}  # those with a Pod Security label

    def on_namespace(self, kind: str, old: Any, new: Any) -> None:
        labels = new if new is not None else old
        name = str((labels or {}).get(names.NS_NAME_LABEL) or "")
        before = self._namespaces.get(name)
        if kind == "DELETED" or new is None or not podsecurity.has_policy(new):
            self._namespaces.pop(name, None)
        else:
            self._namespaces[name] = dict(new)
        after = self._namespaces.get(name)
        if _policy_labels(before) != _policy_labels(after) and self.on_change is not None:
            self.on_change()

    def condition(self, ss: SidecarSet) -> dict[str, str]:
        """The `PodSecurity` condition, and the SidecarSet's violations gauge set to match."""
        found = podsecurity.findings(ss, self._namespaces, skip=self.skip)
        metrics.POD_SECURITY_VIOLATIONS.labels(*metrics.owner(ss.name)).set(len(found))
        return podsecurity.condition(found)
