"""One pod's report: every SidecarSet of the cluster against the pod (or a workload's pod template)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from injector.engine import engine
from kuberuntime.jsontypes import mapping
from sidecarctl.cli.checkinject.paths import pod_route
from sidecarctl.cli.checkinject.rules import selection_reasons
from sidecarctl.cli.checkinject.state import state_of
from sidecarctl.cli.checkinject.verdicts import Cluster, PodReport, Route, Verdict
from sidecarsets.overrides import merge
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
        pod_route(verdicts, overrides=pod.overrides is not None),
        tuple(verdicts),
        _overrides(raw, cluster, namespace),
    )


def _overrides(raw: Mapping[str, Any], cluster: Cluster, namespace: str) -> tuple[merge.Outcome, ...]:
    """Each override the pod asks for, as the webhook would judge it now: the engine run on the pod as
    a new one (its bookkeeping annotations left out, so every SidecarSet that selects it is built)."""
    meta = mapping(raw, "metadata")
    asked = mapping(meta, "annotations").get(names.ANN_OVERRIDES)
    if asked is None:
        return ()
    fresh = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta.get("name"),
            "labels": dict(mapping(meta, "labels")),
            "annotations": {names.ANN_OVERRIDES: asked},
        },
        "spec": dict(mapping(raw, "spec")),
    }
    result = engine.inject(
        fresh,
        namespace=namespace,
        namespace_labels=cluster.labels.get(namespace),
        sidecarsets=cluster.sidecarsets,
        now="",
        manager_namespace=cluster.manager_namespace,
    )
    if result.overrides:
        return result.overrides
    if result.refusal is not None:  # the annotation itself
        return (merge.Outcome("*", merge.REFUSED, result.denied or "", result.refusal),)
    why = f"{names.ANN_OVERRIDES}: no SidecarSet injects this pod now ({result.skipped or result.denied}); ignored"
    return (merge.Outcome("*", merge.IGNORED, why),)
