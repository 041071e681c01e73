"""check-inject's output: one pod's report as `-o json` shows it, and the text for people."""

from __future__ import annotations

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli.checkinject.verdicts import (
    CURRENT,
    FAILING,
    MISSING,
    OUTDATED,
    PRESENT,
    UPGRADING,
    WOULD_INJECT,
    PodReport,
    Route,
    Verdict,
)


def report_json(r: PodReport) -> JsonObj:
    """One pod's report as `-o json` shows it."""
    verdicts = [
        {
            "name": v.sidecarset,
            "selects": v.selects,
            "reasons": [x.as_json() for x in v.reasons],
            "path": v.route.as_json(),
            "state": v.state,
            "revision": v.revision,
            "currentRevision": v.current_revision,
            "detail": v.detail,
        }
        for v in r.verdicts
    ]
    gate = None if r.gate is None else r.gate.as_json()
    return {
        "namespace": r.namespace,
        "name": r.name,
        "template": r.template_of,
        "phase": r.phase or None,
        "injectedBy": r.injected_by,
        "gate": gate,
        "path": r.route.as_json(),
        "sidecarSets": verdicts,
        "overrides": [
            {"container": o.container, "verdict": o.verdict, "message": o.message, "reason": o.reason or None}
            for o in r.overrides
        ],
        "ok": r.ok,
    }


def _via(route: Route) -> str:
    if route.path == "policy":
        return f"via MutatingAdmissionPolicy {route.policy or '?'}"
    if route.path == "webhook":
        return f"via the webhook ({route.reason})"
    return f"path {route.path} ({route.reason})"


def _line(v: Verdict) -> str:
    detail = f": {v.detail}" if v.detail else ""
    at = v.revision or "an unrecorded revision"
    reasons = "; ".join(r.message for r in v.reasons)
    # In the pod and counted by the controller, though new pods would not get it: say why not.
    new = f"; not injected into new pods: {reasons}" if reasons else ""
    if v.state == CURRENT:
        via = f"; {_via(v.route)}" if not reasons else new
        return f"injected, current at revision {at}{'; ' + v.detail if v.detail else ''}{via}"
    if v.state == OUTDATED:
        return f"OUT OF DATE at revision {at} (current {v.current_revision or '?'}){detail}{new}"
    if v.state == UPGRADING:
        return f"UPGRADING to revision {at}{detail}{new}"
    if v.state == MISSING:
        return f"MISSING: selects the pod, its sidecars are not in it{detail}; new pods get it {_via(v.route)}"
    if v.state == WOULD_INJECT:
        return f"would be injected, {_via(v.route)}"
    if v.state == PRESENT:
        return f"in the pod, but does not select it now and the controller does not count it: {reasons}"
    return f"not selected: {reasons}"


def render(reports: list[PodReport]) -> str:
    lines: list[str] = []
    for r in reports:
        if r.template_of is not None:
            lines.append(f"Pod template of {r.template_of} in namespace {r.namespace} (no pods: checked as a new pod)")
        else:
            facts = [r.phase or "phase unknown"] + ([f"injected by {r.injected_by}"] if r.injected_by else [])
            lines.append(f"Pod {r.namespace}/{r.name} ({', '.join(facts)})")
        if r.gate is not None:
            lines.append(f"  no injection: {r.gate.message}")
        if r.route.path != "none":
            lines.append(f"  path: {r.route.path}: {r.route.reason}")
        if not r.verdicts:
            lines.append("  no SidecarSets in the cluster")
        width = max((len(v.sidecarset) for v in r.verdicts), default=0)
        lines += [f"  {v.sidecarset.ljust(width)}  {_line(v)}" for v in r.verdicts]
        if r.overrides:
            lines.append("  overrides (sidecarctl.io/overrides), as the webhook judges them now:")
            lines += [f"    {o.container}: {o.verdict}: {o.message}" for o in r.overrides]
    bad = [
        f"{r.namespace}/{r.name}: {v.sidecarset} {v.state}" for r in reports for v in r.verdicts if v.state in FAILING
    ]
    lines.append(
        f"Not present or not current ({len(bad)}): {', '.join(bad)}"
        if bad
        else "OK: every SidecarSet that selects the pods is present and current"
    )
    return "\n".join(lines) + "\n"
