"""The rollout's progress deadline: a rollout that stops itself instead of waiting forever.

`spec.updateStrategy.progressDeadlineSeconds` (our extension; absent means off) bounds how long a
pod upgraded in place may take to be ready again. A sidecar image that cannot be pulled, or that
crash-loops, otherwise holds maxUnavailable pods down and the rollout waits at that budget forever,
silently. Past the deadline the controller writes the condition `Progressing=False`, reason
`ProgressDeadlineExceeded`, naming the pods and what the kubelet says about them, records the
SidecarSet's generation in the condition's `observedGeneration`, emits an Event and sets the gauge
`sidecarctl_rollout_stalled`; from then on it touches no pod of that SidecarSet.

The rollout resumes when the spec changes (a new generation: fix or roll back the image), or when
the condition is removed from the status. Either way the clock starts again from that moment for
the pods still not ready, so a resumed rollout gets one more deadline before it stops again.

Pure functions of the SidecarSet, its pods and the time, so `sidecarctl status` can ask the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sidecarsets.pods import podstate, resizestate
from sidecarsets.pods.projection import PodProjection
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

SHOWN = 10  # pods named in the condition's message


@dataclass(frozen=True)
class Overdue:
    """An upgraded pod not ready within the deadline, and what its sidecars' statuses say."""

    namespace: str
    name: str
    why: str
    seconds: float  # since its upgrade (or since the clock restarted)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Progress:
    """What the deadline decides for one reconcile: the condition to write (None: no deadline),
    whether the rollout is stopped, and the pods that stopped it when it stops now."""

    condition: dict[str, Any] | None
    stopped: bool
    newly_overdue: tuple[Overdue, ...] = ()
    recheck: float | None = None  # seconds until the next upgraded pod reaches the deadline


