"""ControllerRevision history: data, hashes, every plan branch, pinning, and the collision path of sync."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberuntime import api
from kuberuntime.jsontypes import JsonObj
from sidecarsets.controller.history import sync_history
from sidecarsets.spec.hashing import spec_hash, spec_hash_without_image
from sidecarsets.spec.names import (
    REVISION_LABEL_SIDECARSET,
    SS_ANN_HASH,
    SS_ANN_HASH_WITHOUT_IMAGE,
    SS_LABEL_CUSTOM_VERSION,
)
from sidecarsets.spec.revisions import (
    HistoryPlan,
    PinnedRevisionNotFound,
    RevisionError,
    apply_revision,
    new_revision,
    plan_history,
    resolve_pinned,
    revision_data,
    revision_hash,
    revision_name,
    should_use_pinned,
)
from tests.kube import builders
from tests.kube.builders import container, model


def sidecarset(
    image: str = "proxy:1", *, name: str = "web", labels: dict[str, str] | None = None, **kw: Any
) -> JsonObj:
    """SidecarSet `web` (uid `uid-web`, labelled `team: mesh` unless `labels`) whose proxy runs `image`."""
    containers = [container("proxy", image)]
    return builders.sidecarset(
        name, containers=containers, labels=labels or {"team": "mesh"}, metadata={"uid": f"uid-{name}"}, **kw
    )


def history(*images: str, **spec: Any) -> list[JsonObj]:
    """Revisions 1..n of SidecarSet `web`, one per image, as the API would list them."""
    revs = []
    for i, image in enumerate(images, start=1):
        ss = sidecarset(image, **spec)
        name = revision_name("web", revision_hash(revision_data(model(ss))))
        revs.append(new_revision(model(ss), name=name, number=i))
    return revs


def name_of(rev: Mapping[str, Any]) -> str:
    return str(rev["metadata"]["name"])


def apply_plan(revs: list[JsonObj], plan: HistoryPlan) -> list[JsonObj]:
    """What the API would hold after `sync_history` carried `plan` out."""
    out = [copy.deepcopy(r) for r in revs if name_of(r) not in plan.delete]
    if plan.create is not None:
        out.append(plan.create)
    for r in out:
        if name_of(r) == plan.renumber:
            r["revision"] = plan.latest_number
        if plan.custom_version and name_of(r) == plan.latest_name:
            r["metadata"]["labels"][SS_LABEL_CUSTOM_VERSION] = plan.custom_version
    return out


# --- data, hash, name ---------------------------------------------------------------------------


def test_revision_data_takes_only_the_injected_fields_that_are_present() -> None:
    ss = sidecarset(
        initContainers=[{"name": "init", "image": "init:1"}],
        volumes=[{"name": "v", "emptyDir": {}}],
        patchPodMetadata=[{"annotations": {"a": "b"}}],
        imagePullSecrets=None,
        updateStrategy={"type": "RollingUpdate"},
    )
    data = revision_data(model(ss))
    assert data == {
        "spec": {
            "$patch": "replace",
            "volumes": [{"name": "v", "emptyDir": {}}],
            "containers": [{"name": "proxy", "image": "proxy:1"}],
            "initContainers": [{"name": "init", "image": "init:1"}],
            "patchPodMetadata": [{"annotations": {"a": "b"}}],
        }
    }
    data["spec"]["containers"][0]["image"] = "changed"
    assert ss["spec"]["containers"][0]["image"] == "proxy:1", "the data is a copy"
    assert revision_data(model({"metadata": {"name": "x"}})) == {"spec": {"$patch": "replace"}}


def test_revision_hash_is_short_stable_and_key_order_independent() -> None:
    a = {"spec": {"containers": [{"name": "p", "image": "i"}], "$patch": "replace"}}
    b = {"spec": {"$patch": "replace", "containers": [{"image": "i", "name": "p"}]}}
    assert revision_hash(a) == revision_hash(b)
    assert revision_hash(a) != revision_hash({"spec": {"containers": [{"name": "p", "image": "j"}]}})
    assert revision_hash(a, 1) != revision_hash(a, 0)
    assert revision_hash(a) == revision_hash(a, 0)
    assert revision_name("web", revision_hash(a)) == f"web-{revision_hash(a)}"


@given(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=4), st.integers(0, 50))
def test_revision_hash_is_ten_name_safe_characters(data: dict[str, str], collisions: int) -> None:
    h = revision_hash({"spec": data}, collisions)
    assert len(h) == 10
    assert set(h) <= set("bcdfghjklmnpqrstvwxz2456789")


# --- plan branches ------------------------------------------------------------------------------


def test_first_revision_is_created_with_number_one_labels_owner_and_hashes() -> None:
    ss = sidecarset(labels={"team": "mesh", SS_LABEL_CUSTOM_VERSION: "v1"})
    ss["metadata"]["annotations"] = {"note": "x", "kubectl.kubernetes.io/last-applied-configuration": "{}"}
    plan = plan_history(model(ss), [], in_use=set())
    assert plan.action == "create"
    assert plan.create is not None
    rev = plan.create
    assert plan.latest_name == name_of(rev) == revision_name("web", revision_hash(revision_data(model(ss))))
    assert plan.latest_number == rev["revision"] == 1
    assert rev["data"] == revision_data(model(ss))
    assert rev["metadata"]["labels"] == {
        "team": "mesh",
        REVISION_LABEL_SIDECARSET: "web",
        SS_LABEL_CUSTOM_VERSION: "v1",
    }
    assert rev["metadata"]["annotations"] == {
        "note": "x",
        SS_ANN_HASH: spec_hash(ss["spec"]),
        SS_ANN_HASH_WITHOUT_IMAGE: spec_hash_without_image(ss["spec"]),
    }
    assert rev["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "sidecarctl.io/v1alpha1",
            "kind": "SidecarSet",
            "name": "web",
            "uid": "uid-web",
            "controller": True,
        }
    ]
    assert plan.custom_version is None, "the new revision already carries the label"
    assert plan.delete == () and plan.collision_count == 0


def test_unchanged_spec_reuses_the_newest_revision() -> None:
    revs = history("proxy:1", "proxy:2")
    plan = plan_history(model(sidecarset("proxy:2", updateStrategy={"paused": True})), revs, in_use=set())
    assert plan.action == "reuse"
    assert (plan.latest_name, plan.latest_number) == (name_of(revs[1]), 2)
    assert plan.create is None and plan.renumber is None and plan.delete == ()


def test_spec_equal_to_an_older_revision_rolls_back_by_renumbering_it() -> None:
    revs = history("proxy:1", "proxy:2", "proxy:3")
    plan = plan_history(model(sidecarset("proxy:1")), list(reversed(revs)), in_use=set())
    assert plan.action == "rollback"
    assert plan.renumber == name_of(revs[0]) == plan.latest_name
    assert plan.latest_number == 4
    assert plan.create is None


def test_changed_spec_creates_the_next_revision() -> None:
    revs = history("proxy:1", "proxy:2")
    plan = plan_history(model(sidecarset("proxy:3")), revs, in_use=set())
    assert plan.action == "create" and plan.create is not None
    assert plan.latest_number == plan.create["revision"] == 3
    assert plan.latest_name not in {name_of(r) for r in revs}


def test_name_taken_by_different_data_bumps_the_collision_count() -> None:
    ss = sidecarset("proxy:new", status={"collisionCount": 2})
    squatter = history("proxy:1")[0]
    squatter["metadata"]["name"] = revision_name("web", revision_hash(revision_data(model(ss)), 2))
    plan = plan_history(model(ss), [squatter], in_use=set())
    assert plan.collision_count == 3
    assert plan.latest_name == revision_name("web", revision_hash(revision_data(model(ss)), 3))


def test_truncation_deletes_oldest_first_keeping_latest_and_limit() -> None:
    revs = history(*(f"proxy:{i}" for i in range(1, 8)))  # 7 stored
    plan = plan_history(model(sidecarset("proxy:8", revisionHistoryLimit=5)), revs, in_use=set())
    assert plan.delete == tuple(name_of(r) for r in revs[:3])
    assert len(apply_plan(revs, plan)) == 5
    assert plan.over_limit == 0


def test_truncation_spares_revisions_in_use_and_the_pinned_ones() -> None:
    revs = history(*(f"proxy:{i}" for i in range(1, 8)), labels={"team": "mesh"})
    revs[2]["metadata"]["labels"][SS_LABEL_CUSTOM_VERSION] = "canary"
    revs[1]["metadata"]["labels"][SS_LABEL_CUSTOM_VERSION] = "canary"  # older: not the pinned one
    ss = sidecarset(
        "proxy:8",
        revisionHistoryLimit=4,
        injectionStrategy={"revision": {"customVersion": "canary"}},
    )
    plan = plan_history(model(ss), revs, in_use={name_of(revs[0])})
    # 8 revisions, limit 4: delete 4, skipping #1 (a pod uses it) and #3 (pinned by customVersion).
    assert plan.delete == (name_of(revs[1]), name_of(revs[3]), name_of(revs[4]), name_of(revs[5]))

    pinned_by_name = sidecarset(
        "proxy:8", revisionHistoryLimit=1, injectionStrategy={"revision": {"revisionName": name_of(revs[0])}}
    )
    plan = plan_history(model(pinned_by_name), revs, in_use=set())
    assert name_of(revs[0]) not in plan.delete
    assert plan.delete == tuple(name_of(r) for r in revs[1:])


def test_truncation_reports_what_it_could_not_delete() -> None:
    revs = history("proxy:1", "proxy:2", "proxy:3")
    plan = plan_history(model(sidecarset("proxy:3", revisionHistoryLimit=1)), revs, in_use={name_of(r) for r in revs})
    assert plan.delete == ()
    assert plan.over_limit == 2


def test_history_limit_is_at_least_one_and_defaults_to_ten() -> None:
    revs = history(*(f"proxy:{i}" for i in range(1, 12)))  # 11
    assert plan_history(model(sidecarset("proxy:11")), revs, in_use=set()).delete == (name_of(revs[0]),)
    plan = plan_history(model(sidecarset("proxy:11", revisionHistoryLimit=0)), revs, in_use=set())
    assert plan.delete == tuple(name_of(r) for r in revs[:-1]), "only the latest is kept"


def test_rolled_back_revision_is_newest_so_it_is_not_truncated() -> None:
    revs = history("proxy:1", "proxy:2", "proxy:3")
    plan = plan_history(model(sidecarset("proxy:1", revisionHistoryLimit=2)), revs, in_use=set())
    assert plan.renumber == name_of(revs[0])
    assert plan.delete == (name_of(revs[1]),)


def test_custom_version_label_is_put_on_a_reused_latest_revision() -> None:
    revs = history("proxy:1")
    plan = plan_history(model(sidecarset("proxy:1", labels={SS_LABEL_CUSTOM_VERSION: "v2"})), revs, in_use=set())
    assert plan.action == "reuse"
    assert plan.custom_version == "v2"
    labelled = apply_plan(revs, plan)
    assert plan_history(
        model(sidecarset("proxy:1", labels={SS_LABEL_CUSTOM_VERSION: "v2"})), labelled, in_use=set()
    ) == (HistoryPlan(latest_name=name_of(revs[0]), latest_number=1, collision_count=0))


@settings(max_examples=60, deadline=None)
@given(
    images=st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), min_size=1, max_size=25),
    limit=st.integers(min_value=0, max_value=6),
)
def test_history_invariants_over_any_sequence_of_applies(images: list[str], limit: int) -> None:
    revs: list[JsonObj] = []
    for image in images:
        ss = sidecarset(image, revisionHistoryLimit=limit)
        plan = plan_history(model(ss), revs, in_use=set())
        revs = apply_plan(revs, plan)
        numbers = [r["revision"] for r in revs]
        assert len(set(numbers)) == len(numbers), "revision numbers stay unique"
        latest = max(revs, key=lambda r: r["revision"])
        assert name_of(latest) == plan.latest_name
        assert latest["data"] == revision_data(model(ss)), "the newest revision is the current spec"
        assert len(revs) <= max(1, limit)
        assert len({name_of(r) for r in revs}) == len(revs)
        datas = [r["data"] for r in revs]
        assert all(datas.count(d) == 1 for d in datas), "one revision per distinct spec"


# --- pinning ------------------------------------------------------------------------------------


def test_resolve_pinned_by_name_and_by_highest_custom_version() -> None:
    revs = history("proxy:1", "proxy:2", "proxy:3")
    for r in revs[:2]:
        r["metadata"]["labels"][SS_LABEL_CUSTOM_VERSION] = "stable"
    other = history("proxy:9")[0]
    other["metadata"]["labels"].update({REVISION_LABEL_SIDECARSET: "other", SS_LABEL_CUSTOM_VERSION: "stable"})
    other["revision"] = 99
    assert resolve_pinned(model(sidecarset()), revs) is None
    by_name = sidecarset(injectionStrategy={"revision": {"revisionName": name_of(revs[0])}})
    assert resolve_pinned(model(by_name), revs) == revs[0]
    by_version = sidecarset(injectionStrategy={"revision": {"customVersion": "stable"}})
    assert resolve_pinned(model(by_version), [*revs, other]) == revs[1], "highest .revision of this SidecarSet"


def test_resolve_pinned_raises_when_the_pin_matches_nothing() -> None:
    revs = history("proxy:1")
    with pytest.raises(PinnedRevisionNotFound, match="revisionName 'web-nope'"):
        resolve_pinned(model(sidecarset(injectionStrategy={"revision": {"revisionName": "web-nope"}})), revs)
    with pytest.raises(PinnedRevisionNotFound, match="customVersion 'v9'"):
        resolve_pinned(model(sidecarset(injectionStrategy={"revision": {"customVersion": "v9"}})), revs)
    with pytest.raises(RevisionError, match=r"revision\.policy"):
        resolve_pinned(
            model(sidecarset(injectionStrategy={"revision": {"customVersion": "v", "policy": "Never"}})), revs
        )


def test_apply_revision_restores_injected_fields_and_keeps_the_rest() -> None:
    old = sidecarset("proxy:1", volumes=[{"name": "old", "emptyDir": {}}])
    rev = new_revision(model(old), name="web-abc", number=1)
    current = sidecarset(
        "proxy:2",
        initContainers=[{"name": "init", "image": "init:2"}],
        updateStrategy={"type": "RollingUpdate", "partition": 1},
        status={"latestRevision": "web-new"},
    )
    before = copy.deepcopy(current)
    out = apply_revision(model(current), rev)
    assert current == before, "input untouched"
    assert out["spec"]["containers"] == [{"name": "proxy", "image": "proxy:1"}]
    assert out["spec"]["volumes"] == [{"name": "old", "emptyDir": {}}]
    assert "initContainers" not in out["spec"], "fields absent from the revision are removed"
    assert out["spec"]["selector"] == current["spec"]["selector"]
    assert out["spec"]["updateStrategy"] == current["spec"]["updateStrategy"]
    assert out["metadata"]["annotations"][SS_ANN_HASH] == spec_hash(old["spec"])
    assert out["status"]["latestRevision"] == "web-abc"
    # Without hash annotations on the revision they are computed from the restored spec.
    del rev["metadata"]["annotations"]
    assert apply_revision(model(current), rev)["metadata"]["annotations"][SS_ANN_HASH_WITHOUT_IMAGE] == (
        spec_hash_without_image(old["spec"])
    )
    with pytest.raises(RevisionError, match=r"data\.spec"):
        apply_revision(model(current), {"metadata": {"name": "broken"}, "data": {}})


PIN = {"revision": {"revisionName": "web-old"}}


@pytest.mark.parametrize(
    ("spec", "labels", "rand", "expected"),
    [
        ({}, {}, 0.0, False),
        ({"injectionStrategy": {"paused": True}}, {}, 0.0, False),
        ({"injectionStrategy": PIN}, {}, 0.99, True),
        ({"injectionStrategy": {"revision": {"revisionName": "web-old", "policy": "Always"}}}, {}, 0.5, True),
        (
            {"injectionStrategy": {"revision": {"customVersion": "v1", "policy": "Partial"}}, "updateStrategy": {}},
            {},
            0.0,
            False,
        ),
        (
            {
                "injectionStrategy": {"revision": {"customVersion": "v1", "policy": "Partial"}},
                "updateStrategy": {"paused": True},
            },
            {},
            0.9,
            True,
        ),
        (
            {
                "injectionStrategy": {"revision": {"customVersion": "v1", "policy": "Partial"}},
                "updateStrategy": {"selector": {"matchLabels": {"canary": "true"}}},
            },
            {"canary": "false"},
            0.9,
            True,
        ),
        (
            {
                "injectionStrategy": {"revision": {"customVersion": "v1", "policy": "Partial"}},
                "updateStrategy": {"selector": {"matchLabels": {"canary": "true"}}},
            },
            {"canary": "true"},
            0.0,
            False,
        ),
        (
            {
                "injectionStrategy": {"revision": {"customVersion": "v1", "policy": "Partial"}},
                "updateStrategy": {"partition": 3},
            },
            {},
            0.0,
            False,
        ),
        (
            {
                "injectionStrategy": {"revision": {"customVersion": "v1", "policy": "Partial"}},
                "updateStrategy": {"partition": "30%"},
            },
            {},
            0.29,
            True,
        ),
        (
            {
                "injectionStrategy": {"revision": {"customVersion": "v1", "policy": "Partial"}},
                "updateStrategy": {"partition": "30%"},
            },
            {},
            0.30,
            False,
        ),
    ],
)
def test_should_use_pinned(spec: JsonObj, labels: dict[str, str], rand: float, expected: bool) -> None:
    assert should_use_pinned(model(sidecarset(**spec)), pod_labels=labels, rand=rand) is expected


def test_should_use_pinned_names_bad_fields() -> None:
    partial = {"revision": {"customVersion": "v1", "policy": "Partial"}}
    with pytest.raises(RevisionError, match=r"spec\.updateStrategy\.partition"):
        should_use_pinned(
            model(sidecarset(injectionStrategy=partial, updateStrategy={"partition": "lots"})), pod_labels={}, rand=0
        )
    with pytest.raises(RevisionError, match=r"spec\.injectionStrategy\.revision\.revisionName"):
        should_use_pinned(model(sidecarset(injectionStrategy={"revision": {"revisionName": 7}})), pod_labels={}, rand=0)


def test_bad_input_is_named() -> None:
    with pytest.raises(RevisionError, match=r"spec\.revisionHistoryLimit"):
        plan_history(model(sidecarset(revisionHistoryLimit="5")), [], in_use=set())
    with pytest.raises(RevisionError, match=r"metadata\.name"):
        plan_history(model({"spec": {}}), [], in_use=set())
    bad = history("proxy:1")[0]
    bad["revision"] = "one"
    with pytest.raises(RevisionError, match="revision must be an integer"):
        plan_history(model(sidecarset()), [bad], in_use=set())


# --- sync_history against an in-memory API ------------------------------------------------------


class FakeRevisions:
    def __init__(self, objects: list[JsonObj]) -> None:
        self.objects = {name_of(o): copy.deepcopy(o) for o in objects}
        self.calls: list[str] = []

    async def get(self, path: str, *, params: api.Params | None = None) -> JsonObj:
        self.calls.append(f"GET {path.rsplit('/', 1)[-1]}")
        if params:
            key, _, value = str(params["labelSelector"]).partition("=")
            items = [o for o in self.objects.values() if o["metadata"].get("labels", {}).get(key) == value]
            return {"items": copy.deepcopy(items)}
        name = path.rsplit("/", 1)[-1]
        if name not in self.objects:
            raise api.NotFound(404, "NotFound", name)
        return copy.deepcopy(self.objects[name])

    async def create(self, path: str, body: JsonObj, *, params: api.Params | None = None) -> JsonObj:
        name = name_of(body)
        self.calls.append(f"POST {name}")
        if name in self.objects:
            raise api.Conflict(409, "AlreadyExists", f"{name} already exists")
        self.objects[name] = copy.deepcopy(body)
        return copy.deepcopy(body)

    async def patch(
        self, path: str, body: Any, *, patch_type: api.PatchType = "merge", params: api.Params | None = None
    ) -> JsonObj:
        name = path.rsplit("/", 1)[-1]
        self.calls.append(f"PATCH {name}")
        obj = self.objects[name]
        if "revision" in body:
            obj["revision"] = body["revision"]
        obj["metadata"].setdefault("labels", {}).update(body.get("metadata", {}).get("labels", {}))
        return copy.deepcopy(obj)

    async def update(self, path: str, body: JsonObj, *, params: api.Params | None = None) -> JsonObj:
        raise AssertionError("revisions are never replaced whole")

    async def delete(self, path: str, *, params: api.Params | None = None) -> Any:
        name = path.rsplit("/", 1)[-1]
        self.calls.append(f"DELETE {name}")
        if self.objects.pop(name, None) is None:
            raise api.NotFound(404, "NotFound", name)
        return {}


def test_sync_history_rehashes_when_an_unlisted_object_holds_the_name() -> None:
    ss = sidecarset("proxy:2")
    planned = revision_name("web", revision_hash(revision_data(model(ss))))
    squatter = history("proxy:1")[0]
    squatter["metadata"]["name"] = planned
    squatter["metadata"]["labels"] = {}  # not listed by the label selector
    api = FakeRevisions([squatter])
    latest, collisions = asyncio.run(sync_history(api, model(ss), namespace="sys", in_use=set()))
    assert collisions == 1
    assert latest == revision_name("web", revision_hash(revision_data(model(ss)), 1))
    assert api.objects[latest]["data"] == revision_data(model(ss))
    assert api.objects[planned]["data"] != revision_data(model(ss)), "the other object is left alone"


def test_sync_history_adopts_an_equal_unlisted_revision_and_carries_out_plans() -> None:
    ss = sidecarset("proxy:1")
    orphan = history("proxy:1")[0]
    del orphan["metadata"]["ownerReferences"]
    orphan["metadata"]["labels"] = {}
    api = FakeRevisions([orphan])
    latest, collisions = asyncio.run(sync_history(api, model(ss), namespace="sys", in_use=set()))
    assert (latest, collisions) == (name_of(orphan), 0)

    api = FakeRevisions(history("proxy:1", "proxy:2", "proxy:3"))
    first = name_of(history("proxy:1")[0])
    latest, _ = asyncio.run(
        sync_history(api, model(sidecarset("proxy:1", revisionHistoryLimit=2)), namespace="s", in_use=set())
    )
    assert latest == first
    assert api.objects[first]["revision"] == 4
    assert len(api.objects) == 2
    assert not any(c.startswith("POST") for c in api.calls), "a rollback creates nothing"


def test_sync_history_ignores_revisions_owned_by_another_incarnation() -> None:
    stale = history("proxy:1")[0]
    stale["metadata"]["ownerReferences"][0]["uid"] = "uid-of-a-deleted-web"
    api = FakeRevisions([stale])
    latest, collisions = asyncio.run(sync_history(api, model(sidecarset("proxy:1")), namespace="s", in_use=set()))
    # Same name and data, but another owner: its GC is pending, so a fresh name is used.
    assert collisions == 1 and latest != name_of(stale)
