"""A NamespacedSidecarSet's ClusterSidecarSetConflict condition and its Event.

Admission refuses a tenant's container, init container or volume name that a cluster SidecarSet
injecting the same pods owns, but a cluster SidecarSet created (or widened) later cannot be
refused for a tenant's sake: the cluster's sidecar wins in those pods (injector.engine.selection)
and the tenant's set is skipped there. Its owners learn it here: a status condition naming each
name and owner, and a Warning Event when the conflict appears.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kuberuntime import events
from kuberuntime.jsontypes import JsonObj
from sidecarsets.rollout import status
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.validation import tenancy


def _was_true(old_status: Mapping[str, object]) -> bool:
    conditions = old_status.get("conditions")
    return any(
        isinstance(c, Mapping) and c.get("type") == names.CONDITION_CLUSTER_CONFLICT and c.get("status") == "True"
        for c in (conditions if isinstance(conditions, list) else [])
    )


async def report_cluster_conflict(
    recorder: events.EventRecorder,
    ss: SidecarSet,
    new_status: JsonObj,
    *,
    sidecarsets: Iterable[SidecarSet],
    namespace_labels: Mapping[str, str] | None,
    now: str,
) -> None:
    """Put the condition into `new_status`; record an Event when the conflict is new."""
    cluster = [other for other in sidecarsets if not other.namespaced]
    clashes = tenancy.cluster_clashes(ss, cluster, namespace_labels)
    condition = tenancy.conflict_condition(clashes)
    status.set_condition(new_status, ss.status, condition, now=now)
    if clashes and not _was_true(ss.status):
        await recorder.event(
            ss.obj, type="Warning", reason=names.CONDITION_CLUSTER_CONFLICT, message=condition["message"]
        )
