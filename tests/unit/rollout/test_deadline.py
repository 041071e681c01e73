"""The progress deadline: which upgraded pods are overdue, the condition, stopping and resuming.

Pods come from the planner itself (its patches applied to injected pods), so the in-place state
the deadline reads is the one the controller writes.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.pods.projection import project
from sidecarsets.rollout import deadline, status
from sidecarsets.rollout.planner import plan_upgrade
from sidecarsets.spec import names
from sidecarsets.validation import validate_sidecarset
from tests.kube.builders import apply_patch, injected_pod, kubelet_sync, model, shop_sidecarset, with_images

PATCHED = "2024-06-01T12:00:00Z"
T0 = datetime(2024, 6, 1, 12, 0, 0, tzinfo=UTC)


def _ss(deadline_seconds: int | None = 60, **extra: Any) -> JsonObj:
    ss = with_images(shop_sidecarset(), envoy="envoy:v2")
    strategy: dict[str, Any] = {"type": "RollingUpdate", "maxUnavailable": 2, **extra}
    if deadline_seconds is not None:
        strategy["progressDeadlineSeconds"] = deadline_seconds
    ss["spec"]["updateStrategy"] = strategy
    return ss


def _waiting(pod: JsonObj, reason: str) -> JsonObj:
    out = copy.deepcopy(pod)
    for cs in out["status"]["containerStatuses"]:
        if cs["name"] == "envoy":
            cs["ready"] = False
            cs["state"] = {"waiting": {"reason": reason}}
    out["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return out


def _rolled(ss: JsonObj, n: int = 3) -> list[JsonObj]:
    """n injected pods after one planner pass at PATCHED (maxUnavailable 2: two patched)."""
    raws = [injected_pod(f"p{i}", shop_sidecarset()) for i in range(n)]
    plan = plan_upgrade(model(ss), [project(r) for r in raws], revision="mesh-2", now=PATCHED)
    by_name = {u.name: u for u in plan.upgrades}
    return [
        apply_patch(r, by_name[r["metadata"]["name"]].patch) if r["metadata"]["name"] in by_name else r for r in raws
    ]


def _progress(ss_json: JsonObj, raws: list[JsonObj], now: datetime) -> deadline.Progress:
    ss = model(ss_json)
    pods = [project(r) for r in raws]
    verdicts = status.pod_verdicts(ss, pods)
    return deadline.progress(ss, pods, verdicts, revision="mesh-2", now=now)


def _with_condition(ss: JsonObj, condition: dict[str, Any] | None) -> JsonObj:
    out = copy.deepcopy(ss)
    out["status"] = {"conditions": [condition]} if condition else {}
    return out


def test_without_a_deadline_nothing_is_decided() -> None:
    ss = _ss(None)
    p = _progress(ss, [_waiting(r, "ErrImagePull") for r in _rolled(ss)], T0 + timedelta(days=1))
    assert p == deadline.Progress(None, False)


def test_pods_not_ready_past_the_deadline_stop_the_rollout_with_their_reasons() -> None:
    ss = _ss(60)
    a, b, c = _rolled(ss)
    raws = [_waiting(a, "ErrImagePull"), _waiting(b, "CrashLoopBackOff"), c]
    first = _ss(60)
    first["status"] = {}
    p = _progress(first, raws, T0)  # first look: the clock starts now
    assert p.condition is not None and p.condition["status"] == "True" and not p.stopped
    ticking = _with_condition(ss, p.condition)

    at_deadline = _progress(ticking, raws, T0 + timedelta(seconds=60))
    assert not at_deadline.stopped, "at the deadline, not past it"
    assert at_deadline.recheck == 1.0, "the controller looks again once the deadline has passed"
    assert _progress(ticking, raws, T0 + timedelta(seconds=20)).recheck == 41.0
    p = _progress(ticking, raws, T0 + timedelta(seconds=61))
    assert p.stopped
    cond = p.condition
    assert cond is not None
    assert (cond["type"], cond["status"], cond["reason"]) == ("Progressing", "False", names.REASON_DEADLINE_EXCEEDED)
    assert cond["observedGeneration"] == model(ss).generation
    assert "shop/p0 (envoy: ErrImagePull)" in cond["message"]
    assert "shop/p1 (envoy: CrashLoopBackOff)" in cond["message"]
    assert "p2" not in cond["message"], "a pod never upgraded is not overdue"
    assert [o.key for o in p.newly_overdue] == ["shop/p0", "shop/p1"]


def test_a_pod_that_becomes_ready_is_not_overdue() -> None:
    ss = _ss(10)
    a, b, _ = _rolled(ss)
    ticking = _with_condition(ss, _progress(_with_condition(ss, None), [a], T0).condition)
    p = _progress(ticking, [kubelet_sync(a), kubelet_sync(b)], T0 + timedelta(hours=1))
    assert not p.stopped and p.condition is not None and p.condition["status"] == "True"


def test_a_not_ready_pod_is_named_as_the_kubelet_reports_it() -> None:
    ss = _ss(5)
    (a, *_) = _rolled(ss)
    synced = kubelet_sync(a, ready=False)
    ticking = _with_condition(ss, _progress(_with_condition(ss, None), [synced], T0).condition)
    p = _progress(ticking, [synced], T0 + timedelta(seconds=6))
    assert p.stopped and p.condition is not None
    assert "shop/p0 (envoy: not ready)" in p.condition["message"]


def test_once_stopped_it_stays_stopped_at_that_generation() -> None:
    ss = _ss(5)
    raws = [_waiting(r, "ErrImagePull") for r in _rolled(ss)]
    ticking = _with_condition(ss, _progress(_with_condition(ss, None), raws, T0).condition)
    stopped = _progress(ticking, raws, T0 + timedelta(seconds=6))
    held = _with_condition(ss, stopped.condition)
    assert deadline.is_stopped(model(held))
    later = _progress(held, [kubelet_sync(r) for r in raws], T0 + timedelta(hours=1))
    assert later.stopped and later.condition == stopped.condition, "healthy pods do not resume it by themselves"
    assert later.newly_overdue == (), "the Event is sent once"


def test_a_new_generation_or_a_removed_condition_resumes_with_a_fresh_deadline() -> None:
    ss = _ss(5)
    raws = [_waiting(r, "ErrImagePull") for r in _rolled(ss)]
    ticking = _with_condition(ss, _progress(_with_condition(ss, None), raws, T0).condition)
    stopped = _progress(ticking, raws, T0 + timedelta(seconds=6)).condition

    changed = _with_condition(ss, stopped)
    changed["metadata"]["generation"] += 1  # the spec edited
    assert not deadline.is_stopped(model(changed))
    at = T0 + timedelta(seconds=100)
    p = _progress(changed, raws, at)
    assert not p.stopped and p.condition is not None
    assert p.condition["lastTransitionTime"] == at.strftime("%Y-%m-%dT%H:%M:%SZ"), "the clock starts again"
    assert p.condition["observedGeneration"] == changed["metadata"]["generation"]

    cleared = _with_condition(ss, None)  # someone removed the condition
    p = _progress(cleared, raws, at)
    assert not p.stopped
    again = _with_condition(ss, p.condition)
    assert not _progress(again, raws, at + timedelta(seconds=5)).stopped
    assert _progress(again, raws, at + timedelta(seconds=6)).stopped


def test_pods_upgraded_under_an_older_revision_are_not_counted() -> None:
    ss = _ss(5)
    raws = [_waiting(r, "ErrImagePull") for r in _rolled(ss)]
    ss_obj = model(ss)
    pods = [project(r) for r in raws]
    verdicts = status.pod_verdicts(ss_obj, pods)
    late = deadline.overdue(
        ss_obj, pods, verdicts, revision="mesh-3", now=T0 + timedelta(hours=1), since=T0 - timedelta(hours=1)
    )
    assert late == []


def test_the_deadline_is_validated_and_read_into_the_model() -> None:
    for bad in (0, -5, 1.5, "60", True, 2**31):
        ss = _ss(None)
        ss["spec"]["updateStrategy"]["progressDeadlineSeconds"] = bad
        errs = validate_sidecarset(ss)
        assert [e.field for e in errs] == ["spec.updateStrategy.progressDeadlineSeconds"], (bad, errs)
        assert model(ss).update_strategy.progress_deadline_seconds is None  # tolerant: read as absent
    ok = _ss(600)
    assert validate_sidecarset(ok) == []
    assert model(ok).update_strategy.progress_deadline_seconds == 600
    assert model(_ss(None)).update_strategy.progress_deadline_seconds is None