def parse_time(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def _current(ss: SidecarSet) -> Mapping[str, Any] | None:
    for c in ss.status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == names.CONDITION_PROGRESSING:
            return c
    return None


def is_stopped(ss: SidecarSet) -> bool:
    """The rollout stopped itself at this very generation (the condition says so)."""
    c = _current(ss)
    return (
        c is not None
        and c.get("status") == "False"
        and c.get("reason") == names.REASON_DEADLINE_EXCEEDED
        and c.get("observedGeneration") == ss.generation
    )


def why_not_ready(pod: PodProjection, containers: Sequence[str]) -> str:
    """The kubelet's word for it: a sidecar's waiting reason, a resize it has not applied, else
    which sidecar is not ready."""
    for c in containers:
        st = pod.status_of(c)
        if st is not None and st.waiting:
            return f"{c}: {st.waiting}"
    for kind, reason, message in pod.resize_conditions:
        return f"{kind} {reason}: {message}".replace(" :", ":")
    for c in containers:
        st = pod.status_of(c)
        if st is None:
            return f"{c}: no status from the kubelet"
        if not st.ready:
            return f"{c}: not ready"
    return "pod not ready"


def overdue(
    ss: SidecarSet,
    matched: Sequence[PodProjection],
    verdicts: podstate.Verdicts,
    *,
    revision: str,
    now: datetime,
    since: datetime,
) -> list[Overdue]:
    """Pods this SidecarSet upgraded in place under `revision` that are still not available more
    than the deadline after their upgrade, or after `since` if that is later."""
    return _clock(ss, matched, verdicts, revision=revision, now=now, since=since)[0]


def _clock(
    ss: SidecarSet,
    matched: Sequence[PodProjection],
    verdicts: podstate.Verdicts,
    *,
    revision: str,
    now: datetime,
    since: datetime,
) -> tuple[list[Overdue], float | None]:
    """(the overdue pods, seconds until the next of the others is)."""
    deadline = ss.update_strategy.progress_deadline_seconds
    if deadline is None:
        return [], None
    containers = sorted({*ss.cold_images, *ss.native_images})
    out: list[Overdue] = []
    nearest: float | None = None
    for pod, is_new, moving, ok in zip(matched, verdicts.updated, verdicts.in_flight, verdicts.available, strict=True):
        if ok or not (is_new or moving) or resizestate.infeasible(pod) is not None:
            continue  # a resize the node cannot fit is reported apart: the rollout goes on without it
        entry = pod.inplace_for(ss.name)
        if entry is None or entry.revision != revision:
            continue  # created with these sidecars, or upgraded under an older spec
        at = parse_time(entry.update_timestamp)
        if at is None:
            continue
        waited = (now - max(at, since)).total_seconds()
        if waited > deadline:
            out.append(Overdue(pod.namespace, pod.name, why_not_ready(pod, containers), waited))
        else:
            left = deadline - waited + 1.0  # past it, with the timestamps' one-second resolution
            nearest = left if nearest is None else min(nearest, left)
    out.sort(key=lambda o: (o.namespace, o.name))
    return out, nearest


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def progress(
    ss: SidecarSet,
    matched: Sequence[PodProjection],
    verdicts: podstate.Verdicts,
    *,
    revision: str,
    now: datetime,
) -> Progress:
    deadline = ss.update_strategy.progress_deadline_seconds
    infeasible = _infeasible(matched, verdicts)
    current = _current(ss)
    if deadline is None:
        # The time the pods were first named stays, so an unchanged status is not written again.
        named = current is not None and current.get("reason") == names.REASON_RESIZE_INFEASIBLE
        since = (parse_time(str(current.get("lastTransitionTime") or "")) if named and current else None) or now
        return Progress(_infeasible_condition(infeasible, ss, since, ""), False)
    if current is not None and is_stopped(ss):
        return Progress(dict(current), True)
    # The clock: from the time the condition turned True for this generation, else from now (first
    # look, a new generation, or a condition someone removed to resume the rollout).
    since = now
    if current is not None and current.get("status") == "True" and current.get("observedGeneration") == ss.generation:
        since = parse_time(str(current.get("lastTransitionTime") or "")) or now
    late, recheck = _clock(ss, matched, verdicts, revision=revision, now=now, since=since)
    if late:
        named = ", ".join(f"{o.key} ({o.why})" for o in late[:SHOWN])
        more = f" and {len(late) - SHOWN} more" if len(late) > SHOWN else ""
        message = (
            f"rollout stopped: {len(late)} upgraded pod(s) not ready within {deadline}s: {named}{more}; "
            "no further pod is touched until the spec changes or this condition is removed"
        )
        condition = {
            "type": names.CONDITION_PROGRESSING,
            "status": "False",
            "reason": names.REASON_DEADLINE_EXCEEDED,
            "message": message,
            "lastTransitionTime": _stamp(now),
            "observedGeneration": ss.generation,
        }
        return Progress(condition, True, tuple(late))
    within = f"upgraded pods are given {deadline}s to be ready again"
    condition = _infeasible_condition(infeasible, ss, since, f"; {within}") or {
        "type": names.CONDITION_PROGRESSING,
        "status": "True",
        "reason": "WithinDeadline",
        "message": within,
        "lastTransitionTime": _stamp(since),
        "observedGeneration": ss.generation,
    }
    return Progress(condition, False, recheck=recheck)


def _infeasible(matched: Sequence[PodProjection], verdicts: podstate.Verdicts) -> list[str]:
    """`namespace/name (the kubelet's message)` of upgraded pods whose resize their node cannot fit."""
    return sorted(
        f"{pod.namespace}/{pod.name} ({why})"
        for pod, is_new in zip(matched, verdicts.updated, strict=True)
        if is_new and (why := resizestate.infeasible(pod)) is not None
    )


def _infeasible_condition(infeasible: list[str], ss: SidecarSet, at: datetime, tail: str) -> dict[str, Any] | None:
    """Progressing, naming the pods a resize stopped at (the others go on); None when there are none."""
    if not infeasible:
        return None
    more = f" and {len(infeasible) - SHOWN} more" if len(infeasible) > SHOWN else ""
    return {
        "type": names.CONDITION_PROGRESSING,
        "status": "True",
        "reason": names.REASON_RESIZE_INFEASIBLE,
        "message": (
            f"{len(infeasible)} pod(s) keep their old resources, their node cannot fit the new ones: "
            f"{', '.join(infeasible[:SHOWN])}{more}; the rollout goes on with the other pods{tail}"
        ),
        "lastTransitionTime": _stamp(at),
        "observedGeneration": ss.generation,
    }
