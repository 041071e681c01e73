"""The policy sync against an in-memory API: what it writes, in which order, and what it puts back.

The fake API's listener plays the watches (every write is seen at once). A fake clock decides
when a widened webhook may be narrowed again.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from injector.policy import params as parameters
from injector.policy.bundle import NAME_PREFIX
from injector.policy.generate import ANN_MEMBERS
from injector.policy.params import PLURAL as PARAMS_KIND
from injector.policy.plan import Mode, Path, Why
from injector.policysync import pacing
from injector.policysync.adoption import ENFORCED_ROUNDS
from injector.policysync.desired import ANN_GENERATED_AT
from injector.policysync.narrowing import CONDITION_NAME, MWC_PATH
from injector.policysync.support import BINDINGS, CANARY, POLICIES, V1
from injector.policysync.sync import PolicySync
from kuberuntime import api
from kuberuntime.jsontypes import JsonObj
from sidecarsets.controller.controller import SS_PATH
from sidecarsets.spec import names
from tests.kube import builders
from tests.kube.fakeapi import FakeApiServer

NS = "sidecarctl-system"
PARAMS = parameters.path(NS)
P0 = NAME_PREFIX + "0"  # the first policy: one SidecarSet, or a few, fit in it
MWC = f"{MWC_PATH}/{names.MUTATING_WEBHOOK_CONFIG}"
# (pace, quiet, max_quiet): written as soon as the pace allows (the fake clock stands still between
# a test's creates and its pass, so a quiet time would hold every write back); pacing has its tests.
NO_QUIET = (1.0, 0.0, 10.0)


class ScriptedProbe:
    """Answers in turn, None (enforced) or why not; the last answer again once they run out. Its barrier
    (`caught_up`) answers `barrier`, True until a test says otherwise."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.barrier = True
        self.barriers = 0
        # What happens while the barrier is asked, and what is looked at before it answers.
        self.during: Callable[[], object] | None = None
        self.before_answer: Callable[[], object] | None = None

    async def check(self) -> str | None:
        self.calls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    async def caught_up(self) -> bool:
        self.barriers += 1
        if self.during is not None:
            self.during()
        await asyncio.sleep(0.01)  # the canary's writes and dry-runs: the sync's loop runs meanwhile
        if self.before_answer is not None:
            self.before_answer()
        return self.barrier


