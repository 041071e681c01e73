"""Whether a pod is a candidate for injection at all, before any SidecarSet is looked at.

Kept apart from the engine so the rules of the contract (which namespaces, which label, which
operations) read as one short list and are tested as a table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kuberuntime.jsontypes import mapping, resolve
from sidecarsets.spec import names

SKIP_OPERATION = "only pod creation is injected (containers cannot be added to an existing pod)"
SKIP_SYSTEM_NAMESPACE = "system namespace"
SKIP_NAMESPACE_NOT_LABELLED = f"namespace not labelled {names.NS_INJECTION_LABEL}={names.NS_INJECTION_ENABLED}"
SKIP_OPTED_OUT = "pod opted out"
SKIP_INACTIVE = "pod is terminal or being deleted"


def skip_reason(
    pod: Mapping[str, Any],
    *,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
    operation: str,
    manager_namespace: str,
    require_namespace_label: bool,
) -> str | None:
    """Why the pod must be left alone, or None when SidecarSets may be matched against it."""
    if operation != "CREATE":
        return SKIP_OPERATION
    if namespace in names.SYSTEM_NAMESPACES or namespace == manager_namespace:
        return SKIP_SYSTEM_NAMESPACE
    if require_namespace_label and (namespace_labels or {}).get(names.NS_INJECTION_LABEL) != (
        names.NS_INJECTION_ENABLED
    ):
        return SKIP_NAMESPACE_NOT_LABELLED
    metadata = mapping(pod, "metadata")
    if resolve(metadata, "labels", names.POD_INJECT_LABEL) == "false":
        return SKIP_OPTED_OUT
    if metadata.get("deletionTimestamp") or resolve(pod, "status", "phase") in ("Succeeded", "Failed"):
        return SKIP_INACTIVE
    return None
