"""LabelIndex: an informer's objects grouped by one label, through adds, relabels and deletes."""

from __future__ import annotations

from kuberuntime.informer import LabelIndex
from kuberuntime.jsontypes import JsonObj

LABEL = "sidecarctl.io/sidecarset-name"


def rev(name: str, owner: str | None, rv: str = "1") -> JsonObj:
    labels = {} if owner is None else {LABEL: owner}
    return {"metadata": {"name": name, "namespace": "sys", "labels": labels, "resourceVersion": rv}}


def names(index: LabelIndex, value: str) -> list[str]:
    return sorted(o["metadata"]["name"] for o in index.of(value))


def test_objects_are_grouped_by_their_label_value() -> None:
    index = LabelIndex(LABEL)
    for obj in (rev("a-1", "a"), rev("a-2", "a"), rev("b-1", "b"), rev("loose", None)):
        index.handle("ADDED", None, obj)
    assert names(index, "a") == ["a-1", "a-2"]
    assert names(index, "b") == ["b-1"]
    assert index.of("c") == []


def test_a_modified_object_is_replaced_and_a_relabelled_one_moves() -> None:
    index = LabelIndex(LABEL)
    first = rev("a-1", "a")
    index.handle("ADDED", None, first)
    newer = rev("a-1", "a", rv="2")
    index.handle("MODIFIED", first, newer)
    assert index.of("a") == [newer]
    moved = rev("a-1", "b", rv="3")
    index.handle("MODIFIED", newer, moved)
    assert index.of("a") == []
    assert index.of("b") == [moved]
    unlabelled = rev("a-1", None, rv="4")
    index.handle("MODIFIED", moved, unlabelled)
    assert index.of("b") == []


def test_a_deleted_object_leaves_its_group() -> None:
    index = LabelIndex(LABEL)
    a1, a2 = rev("a-1", "a"), rev("a-2", "a")
    index.handle("ADDED", None, a1)
    index.handle("ADDED", None, a2)
    index.handle("DELETED", a1, None)
    assert names(index, "a") == ["a-2"]
    index.handle("DELETED", a2, None)
    assert index.of("a") == []
