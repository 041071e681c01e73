"""The store the webhook reads: each snapshot keeps the namespaces it was built with, whatever follows."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sidecarsets import store
from sidecarsets.store import TemplateStore


def labels(name: str, **extra: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name, **extra}


@pytest.mark.parametrize("seed", range(5))
def test_every_snapshot_shows_the_namespaces_of_its_moment_across_folds(seed: int) -> None:
    rng = random.Random(seed)
    s = TemplateStore()
    truth: dict[str, dict[str, str]] = {}
    kept: list[tuple[store.Snapshot, dict[str, dict[str, str]]]] = []
    # Enough changes for several folds (store.FOLD_AFTER) between and around the snapshots taken.
    for step in range(store.FOLD_AFTER * 4):
        name = f"ns{rng.randrange(300)}"
        if name in truth and rng.random() < 0.3:
            s.on_namespace("DELETED", truth.pop(name), None)
        else:
            new = labels(name, team=f"t{step}")
            s.on_namespace("MODIFIED" if name in truth else "ADDED", truth.get(name), new)
            truth[name] = new
        if rng.random() < 0.1:
            kept.append((s.snapshot, {k: dict(v) for k, v in truth.items()}))
    kept.append((s.snapshot, truth))
    for snap, then in kept:
        seen = snap.namespaces
        assert dict(seen) == then and len(seen) == len(then) and sorted(seen) == sorted(then)
        for k in range(300):
            name = f"ns{k}"
            assert (name in seen) == (name in then)
            assert seen.get(name) == then.get(name)
            if name not in then:
                with pytest.raises(KeyError):
                    seen[name]


def test_a_namespace_change_reuses_the_sidecarsets_index_and_the_objects_published_before() -> None:
    s = TemplateStore()
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "web"}},
        "containers": [{"name": "proxy", "image": "proxy:1"}],
    }
    obj: dict[str, Any] = {
        "apiVersion": "sidecarctl.io/v1alpha1",
        "kind": "SidecarSet",
        "metadata": {"name": "mesh", "creationTimestamp": "2024-01-01T00:00:00Z"},
        "spec": spec,
    }
    s.on_sidecarset("ADDED", None, obj)
    first = s.snapshot
    s.on_namespace("ADDED", None, labels("shop"))
    second = s.snapshot
    assert second is not first and second.namespaces.get("shop") == labels("shop")
    assert second.index is first.index and second.objects is first.objects and second.revisions is first.revisions
    assert "shop" not in first.namespaces
    s.on_sidecarset("MODIFIED", obj, {**obj, "spec": {**spec, "paused": True}})
    third = s.snapshot
    assert third.index is not second.index and third.objects is not second.objects
    assert third.objects["mesh"]["spec"]["paused"] is True and "paused" not in second.objects["mesh"]["spec"]
