"""Pods decoded without their managedFields: the same object otherwise, whatever their strings hold,
and decoded whole wherever the array does not end with the metadata."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberuntime import jsontypes
from kuberuntime.kubeapi import core_resource_of

# Text a cut looking for `]},"spec":` might trip on, were it read inside strings.
TRICKY = ['"', "\\", ']},"spec":', '],"', '"metadata":', "}", "]", '\\"', "{", "\n", "é", '"managedFields":[']


def entry(manager: str, keys: list[str], subresource: str | None = None) -> dict[str, Any]:
    """A managed-fields entry in kube-apiserver's field order."""
    out: dict[str, Any] = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-12-08T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {"f:labels": {".": {}, **{f"f:{k}": {} for k in keys}}},
            "f:spec": {"f:containers": {f'k:{{"name":"{k}"}}': {".": {}, "f:image": {}} for k in keys}},
        },
    }
    if subresource:
        out["subresource"] = subresource
    return out


def pod(name: str, strings: list[str], *, managed: bool = True) -> dict[str, Any]:
    """A pod as kube-apiserver encodes it: ObjectMeta's fields in its Go struct's order, managedFields last."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": "u-" + name,
        "resourceVersion": "7",
        "creationTimestamp": "2026-12-08T00:00:00Z",
        "labels": {f"l{i}": s for i, s in enumerate(strings)},
        "annotations": {f"a{i}": s for i, s in enumerate(strings)},
        "finalizers": ["example.com/keep"],  # without managedFields, the metadata ends with an array
    }
    if managed:
        meta["managedFields"] = [entry("".join(strings) or "m", strings), entry("kubelet", strings, "status")]
    containers = [{"name": s or "c", "image": s, "args": [s, s]} for s in strings] or [{"name": "c", "image": "i"}]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {"containers": containers, "nodeName": "n"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "message": "]},"}]},
    }


def unmanaged(obj: Any) -> Any:
    """`obj` with every object's metadata.managedFields removed, as a cut should leave it."""
    out = copy.deepcopy(obj)
    for o in out.get("items") or [out.get("object") or out]:
        o["metadata"].pop("managedFields", None)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(TRICKY), st.text(max_size=12)), max_size=6))
def test_a_pod_loses_its_managed_fields_and_nothing_else_whatever_its_strings_hold(strings: list[str]) -> None:
    event = {"type": "MODIFIED", "object": pod("p", strings)}
    raw = orjson.dumps(event)
    assert len(jsontypes.without_managed_fields(raw)) < len(raw), "nothing was cut"
    assert jsontypes.loads_without_managed_fields(raw) == unmanaged(event)
    items = [pod(f"p{i}", strings) for i in range(3)]
    listed = {"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": items}
    assert jsontypes.loads_without_managed_fields(orjson.dumps(listed)) == unmanaged(listed)


def test_an_object_whose_metadata_does_not_end_with_its_managed_fields_is_decoded_whole() -> None:
    """Sorted keys (an object encoded from a map, as an unstructured one is) put other metadata fields
    after managedFields; a ConfigMap has no spec after its metadata. Neither is cut, not even across
    the next item of a list."""
    sorted_keys = orjson.dumps(pod("p", ["a"]), option=orjson.OPT_SORT_KEYS)
    assert jsontypes.without_managed_fields(sorted_keys) is sorted_keys
    assert jsontypes.loads_without_managed_fields(sorted_keys) == orjson.loads(sorted_keys)

    config_map = {"kind": "ConfigMap", "metadata": {"name": "c", "managedFields": [entry("m", ["a"])]}, "data": {}}
    listed = {"items": [config_map, pod("p", ["a"], managed=False)]}
    raw = orjson.dumps(listed)
    assert jsontypes.without_managed_fields(raw) is raw
    assert jsontypes.loads_without_managed_fields(raw) == listed

    # An array after managedFields ends where the metadata does: its `],"` is not the metadata's end.
    later = b'{"metadata":{"name":"p","managedFields":[{"manager":"m"}],"uid":"u","finalizers":["x"]},"spec":{}}'
    assert jsontypes.without_managed_fields(later) is later
    assert jsontypes.loads_without_managed_fields(later)["metadata"]["finalizers"] == ["x"]


def test_a_cut_that_does_not_parse_falls_back_to_the_whole_text_and_bad_json_still_raises() -> None:
    broken = b'{"metadata":{"name":"p","managedFields":[{"manager":"m"}]},"spec":{"x":1}'  # no final brace
    try:
        jsontypes.loads_without_managed_fields(broken)
    except orjson.JSONDecodeError:
        pass
    else:
        raise AssertionError("invalid JSON decoded")
    odd = b'{"metadata":{"name":"p","managedFields":[{"manager":"m"}]},"spec":{"x":1},"extra":}'
    assert jsontypes.without_managed_fields(odd) != odd
    try:
        jsontypes.loads_without_managed_fields(odd)
    except orjson.JSONDecodeError:
        pass
    else:
        raise AssertionError("invalid JSON decoded")


def test_only_paths_that_answer_with_core_objects_name_their_resource() -> None:
    """A pod's log or proxy answers with what its container sends, and another API group may have a
    kind of the same name stored as schemaless JSON: neither may lose a field called managedFields."""
    assert core_resource_of("/api/v1/pods") == "pods"
    assert core_resource_of("/api/v1/namespaces/ns/pods") == "pods"
    assert core_resource_of("/api/v1/namespaces/ns/pods/p") == "pods"
    assert core_resource_of("/api/v1/namespaces/ns/pods/p/status") == "pods"
    assert core_resource_of("/api/v1/namespaces/ns/pods/p/resize") == "pods"
    assert core_resource_of("/api/v1/namespaces/ns") == "namespaces"
    assert core_resource_of("/api/v1/namespaces") == "namespaces"
    assert core_resource_of("/api/v1/namespaces/pods") == "namespaces"  # a namespace called pods
    for elsewhere in (
        "/api/v1/namespaces/ns/pods/p/log",
        "/api/v1/namespaces/ns/pods/p/proxy/metrics",
        "/api/v1/namespaces/ns/pods/p/eviction",
        "/apis/x.io/v1/pods",
        "/apis/metrics.k8s.io/v1beta1/namespaces/ns/pods/p",
        "/version",
    ):
        assert core_resource_of(elsewhere) == "", elsewhere
