"""One pod's report: every SidecarSet of the cluster against the pod (or a workload's pod template)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarctl.cli.checkinject.paths import pod_route
from sidecarctl.cli.checkinject.rules import selection_reasons
from sidecarctl.cli.checkinject.state import state_of
from sidecarctl.cli.checkinject.verdicts import Cluster, PodReport, Route, Verdict
from sidecarsets.pods.projection import project
from sidecarsets.spec import names


def pod_report(raw: Mapping[str, Any], cluster: Cluster, *, template_of: str | None = None) -> PodReport:
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
        state, detail = state_of(ss, raw, pod, selects=not why, template=template_of is not None, cluster=cluster)
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
