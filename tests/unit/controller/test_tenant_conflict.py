"""The controller's report of a cluster SidecarSet that took a NamespacedSidecarSet's names after it
was admitted: the condition on every pass, the Warning Event only when the conflict is new."""

from __future__ import annotations

import asyncio
from typing import Any

from sidecarsets.controller.tenants import report_cluster_conflict
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

LABELS = {names.NS_NAME_LABEL: "team-a"}
NOW = "2026-12-05T10:00:00Z"


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def event(self, obj: Any, *, type: str, reason: str, message: str) -> None:
        self.events.append({"obj": obj, "type": type, "reason": reason, "message": message})


def tenant(status: dict[str, Any] | None = None) -> SidecarSet:
    obj = builders.namespaced_sidecarset("debug", containers=[builders.container("proxy", "mine:1")], status=status)
    return SidecarSet.from_object(obj, tolerant=True)


def report(ss: SidecarSet, *others: SidecarSet) -> tuple[dict[str, Any], Recorder]:
    recorder, new_status = Recorder(), dict[str, Any]()
    stand_in: Any = recorder  # records what an EventRecorder would write
    found = [ss, *others]
    asyncio.run(report_cluster_conflict(stand_in, ss, new_status, sidecarsets=found, namespace_labels=LABELS, now=NOW))
    [condition] = new_status["conditions"]
    return condition, recorder


def test_a_cluster_set_taking_its_name_sets_the_condition_and_records_one_event() -> None:
    mesh = SidecarSet.from_object(builders.sidecarset("mesh"))
    condition, recorder = report(tenant(), mesh)
    assert condition["type"] == names.CONDITION_CLUSTER_CONFLICT and condition["status"] == "True"
    assert "container proxy belongs to SidecarSet mesh" in condition["message"]
    [event] = recorder.events
    assert event["type"] == "Warning" and event["reason"] == names.CONDITION_CLUSTER_CONFLICT
    assert event["obj"]["metadata"]["namespace"] == "team-a"
    # Already reported: the condition stays, no second Event.
    condition, recorder = report(tenant(status={"conditions": [condition]}), mesh)
    assert condition["status"] == "True" and recorder.events == []


def test_no_conflict_is_a_false_condition_and_no_event() -> None:
    other = SidecarSet.from_object(builders.sidecarset("mesh", containers=[builders.container("envoy", "e:1")]))
    condition, recorder = report(tenant(), other)
    assert condition["status"] == "False" and recorder.events == []