class Rig:
    def __init__(
        self, mode: Mode = Mode.AUTO, unsupported: str | None = None, pacing: tuple[float, float, float] = NO_QUIET
    ) -> None:
        self.api = FakeApiServer()
        self.now = 100.0
        self.times = iter(f"2024-01-01T00:00:{i:02d}Z" for i in range(60))
        self.changed: list[set[str]] = []
        self.sync = PolicySync(
            self.api,
            mode=mode,
            manager_namespace=NS,
            settle=2.0,
            pacing=pacing,
            probe=ScriptedProbe(unsupported),
            on_routes=self.changed.append,
            clock=lambda: next(self.times),
            monotonic=lambda: self.now,
        )
        self.api.listeners.append(self._deliver)
        self.sync.set_served(V1)  # discovery lists the v1 API (a server of 1.36 or later)
        self.api.put(
            MWC,
            {
                "metadata": {"name": names.MUTATING_WEBHOOK_CONFIG},
                "webhooks": [
                    {"name": "other.example.com", "matchConditions": [{"name": "theirs", "expression": "true"}]},
                    {"name": names.MUTATING_WEBHOOK_NAME, "matchConditions": [{"name": "user", "expression": "true"}]},
                ],
            },
        )

    def _deliver(self, path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        kind = "DELETED" if new is None else ("ADDED" if old is None else "MODIFIED")
        for prefix, handler in (
            (SS_PATH + "/", self.sync.on_sidecarset),
            (POLICIES + "/", self.sync.on_policy),
            (BINDINGS + "/", self.sync.on_binding),
            (PARAMS + "/", self.sync.on_params),
            (MWC_PATH + "/", self.sync.on_webhook_config),
        ):
            if path.startswith(prefix):
                handler(kind, old, new)

    def add(self, name: str, app: str = "web", **spec: Any) -> JsonObj:
        spec.setdefault("status", {"latestRevision": f"{name}-1"})  # the controller has recorded it
        return self.api.put(f"{SS_PATH}/{name}", builders.sidecarset(name, app=app, **spec))

    def run(self) -> None:
        async def go() -> None:
            await self.sync.support.check_if_due()
            await self.sync.sync_once()

        asyncio.run(go())

    def policy(self, name: str) -> JsonObj | None:
        return self.api.objects.get(f"{POLICIES}/{name}")

    def binding(self, name: str) -> JsonObj | None:
        return self.api.objects.get(f"{BINDINGS}/{name}")

    def params(self, name: str) -> JsonObj | None:
        return self.api.objects.get(f"{PARAMS}/{name}")

    def conditions(self) -> list[JsonObj]:
        hook = next(h for h in self.api.objects[MWC]["webhooks"] if h["name"] == names.MUTATING_WEBHOOK_NAME)
        return list(hook.get("matchConditions") or [])

    def ours(self) -> str | None:
        found = [c["expression"] for c in self.conditions() if c["name"] == CONDITION_NAME]
        return found[0] if found else None


def test_a_new_sidecarset_widens_the_webhook_writes_its_policy_then_narrows() -> None:
    rig = Rig()
    ss = rig.add("mesh")
    rig.run()
    policy, binding = rig.policy(P0), rig.binding(P0)
    assert policy is not None and binding is not None
    owner = {"apiVersion": "sidecarctl.io/v1alpha1", "kind": "SidecarSet", "name": "mesh", "uid": ss["metadata"]["uid"]}
    assert policy["metadata"]["ownerReferences"] == [owner] == binding["metadata"]["ownerReferences"]
    assert policy["metadata"]["annotations"][ANN_GENERATED_AT] == "2024-01-01T00:00:00Z"
    widened = rig.ours()
    assert widened is not None and '"web"' in widened  # the webhook takes mesh's pods while the policy settles
    # The webhook was widened before the policy was written.
    writes = rig.api.writes()
    assert writes.index(MWC) < writes.index(POLICIES)
    assert rig.sync.routes["mesh"].path is Path.POLICY
    assert rig.changed == [{"mesh"}]
    # The user's own condition and the other webhook are untouched.
    assert {"name": "user", "expression": "true"} in rig.conditions()
    rig.now += 1.0
    rig.run()
    assert rig.ours() == widened, "narrowed before the policy can be enforced"
    rig.now += 1.5
    rig.run()
    narrowed = rig.ours()
    assert narrowed is not None and narrowed != widened and narrowed.startswith("(false) || (")
    assert rig.api.objects[MWC]["webhooks"][0]["matchConditions"] == [{"name": "theirs", "expression": "true"}]


def test_the_webhook_stays_widened_until_the_barrier_shows_the_policy_enforced() -> None:
    """Past `settle`, a kube-apiserver that has not refreshed its policies yet (the canary written after
    the policy is not enforced) keeps the webhook widened, and the barrier is asked again a `settle` later."""
    rig = Rig()
    probe = rig.sync.support.probe
    assert isinstance(probe, ScriptedProbe)
    rig.add("mesh")
    rig.run()
    widened = rig.ours()
    assert rig.policy(P0) is not None and widened is not None and '"web"' in widened
    probe.barrier = False
    rig.now += 2.5
    rig.run()
    assert probe.barriers == 1 and rig.ours() == widened, "narrowed before the policy was shown enforced"
    rig.now += 1.0
    rig.run()
    assert probe.barriers == 1, "asked again before `settle` seconds had passed"
    probe.barrier = True
    rig.now += 1.5
    rig.run()
    assert probe.barriers == 2 and rig.ours() != widened
    rig.now += 10.0
    rig.run()
    assert probe.barriers == 2, "asked with nothing written since the last narrowing"


def test_a_sidecarset_created_while_the_barrier_is_asked_is_widened_for_at_once_and_settles_on() -> None:
    """The barrier takes about a second (a refresh of kube-apiserver's policies): a SidecarSet created
    meanwhile reaches the webhook then, not after the pass, and stays widened for once the others narrow."""
    rig = Rig()
    probe = rig.sync.support.probe
    assert isinstance(probe, ScriptedProbe)
    rig.add("mesh")
    rig.run()
    seen: list[str | None] = []
    probe.during = lambda: rig.add("late", app="shop")
    probe.before_answer = lambda: seen.append(rig.ours())
    rig.now += 2.5
    rig.run()
    assert probe.barriers == 1
    assert '"shop"' in (seen[0] or ""), "the late SidecarSet's pods waited for the barrier to reach the webhook"
    assert rig.sync.widening.settling == {"late"} and rig.sync.narrow_at is not None
    assert '"shop"' in (rig.ours() or ""), "narrowed for the late SidecarSet with the others"


def test_the_webhook_stays_widened_after_a_slow_policy_write_for_as_long_again_as_the_write_took() -> None:
    rig = Rig()
    rig.add("mesh")

    def slow_write(path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if path.startswith(POLICIES + "/") and old is None:
            rig.now += 10.0  # the API server took 10 s to accept (compile) the policy

    rig.api.listeners.insert(0, slow_write)
    rig.run()
    widened = rig.ours()
    assert rig.policy(P0) is not None and widened is not None and '"web"' in widened
    rig.now += 2.5  # past `settle` counted from the start of the pass, and from the write's end
    rig.run()
    assert rig.ours() == widened, "narrowed before the API server could have compiled the policy again"
    rig.now += 10.0
    rig.run()
    assert rig.ours() != widened


@pytest.mark.parametrize("mode", [Mode.AUTO, Mode.POLICY])
def test_a_new_sidecarset_waits_on_the_webhook_for_its_first_revision_then_its_policy_is_written_once(
    mode: Mode,
) -> None:
    rig = Rig(mode)
    ss = rig.add("mesh", status={})
    rig.run()
    if mode is Mode.POLICY:  # no webhook to wait on: written at once, without a revision to record
        assert rig.policy(P0) is not None
        return
    assert rig.policy(P0) is None
    route = rig.sync.routes["mesh"]
    assert (route.path, route.why) == (Path.WEBHOOK, Why.PENDING) and "first revision" in route.message
    assert rig.ours() is not None and '"web"' in (rig.ours() or "")  # the webhook takes mesh's pods
    rig.api.put(f"{SS_PATH}/mesh", {**ss, "status": {"latestRevision": "mesh-5d8f"}})
    rig.run()
    values = rig.params(P0)
    assert values is not None and "mesh-5d8f" in json.dumps(parameters.values(values)), "pods record the revision"
    assert rig.sync.routes["mesh"].path is Path.POLICY
    assert len(rig.api.writes("create", POLICIES)) == 1 and not rig.api.writes("update", POLICIES)


def test_a_change_to_one_group_widens_the_webhook_for_that_group_only() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.add("logs", app="logs")
    rig.run()
    rig.now += 10
    rig.run()
    narrowed = rig.ours()
    assert narrowed is not None and '"logs"' not in narrowed.split(") || (")[0]
    reconfigure(rig, "mesh", "debug")  # a change of its CEL (an image alone changes only values: below)
    rig.run()
    widened = rig.ours()
    assert widened is not None and widened != narrowed
    # The one policy holding both is rewritten; only mesh's pods go through the webhook meanwhile.
    selected = widened.split(") || (")[0]
    assert '"web"' in selected and '"logs"' not in selected, selected


def test_a_sidecarset_created_while_a_policy_is_written_widens_the_webhook_before_the_next_write() -> None:
    """Storing a large policy takes the API server seconds and a pass may write several: a SidecarSet
    created meanwhile goes to the webhook after the write in progress, not when the pass ends."""
    rig = Rig()
    rig.add("mesh")
    rig.add("logs", app="logs", containers=[{"name": "shipper", "image": "shipper:1"}])
    late: list[JsonObj] = []

    def create_late(path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if path.startswith(POLICIES + "/") and not late:
            late.append(rig.add("late", app="late"))

    rig.api.listeners.append(create_late)
    rig.run()
    assert late, "no policy was written"
    writes = rig.api.writes()
    first_policy = next(i for i, w in enumerate(writes) if w.startswith(POLICIES))
    # The condition written right after the first policy write takes the late SidecarSet's pods.
    after = [i for i, w in enumerate(writes) if w == MWC and i > first_policy]
    assert after, writes
    widened = rig.ours()
    assert widened is not None and '"late"' in widened
    # The late SidecarSet stays on the webhook until its own policy is written and settles.
    assert "late" in rig.sync.widening.settling
    rig.api.listeners.remove(create_late)
    before = len(rig.api.writes("update", POLICIES))
    rig.run()
    rig.now += 10
    rig.run()
    rig.now += 10
    rig.run()
    # Written once with the late member in its place (oldest first, then by name), not appended then sorted.
    assert len(rig.api.writes("update", POLICIES)) == before + 1
    narrowed = rig.ours()
    assert narrowed is not None and '"late"' not in narrowed.split(") || (")[-1]
    assert rig.sync.routes["late"].path is Path.POLICY


def _in_flight(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, list[str]]:
    """Policy writes wait for the returned gate, as kube-apiserver takes seconds to compile a large
    policy; the list records each one that started."""
    gate, started = asyncio.Event(), []
    for verb in ("create", "update"):
        write = getattr(rig.api, verb)

        async def slow(path: str, body: JsonObj, *, params: Any = None, write: Any = write) -> JsonObj:
            if path.startswith(POLICIES):
                started.append(body["metadata"]["name"])
                await gate.wait()
            return await write(path, body, params=params)  # type: ignore[no-any-return]

        monkeypatch.setattr(rig.api, verb, slow)
    return gate, started


async def _until(check: Any) -> None:
    for _ in range(200):  # the fake API answers at once: a few loop turns are enough
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def test_a_sidecarset_created_while_a_policy_write_is_in_flight_widens_the_webhook_before_the_write_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Storing a policy of 60 groups takes kube-apiserver 6-19 s: a SidecarSet created meanwhile
    must reach the webhook then, not when the write returns."""
    rig = Rig()
    rig.add("mesh")
    gate, started = _in_flight(rig, monkeypatch)

    async def go() -> None:
        await rig.sync.support.check_if_due()
        sync = asyncio.ensure_future(rig.sync.sync_once())
        await _until(lambda: started)
        before = rig.ours()
        assert before is not None and '"late"' not in before
        rig.add("late", app="late")
        await _until(lambda: '"late"' in (rig.ours() or ""))
        assert rig.policy(P0) is None and not sync.done(), "the condition waited for the policy's write"
        gate.set()
        await sync

    asyncio.run(go())
    assert rig.policy(P0) is not None
    assert "late" in rig.sync.widening.settling  # on the webhook until its own policy is written and settles


def test_a_status_write_during_a_policy_write_does_not_widen_the_webhook(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller writes SidecarSet status all the time (revisions, pod counts): none of it
    changes what the webhook would do, so none of it may send policy-served pods to the webhook."""
    rig = Rig()
    rig.add("mesh")
    rig.add("logs", app="logs")
    rig.run()
    rig.now += 10
    rig.run()  # settled and narrowed
    rig.add("fresh", app="fresh")  # makes the next pass write a policy
    gate, started = _in_flight(rig, monkeypatch)
    condition_writes = len(rig.api.writes("patch", MWC))

    async def go() -> None:
        sync = asyncio.ensure_future(rig.sync.sync_once())
        await _until(lambda: started)
        condition_writes_at_start = len(rig.api.writes("patch", MWC))
        logs = copy.deepcopy(rig.api.objects[f"{SS_PATH}/logs"])
        logs["status"] = {**logs["status"], "matchedPods": 3}
        rig.api.put(f"{SS_PATH}/logs", logs)  # the same uid, generation, labels and annotations
        assert rig.sync.models["logs"].status["matchedPods"] == 3
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(rig.api.writes("patch", MWC)) == condition_writes_at_start
        gate.set()
        await sync

    asyncio.run(go())
    assert condition_writes < len(rig.api.writes("patch", MWC))  # the pass did widen for "fresh"
    assert "logs" not in rig.sync.widening.settling and "fresh" in rig.sync.widening.settling


def test_a_written_policy_is_remembered_before_the_watch_delivers_it() -> None:
    """A large policy takes seconds to store and its watch event comes later still: comparing the
    next pass with the policy from before the write wrote it again, with a new time, for ever."""
    rig = Rig()
    rig.add("mesh")
    rig.api.listeners.clear()  # from here the watch lags behind every write
    rig.run()
    assert len(rig.api.writes("create", POLICIES)) == 1
    for _ in range(3):
        rig.now += 10
        rig.run()
    assert len(rig.api.writes("create", POLICIES)) == 1 and not rig.api.writes("update", POLICIES)
    # An event older than what the write answered does not replace it either.
    stale = copy.deepcopy(rig.sync.policies[P0])
    stale["metadata"]["resourceVersion"] = "1"
    rig.sync.on_policy("MODIFIED", None, stale)
    rig.run()
    assert not rig.api.writes("update", POLICIES)


def test_a_remembered_answer_whose_object_was_deleted_is_created_again() -> None:
    """The garbage collector deletes a binding whose owners are gone while an update adding a new
    owner is in flight; the DELETED event comes before the update's answer, which is kept. The next
    change then replaced a binding that no longer existed: every pass failed on the same 404 and no
    new SidecarSet was ever served by a policy."""
    rig = Rig()
    rig.add("mesh")
    rig.run()
    assert rig.binding(P0) is not None and rig.policy(P0) is not None
    for path in (f"{BINDINGS}/{P0}", f"{POLICIES}/{P0}"):
        del rig.api.objects[path]  # gone, and the sync's memory of its own write stays behind
    rig.add("shop", app="shop")
    rig.run()
    assert [p for p in rig.api.writes("create") if p in (POLICIES, BINDINGS)] == [POLICIES, BINDINGS] * 2
    binding = rig.binding(P0)
    assert binding is not None and {o["name"] for o in binding["metadata"]["ownerReferences"]} == {"mesh", "shop"}
    assert rig.sync.routes["shop"].path is Path.POLICY
    rig.now += 10
    rig.run()  # and the pass after writes nothing more
    # (the one update is the replace that found nothing)
    assert len(rig.api.writes("create", BINDINGS)) == 2 and len(rig.api.writes("update", BINDINGS)) == 1


def test_a_quiet_pass_writes_nothing() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.run()
    rig.now += 10
    rig.run()
    before = len(rig.api.writes())
    rig.now += 10
    rig.run()
    assert len(rig.api.writes()) == before


def repairs(kind: str) -> float:
    return REGISTRY.get_sample_value("sidecarctl_policy_repairs_total", {"kind": kind}) or 0.0


def value(params: JsonObj, key: str) -> str:
    """The value under `key` in a parameter object, whatever version of the CEL reads it (its prefix)."""
    name = parameters.key_name(key, {})
    [found] = [v for k, v in parameters.values(params).items() if k.split("/", 1)[1] == name]
    return str(found)


def bump(rig: Rig, name: str, image: str) -> None:
    """A new image for the SidecarSet's first container: only values of its parameter object change."""
    changed = copy.deepcopy(rig.api.objects[f"{SS_PATH}/{name}"])
    changed["spec"]["containers"][0]["image"] = image
    changed["metadata"]["generation"] = changed["metadata"].get("generation", 1) + 1
    rig.api.put(f"{SS_PATH}/{name}", changed)


def reconfigure(rig: Rig, name: str, level: str) -> None:
    """A new env var value for the SidecarSet's first container: its policy's CEL changes."""
    changed = copy.deepcopy(rig.api.objects[f"{SS_PATH}/{name}"])
    changed["spec"]["containers"][0]["env"] = [{"name": "LOG_LEVEL", "value": level}]
    changed["metadata"]["generation"] = changed["metadata"].get("generation", 1) + 1
    rig.api.put(f"{SS_PATH}/{name}", changed)


def test_an_image_change_rewrites_the_parameter_object_only_with_a_new_time_and_no_widening() -> None:
    before = [repairs(k) for k in ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings", PARAMS_KIND)]
    rig = narrowed_rig()
    narrowed = rig.ours()
    policy, first = rig.policy(P0), rig.params(P0)
    assert policy is not None and first is not None
    assert value(first, "mesh:image:proxy") == "proxy:1"
    assert "proxy:1" not in json.dumps(policy), "the image is read from the parameter object, not written in CEL"
    writes = len(rig.api.writes())
    bump(rig, "mesh", "proxy:2")
    rig.run()
    second = rig.params(P0)
    assert second is not None and value(second, "mesh:image:proxy") == "proxy:2"
    assert rig.api.writes()[writes:] == [f"{PARAMS}/{P0}"], "one small object written: no policy, no condition"
    assert rig.policy(P0) == policy, "the CEL the API server compiled stays"
    assert second["metadata"]["annotations"][ANN_GENERATED_AT] != first["metadata"]["annotations"][ANN_GENERATED_AT]
    assert value(second, "time") == json.dumps(second["metadata"]["annotations"][ANN_GENERATED_AT]), (
        "the pods' bookkeeping entries record when this version reached the API server"
    )
    assert rig.ours() == narrowed, "nothing to compile, so nothing to widen for"
    assert [repairs(k) for k in ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings", PARAMS_KIND)] == (
        before
    ), "a SidecarSet's own change is not a repair"


def test_the_parameter_object_is_written_before_its_policy_and_put_back_when_deleted() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.run()
    writes = rig.api.writes()
    assert writes.index(PARAMS) < writes.index(POLICIES) < writes.index(BINDINGS)
    stored = rig.params(P0)
    assert stored is not None
    rig.api._store(f"{PARAMS}/{P0}", None)  # someone deletes it: the binding now refuses mesh's pods
    before = repairs(PARAMS_KIND)
    rig.run()
    again = rig.params(P0)
    assert again is not None
    assert value(again, "mesh:image:proxy") == value(stored, "mesh:image:proxy")
    assert set(parameters.values(again)) == set(parameters.values(stored))
    assert repairs(PARAMS_KIND) == before + 1


def test_a_parameter_object_goes_only_settle_seconds_after_its_policy_and_binding() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.run()
    rig.api._store(f"{SS_PATH}/mesh", None)
    rig.run()
    assert rig.policy(P0) is None and rig.binding(P0) is None
    assert rig.params(P0) is not None, "a kube-apiserver may hold the binding until its next recompile"
    rig.now += 1.0  # the watches have seen both go: the time starts now
    rig.run()
    assert rig.params(P0) is not None
    rig.now += 1.5
    rig.run()
    assert rig.params(P0) is not None
    rig.now += 0.5
    rig.run()
    assert rig.params(P0) is None


def test_a_hand_edit_is_put_back_with_the_same_time() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.run()
    rig.now += 10
    rig.run()
    kept = copy.deepcopy(rig.policy(P0))
    assert kept is not None
    edited = copy.deepcopy(kept)
    edited["spec"]["mutations"] = []
    policies, bindings = repairs("mutatingadmissionpolicies"), repairs("mutatingadmissionpolicybindings")
    rig.api._store(f"{POLICIES}/{P0}", edited)
    rig.run()
    restored = rig.policy(P0)
    assert restored is not None and restored["spec"] == kept["spec"]
    assert restored["metadata"]["annotations"] == kept["metadata"]["annotations"]
    assert repairs("mutatingadmissionpolicies") == policies + 1
    rig.api._store(f"{BINDINGS}/{P0}", None)
    rig.run()
    assert rig.binding(P0) is not None
    assert repairs("mutatingadmissionpolicybindings") == bindings + 1
    # Deleted, the policy comes back with a new generation time: still a repair.
    rig.now += 10
    rig.api._store(f"{POLICIES}/{P0}", None)
    rig.run()
    back = rig.policy(P0)
    assert (
        back is not None
        and back["metadata"]["annotations"][ANN_GENERATED_AT] != kept["metadata"]["annotations"][ANN_GENERATED_AT]
    )
    assert repairs("mutatingadmissionpolicies") == policies + 2
    # The condition, hand-edited, is put back too.
    mwc = copy.deepcopy(rig.api.objects[MWC])
    mwc["webhooks"][1]["matchConditions"] = [{"name": CONDITION_NAME, "expression": "false"}]
    rig.now += 10
    rig.api._store(MWC, mwc)
    rig.run()
    assert rig.ours() not in (None, "false")


def test_deleted_and_paused_sidecarsets_lose_their_policies_the_canary_stays() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.add("logs", app="logs")
    rig.api.put(
        f"{POLICIES}/{CANARY}", {"metadata": {"name": CANARY, "labels": {"app.kubernetes.io/managed-by": "sidecarctl"}}}
    )
    rig.run()
    assert rig.policy(P0) is not None
    rig.api._store(f"{SS_PATH}/logs", None)
    paused = copy.deepcopy(rig.api.objects[f"{SS_PATH}/mesh"])
    paused["spec"]["injectionStrategy"] = {"paused": True}
    rig.api._store(f"{SS_PATH}/mesh", paused)
    rig.run()
    assert rig.policy(P0) is None and rig.binding(P0) is None
    assert rig.policy(CANARY) is not None
    assert rig.sync.routes["mesh"].why is Why.NOT_INJECTING


def test_webhook_mode_removes_what_auto_left_and_the_condition() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.run()
    rig.now += 10
    rig.run()
    assert rig.ours() is not None
    webhook = Rig(mode=Mode.WEBHOOK)
    webhook.api = rig.api
    webhook.sync.client = webhook.sync.narrowing.client = rig.api
    rig.api.listeners = [webhook._deliver]
    for path, obj in list(rig.api.objects.items()):
        webhook._deliver(path, None, obj)
    webhook.run()
    assert webhook.ours() is None, "the webhook serves every pod at once"
    assert rig.policy(P0) is not None, "the policy stays until the widened webhook has settled"
    webhook.now += 2.0
    webhook.run()
    assert rig.policy(P0) is None
    assert {"name": "user", "expression": "true"} in webhook.conditions()
    assert webhook.sync.routes["mesh"].why is Why.WEBHOOK_MODE


def test_an_api_server_that_does_not_enforce_policies_gets_none() -> None:
    rig = Rig(unsupported="policies are not enforced here")
    rig.add("mesh")
    rig.run()
    assert rig.policy(P0) is None
    assert rig.ours() is None
    route = rig.sync.routes["mesh"]
    assert (route.why, route.message) == (Why.UNSUPPORTED, "policies are not enforced here")


def test_a_policy_the_api_server_refuses_sends_its_sidecarsets_to_the_webhook() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.api.fail("create", POLICIES, api.Invalid(422, "Invalid", "compilation failed: max recursion depth exceeded"))
    rig.run()
    assert rig.policy(P0) is None
    assert rig.sync.dirty.is_set()
    rig.run()
    route = rig.sync.routes["mesh"]
    assert route.path is Path.WEBHOOK and "max recursion depth" in route.message
    assert rig.policy(P0) is None
    rig.now += 10
    rig.run()
    assert '"web"' in (rig.ours() or ""), "the webhook serves mesh's pods"


def test_a_conflict_on_the_webhook_configuration_is_retried() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.api.fail("patch", MWC_PATH, api.Conflict(409, "Conflict", "the object has been modified"))
    rig.run()
    assert rig.sync.dirty.is_set()
    rig.run()
    assert rig.ours() is not None


def test_an_unreadable_sidecarset_keeps_its_last_good_policy() -> None:
    rig = Rig()
    rig.add("mesh")
    rig.run()
    kept = rig.policy(P0)
    broken = copy.deepcopy(rig.api.objects[f"{SS_PATH}/mesh"])
    broken["spec"]["containers"] = "not a list"
    rig.api._store(f"{SS_PATH}/mesh", broken)
    rig.run()
    assert rig.policy(P0) == kept


def test_the_first_narrowing_waits_for_the_sidecarset_watches_and_widens_for_what_they_bring() -> None:
    """Until the first narrowing the webhook took every pod, so it injected the pods of a SidecarSet
    stored a moment before the pass that the pass has not planned. The condition is written only once
    the SidecarSet watches have caught up with a quorum read, and takes that SidecarSet's pods too."""
    rig = Rig()
    rig.add("mesh")
    caught_up: list[str | None] = []

    async def catch_up() -> None:
        caught_up.append(rig.ours())  # what the webhook carried then: nothing of ours yet
        if len(caught_up) == 1:
            rig.add("late", app="late")  # the watch delivers a SidecarSet stored before the quorum read

    rig.sync.catch_up = catch_up
    rig.run()
    assert caught_up == [None]
    first = rig.api.writes().index(MWC)
    written = rig.api.writes("patch", MWC)
    assert written and first < rig.api.writes().index(POLICIES)
    widened = rig.ours()
    assert widened is not None and '"late"' in widened and '"web"' in widened
    assert {"mesh", "late"} <= rig.sync.widening.settling
    rig.now += 10
    rig.run()
    assert len(caught_up) == 1, "caught up again with our condition on the webhook"


def test_a_sidecarset_stored_while_the_condition_is_written_is_widened_for_before_the_pass_ends() -> None:
    """A pass that writes no policy still widens at once for a SidecarSet that arrives while its condition
    is written (the first narrowing at adoption, say), not a pass later."""
    rig = Rig()
    late: list[JsonObj] = []

    def create_late(path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if path == MWC and not late:
            late.append(rig.add("late", app="late"))

    rig.api.listeners.append(create_late)
    passes = rig.sync.passes
    rig.run()
    assert late and rig.sync.passes == passes + 1
    widened = rig.ours()
    assert widened is not None and '"late"' in widened
    assert rig.policy(P0) is None  # planned on the next pass; the webhook has its pods meanwhile


def between_passes(rig: Rig, meanwhile: Callable[[], object]) -> str | None:
    """The sync's wait between two passes, during which `meanwhile` happens; our condition at its end."""
    seen: list[str | None] = []

    async def wait() -> None:
        meanwhile()
        await asyncio.sleep(0.01)
        seen.append(rig.ours())

    asyncio.run(rig.sync.widening.between_passes(wait()))
    return seen[0]


def narrowed_rig(probe: ScriptedProbe | None = None) -> Rig:
    """The SidecarSet `mesh` served by its policy, the webhook narrowed again (`probe`: the one asked)."""
    rig = Rig()
    if probe is not None:
        rig.sync.support.probe = probe
    rig.add("mesh")
    rig.run()
    rig.now += 10
    rig.run()
    assert rig.ours() is not None and rig.sync.routes["mesh"].path is Path.POLICY
    return rig


def test_a_sidecarset_arriving_between_passes_is_widened_for_before_the_next_pass() -> None:
    """An arrival starts a pass at once, but the pass plans before it writes; the webhook takes the new
    SidecarSet's pods from the moment the sync hears of it, against the condition the last pass wrote."""
    rig = narrowed_rig()
    before = rig.ours()
    seen = between_passes(rig, lambda: rig.add("late", app="late"))
    assert before is not None and '"late"' not in before
    assert seen is not None and '"late"' in seen and seen.startswith(f"({before}) || (")
    assert "late" in rig.sync.widening.settling
    rig.run()  # the next pass plans it: still on the webhook until its policy settles
    assert '"late"' in (rig.ours() or "")


def test_a_replica_that_lost_the_lease_widens_nothing_between_passes() -> None:
    rig = narrowed_rig()
    before = rig.ours()
    asked: list[bool] = []

    async def may_write() -> bool:  # the Lease names another holder now
        asked.append(False)
        return False

    rig.sync.widening.may_write = may_write
    assert between_passes(rig, lambda: rig.add("late", app="late")) == before and asked


def test_an_image_bump_between_passes_widens_nothing() -> None:
    """Between passes only a SidecarSet the last pass did not plan at all is widened for: a changed one
    is served by the version planned until the next pass (an image alone never widens the webhook)."""
    rig = narrowed_rig()
    narrowed = rig.ours()
    writes = len(rig.api.writes("patch", MWC))
    assert between_passes(rig, lambda: bump(rig, "mesh", "proxy:2")) == narrowed
    assert len(rig.api.writes("patch", MWC)) == writes


def test_between_passes_nothing_is_widened_before_a_pass_has_written_its_condition() -> None:
    rig = Rig()
    rig.add("mesh")  # no pass yet: support unknown, the webhook serves every pod
    assert between_passes(rig, lambda: rig.add("late", app="late")) is None
    assert rig.api.writes() == []


def test_nothing_is_planned_until_support_is_known() -> None:
    rig = Rig()
    rig.add("mesh")

    async def go() -> None:
        await rig.sync.sync_once()

    asyncio.run(go())
    assert rig.policy(P0) is None
    assert rig.sync.routes["mesh"].why is Why.PENDING
    assert rig.ours() is None


@pytest.mark.parametrize("mode", [Mode.AUTO, Mode.POLICY])
def test_the_condition_grows_too_long_then_the_webhook_is_not_narrowed(
    mode: Mode, monkeypatch: pytest.MonkeyPatch
) -> None:
    from injector.policysync import narrowing

    monkeypatch.setattr(narrowing, "MAX_CONDITION_CHARS", 50)
    rig = Rig(mode=mode)
    caught_up: list[str] = []

    async def catch_up() -> None:
        caught_up.append("read")

    rig.sync.catch_up = catch_up
    rig.add("mesh")
    rig.run()
    assert rig.ours() is None
    assert rig.policy(P0) is not None
    assert not caught_up, "a condition too long to write narrows nothing: no quorum read for it"


def test_a_server_without_the_policy_api_gets_no_policy_and_no_probe() -> None:
    """Kubernetes 1.34 and 1.35 (without the beta turned on) list no MutatingAdmissionPolicy v1: the
    sync never probes, writes no policy and no condition, and every route says why."""
    rig = Rig()
    rig.sync.set_served(None, "this API server (Kubernetes v1.34.4) does not serve it")
    rig.add("mesh")
    rig.run()
    assert rig.sync.support.probe.calls == 0  # type: ignore[attr-defined]
    assert not rig.api.writes("create", POLICIES) and rig.policy(CANARY) is None
    assert rig.ours() is None, "the webhook serves every pod"
    route = rig.sync.routes["mesh"]
    assert (route.path, route.why) == (Path.WEBHOOK, Why.UNSUPPORTED)
    assert "v1.34.4" in route.message


def test_the_policy_api_appearing_under_a_running_sync_is_probed_and_used() -> None:
    """A control plane upgraded to 1.36 under a running manager: discovery lists the API, the next
    pass probes it and writes the policy, and the webhook is narrowed; it going away again (a
    rollback) sends everything back to the webhook."""
    rig = Rig()
    rig.sync.set_served(None, "not served")
    rig.add("mesh")
    rig.run()
    assert rig.policy(P0) is None and rig.sync.routes["mesh"].why is Why.UNSUPPORTED
    rig.sync.set_served(V1)
    assert rig.sync.dirty.is_set()
    rig.run()
    assert rig.sync.support.probe.calls == 1  # type: ignore[attr-defined]
    assert rig.policy(P0) is not None, "the probe never refused: one agreeing probe is enough"
    rig.now += 10
    rig.run()
    assert rig.sync.routes["mesh"].path is Path.POLICY
    rig.sync.set_served(None, "not served any more")
    rig.run()
    assert rig.ours() is None
    assert rig.sync.routes["mesh"].why is Why.UNSUPPORTED


def test_a_lucky_probe_while_a_kube_apiserver_does_not_enforce_policies_changes_nothing() -> None:
    """One kube-apiserver of three does not enforce policies (an upgrade under way); the probe is asked
    again every 30 s and one in a few thousand of its runs misses that server by chance. Such a run
    must not write a policy or narrow the webhook: only ENFORCED_ROUNDS agreeing runs in a row do."""
    no = "not every kube-apiserver enforces them"
    rig = Rig()
    rig.sync.support.probe = probe = ScriptedProbe(no, None, no, *[None] * ENFORCED_ROUNDS)
    rig.add("mesh")
    rig.run()
    assert rig.sync.routes["mesh"].why is Why.UNSUPPORTED
    for _ in range(1 + 1 + ENFORCED_ROUNDS - 1):  # the lucky run, a plain one, then all but the last agreeing
        rig.now += 30
        rig.run()
        assert rig.policy(P0) is None and rig.ours() is None, f"probe run {probe.calls}"
        assert rig.sync.routes["mesh"].why is Why.UNSUPPORTED
    rig.now += 30
    rig.run()
    assert probe.calls == 2 + 1 + ENFORCED_ROUNDS
    assert rig.policy(P0) is not None


def test_a_refusal_outlives_discovery_dropping_and_listing_the_api_again() -> None:
    """Discovery through a load balancer can drop the API and list it again during an upgrade; each
    listing is probed at once, but after a refusal it still takes ENFORCED_ROUNDS agreeing probes."""
    rig = Rig()
    rig.sync.support.probe = probe = ScriptedProbe("not every kube-apiserver enforces them", *[None] * ENFORCED_ROUNDS)
    rig.add("mesh")
    rig.run()
    rig.sync.set_served(None, "not listed")
    rig.run()
    rig.sync.set_served(V1)
    rig.run()
    assert probe.calls == 2 and rig.policy(P0) is None
    assert rig.sync.routes["mesh"].message == "not every kube-apiserver enforces them"
    for _ in range(ENFORCED_ROUNDS - 1):
        rig.now += 30
        rig.run()
    assert probe.calls == 1 + ENFORCED_ROUNDS and rig.policy(P0) is not None


def _served_by_policy_until_the_next_probe() -> Rig:
    """The SidecarSet `mesh` served by its policy (the webhook narrowed); the next probe will refuse."""
    return narrowed_rig(ScriptedProbe(None, "not every kube-apiserver enforces them"))


def test_leaving_policies_widens_the_webhook_first_and_deletes_them_once_it_has_settled() -> None:
    """Support lost (a kube-apiserver of an older minor joined): the webhook serves every pod at once,
    and the policy goes only `settle` seconds later, so no kube-apiserver, each following its own
    watches, sees the policy gone while the webhook is still narrowed."""
    rig = _served_by_policy_until_the_next_probe()
    rig.now = rig.sync.support.checked_at + 600  # the next probe
    rig.run()
    assert rig.ours() is None and rig.policy(P0) is not None and rig.binding(P0) is not None
    assert rig.sync.routes["mesh"].why is Why.UNSUPPORTED
    rig.now += 1.9
    rig.run()
    assert rig.policy(P0) is not None
    rig.now += 0.1
    rig.run()
    assert rig.policy(P0) is None and rig.binding(P0) is None


def test_a_late_watch_event_of_an_older_configuration_does_not_hide_the_narrowing_from_the_next_write() -> None:
    """Our patch's answer comes back before the watch delivers the version it replaced. Kept, that
    older version (no condition of ours) made the widening to every pod a no-op: the pass published
    the SidecarSet as webhook-served while the stored condition still left its pods out."""
    rig = _served_by_policy_until_the_next_probe()
    late = copy.deepcopy(rig.api.objects[MWC])
    for hook in late["webhooks"]:
        hook["matchConditions"] = [c for c in hook.get("matchConditions") or [] if c["name"] != CONDITION_NAME]
    late["metadata"]["resourceVersion"] = str(int(late["metadata"]["resourceVersion"]) - 1)
    rig.sync.on_webhook_config("MODIFIED", None, late)
    rig.now = rig.sync.support.checked_at + 600  # the next probe refuses
    rig.run()
    assert rig.sync.routes["mesh"].why is Why.UNSUPPORTED
    assert rig.ours() is None, "published as webhook-served while the stored condition still narrows"


def test_a_handed_over_policy_deleted_by_someone_else_while_the_webhook_widens_fails_nothing() -> None:
    """The watches run while a pass awaits its writes: a policy deleted meanwhile (by hand, or by
    another replica's last pass) is gone from what the pass planned with, and the pass goes on."""
    rig = Rig()
    rig.add("mesh")
    rig.run()
    rig.now += 10
    rig.run()
    assert rig.policy(P0) is not None
    moved = copy.deepcopy(rig.api.objects[f"{SS_PATH}/mesh"])
    moved["metadata"].setdefault("annotations", {})[names.ANN_INJECTION_PATH] = "webhook"

    def delete_on_widening(path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if path == MWC and rig.policy(P0) is not None:
            rig.api._store(f"{POLICIES}/{P0}", None)

    rig.api._store(f"{SS_PATH}/mesh", moved)
    rig.api.listeners.append(delete_on_widening)
    rig.run()
    assert rig.policy(P0) is None and '"web"' in (rig.ours() or ""), "the webhook serves mesh's pods"
    assert rig.sync.routes["mesh"].path is Path.WEBHOOK


def test_before_discovery_is_read_nothing_is_probed_and_the_webhook_serves_all() -> None:
    rig = Rig()
    rig.sync.support.discovered = False
    rig.add("mesh")
    rig.run()
    assert rig.sync.support.probe.calls == 0  # type: ignore[attr-defined]
    assert rig.sync.routes["mesh"].why is Why.PENDING and rig.ours() is None


# -- pacing (injector.policysync.pacing) -----------------------------------------------------------
def _members(rig: Rig) -> set[str]:
    policy = rig.policy(P0)
    return set() if policy is None else set(policy["metadata"]["annotations"][ANN_MEMBERS].replace(";", ",").split(","))


def test_a_burst_of_sidecarsets_is_written_in_one_policy_once_they_are_quiet() -> None:
    """Each arrival used to rewrite the same policy (1, 5, 30, then 60 groups, every one compiled
    again by the API server): the write waits until no SidecarSet has arrived for `quiet` seconds,
    while the webhook serves the new ones (the condition is widened at once)."""
    rig = Rig(pacing=(1.0, 1.0, 10.0))
    rig.add("mesh")
    rig.run()
    assert rig.policy(P0) is None and '"web"' in (rig.ours() or ""), "the webhook serves it meanwhile"
    assert rig.sync.write_at == rig.now + 1.0
    rig.now += 0.6
    rig.add("logs", app="logs")
    rig.run()
    assert rig.policy(P0) is None and '"logs"' in (rig.ours() or "")
    rig.now += 1.0
    rig.run()
    assert _members(rig) == {"mesh", "logs"}
    assert len(rig.api.writes(prefix=POLICIES + "/")) + len(rig.api.writes("create", POLICIES)) == 1


def test_sidecarsets_that_never_stop_arriving_are_written_after_max_quiet() -> None:
    rig = Rig(pacing=(1.0, 1.0, 10.0))
    for k in range(25):  # one every half second for 12.5 s
        rig.add(f"s{k}", app=f"a{k}")
        rig.run()
        if rig.policy(P0) is not None:
            break
        rig.now += 0.5
    assert rig.policy(P0) is not None
    assert rig.now == 110.0, "written max_quiet after the first write was held back"


def test_a_burst_waits_for_its_members_first_revisions_and_writes_its_policy_once() -> None:
    """A burst's first policy was written with the SidecarSets whose revision the controller had
    recorded, then again with the rest (two compiles of one policy): the write waits for them."""
    rig = Rig(pacing=(1.0, 1.0, 10.0))
    rig.add("mesh")
    logs = rig.add("logs", app="logs", status={})
    rig.now += 1.5  # quiet for longer than `quiet`
    rig.run()
    assert rig.policy(P0) is None, "written without logs, whose revision is not recorded yet"
    assert '"logs"' in (rig.ours() or "") and '"web"' in (rig.ours() or ""), "the webhook serves both meanwhile"
    rig.now += 2.0
    rig.api.put(f"{SS_PATH}/logs", {**logs, "status": {"latestRevision": "logs-1"}})  # a status write
    rig.run()
    assert _members(rig) == {"mesh", "logs"}, "written at once when the last revision is recorded"
    assert len(rig.api.writes("create", POLICIES)) == 1 and not rig.api.writes("update", POLICIES)


def test_a_revision_that_never_comes_holds_the_others_back_for_max_quiet_only() -> None:
    rig = Rig(pacing=(1.0, 1.0, 10.0))
    rig.add("mesh")
    rig.add("logs", app="logs", status={})  # the controller never records it
    while rig.policy(P0) is None and rig.now < 200.0:  # each pass at the time the last one asked for
        rig.now = max(rig.now, rig.sync.write_at or rig.now)
        rig.run()
    assert _members(rig) == {"mesh"} and rig.now == 110.0, "written max_quiet after the first hold"
    assert rig.sync.routes["logs"].why is Why.PENDING


def test_a_status_write_is_no_arrival_and_holds_nothing_back() -> None:
    rig = Rig(pacing=(1.0, 1.0, 10.0))
    rig.add("mesh")
    rig.run()
    rig.now += 1.5
    mesh = copy.deepcopy(rig.api.objects[f"{SS_PATH}/mesh"])
    mesh["status"] = {**mesh["status"], "matchedPods": 3}
    rig.api.put(f"{SS_PATH}/mesh", mesh)
    rig.run()
    assert _members(rig) == {"mesh"}


def test_a_status_write_plans_nothing_and_a_first_revision_plans_again() -> None:
    """During a burst the controller writes thousands of statuses (counts, conditions): each used to
    cost a whole pass, the policies' CEL assembled again. A recorded revision changes the plan."""
    rig = Rig()
    rig.add("mesh")
    rig.run()
    rig.sync.dirty.clear()
    mesh = copy.deepcopy(rig.api.objects[f"{SS_PATH}/mesh"])
    mesh["status"] = {**mesh["status"], "matchedPods": 3, "conditions": [{"type": "Ready", "status": "True"}]}
    rig.api.put(f"{SS_PATH}/mesh", mesh)
    assert rig.sync.models["mesh"].status["matchedPods"] == 3  # kept, and no pass asked for
    assert not rig.sync.dirty.is_set() and not rig.sync.widening.news.is_set()
    mesh = copy.deepcopy(mesh)
    mesh["status"]["latestRevision"] = "mesh-2"
    rig.api.put(f"{SS_PATH}/mesh", mesh)
    assert rig.sync.dirty.is_set()


def test_passes_no_arrival_asks_for_are_spaced_and_an_arrival_is_planned_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recorded revisions and our own writes' events wait for PASS_SPACING_SECONDS after the last
    pass; a new SidecarSet does not (the webhook must widen for it at once)."""
    monkeypatch.setattr(pacing, "PASS_SPACING_SECONDS", 60.0)  # far longer than the test runs
    rig = Rig()
    rig.add("mesh")

    async def until(check: Any) -> None:
        for _ in range(500):  # a loop with real waits: up to 5 s on a loaded machine
            if check():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("never happened")

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(rig.sync.run(stop))
        await until(lambda: rig.sync.passes == 1 and rig.policy(P0) is not None)
        for revision in range(2, 7):  # each changes the plan (a pod records the revision), none arrives
            mesh = copy.deepcopy(rig.api.objects[f"{SS_PATH}/mesh"])
            mesh["status"] = {"latestRevision": f"mesh-{revision}"}
            rig.api.put(f"{SS_PATH}/mesh", mesh)
        await asyncio.sleep(0.3)
        assert rig.sync.passes == 1 and rig.sync.dirty.is_set(), "held back: no arrival"
        rig.add("logs", app="logs")
        await until(lambda: rig.sync.passes == 2)
        condition = rig.ours()
        assert condition is not None and '"logs"' in condition
        stop.set()
        await loop

    asyncio.run(go())


def test_after_a_slow_write_the_next_waits_pace_times_as_long() -> None:
    """The API server took 10 s to store (compile) a policy: a change right after is written 10 s
    after that write ended (pace 1: it compiles our policies at most half of the time)."""
    rig = Rig(pacing=(1.0, 0.0, 10.0))
    rig.add("mesh")

    def slow_write(path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if path.startswith(POLICIES + "/") and old is None:
            rig.now += 10.0

    rig.api.listeners.insert(0, slow_write)
    rig.run()
    assert rig.policy(P0) is not None
    written_at = rig.now
    reconfigure(rig, "mesh", "debug")
    rig.run()
    assert "debug" not in str(rig.policy(P0)) and rig.sync.write_at == written_at + 10.0
    assert rig.sync.routes["mesh"].path is Path.POLICY, "the route of the version written is kept meanwhile"
    rig.now += 10.0
    rig.run()
    assert "debug" in str(rig.policy(P0))


def test_while_writes_wait_a_policy_whose_sidecarsets_are_all_gone_is_deleted_at_once() -> None:
    rig = Rig(pacing=(1.0, 0.0, 10.0))
    for k in range(61):  # one more group than a policy holds: two policies
        rig.add(f"s{k:02}", app=f"a{k}")
    rig.run()
    second = NAME_PREFIX + "1"
    policy = rig.policy(second)
    assert policy is not None and rig.policy(P0) is not None
    gone = policy["metadata"]["annotations"][ANN_MEMBERS].replace(";", ",").split(",")
    rig.sync.pacing.quiet = 1.0
    for name in gone:
        rig.api._store(f"{SS_PATH}/{name}", None)
    kept = next(f"s{k:02}" for k in range(61) if f"s{k:02}" not in gone)
    reconfigure(rig, kept, "debug")
    rig.run()
    assert rig.sync.write_at is not None, "the rewrite of the first policy waits for quiet"
    assert "debug" not in str(rig.policy(P0))
    assert rig.policy(second) is None and rig.binding(second) is None, "the orphan went at once"


def test_while_a_policy_write_waits_the_sidecarsets_of_those_written_are_published_served() -> None:
    """Two policies' worth of new SidecarSets, the first write slow: the second waits 10 s, and
    meanwhile the sets the first policy serves say so (PolicyInjection), the others that the
    webhook serves them until their policy is written."""
    rig = Rig(pacing=(1.0, 0.0, 10.0))
    for k in range(61):  # one more group than a policy holds: two policies
        rig.add(f"s{k:02}", app=f"a{k}")

    def slow_write(path: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if path.startswith(POLICIES + "/") and old is None:
            rig.now += 10.0

    rig.api.listeners.insert(0, slow_write)
    rig.run()
    second = NAME_PREFIX + "1"
    assert rig.policy(P0) is not None and rig.policy(second) is None and rig.sync.write_at is not None
    first = rig.policy(P0)
    assert first is not None
    served = set(first["metadata"]["annotations"][ANN_MEMBERS].replace(";", ",").split(","))
    routes = rig.sync.routes
    assert {n for n, r in routes.items() if r.path is Path.POLICY} == served
    waiting = {n: r for n, r in routes.items() if n not in served}
    assert len(waiting) == 61 - len(served) > 0
    assert {(r.path, r.why, r.message) for r in waiting.values()} == {
        (Path.WEBHOOK, Why.PENDING, f"the webhook serves it until MutatingAdmissionPolicy {second} is written")
    }
    assert rig.changed and set().union(*rig.changed) == set(routes), "the controller was told of every set"
    rig.now = rig.sync.write_at
    rig.run()
    assert rig.policy(second) is not None
    assert all(r.path is Path.POLICY for r in rig.sync.routes.values())


def versions(params: JsonObj | None) -> set[str]:
    """The versions of the CEL whose keys a parameter object holds."""
    return {k.split("/", 1)[0] for k in parameters.values(params)}


def test_a_new_version_of_the_cel_keeps_the_keys_of_the_one_before_until_it_has_settled() -> None:
    """A kube-apiserver enforces the CEL it compiled last, a second or more after the write, and reads
    the parameter object as it is: dropping the old version's keys with the write would make the old
    CEL fail (and refuse the pods) until then."""
    rig = Rig()
    rig.add("mesh")
    rig.run()
    rig.now += 10
    rig.run()
    (before,) = versions(rig.params(P0))
    reconfigure(rig, "mesh", "debug")
    bump(rig, "mesh", "proxy:2")
    rig.run()
    stored = rig.params(P0)
    assert stored is not None and len(versions(stored)) == 2 and before in versions(stored)
    assert parameters.values(stored)[f"{before}/mesh_image_proxy"] == "proxy:1", "the old version reads what it read"
    assert value_of_new(stored, before) == "proxy:2"
    writes = rig.api.writes()
    assert writes.index(f"{PARAMS}/{P0}") < writes.index(f"{POLICIES}/{P0}"), "the new keys before the CEL reading them"
    rig.now += 1.0
    rig.run()
    assert len(versions(rig.params(P0))) == 2, "kept while the new policy settles"
    rig.now += 10.0
    rig.run()
    after = versions(rig.params(P0))
    assert before not in after and len(after) == 1, "dropped once the new policy has settled"


def value_of_new(params: JsonObj, old: str) -> str:
    [found] = [
        v for k, v in parameters.values(params).items() if k.endswith("/mesh_image_proxy") and not k.startswith(old)
    ]
    return str(found)
