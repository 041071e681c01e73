"""Properties of the engine over random pods and SidecarSets.

Whatever the inputs: the input is untouched, everything returned is JSON and shares no object
with the inputs, the patch applies and gives a pod without duplicate names, app containers keep
their order, and injecting the result again changes nothing.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from injector.engine import engine
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

NOW = "2024-01-01T00:00:00Z"
ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}
APP_POOL = ["app", "web", "worker", "init", "proxy"]
SIDECAR_POOL = ["proxy", "log", "agent", "setup", "metrics", "dns", "app"]
VOLUMES = ["data", "logs", "certs"]

_env = st.lists(
    st.builds(
        lambda n, v: {"name": n, "value": v},
        st.sampled_from(["A", "B", "POD", names.ENV_IS_INJECTED]),
        st.sampled_from(["1", "true"]),
    ),
    max_size=3,
    unique_by=lambda e: e["name"],
)
_mounts = st.lists(
    st.builds(
        lambda n, p, sub: {"name": n, "mountPath": p, **({"subPathExpr": "$(POD)"} if sub else {})},
        st.sampled_from(VOLUMES),
        st.sampled_from(["/a", "/b", "/c"]),
        st.booleans(),
    ),
    max_size=2,
    unique_by=lambda m: m["mountPath"],
)


def _container(name: str, env: list[dict[str, str]], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    fields = {"env": env, "volumeMounts": mounts}
    return builders.container(name, f"{name}:1", **{k: v for k, v in fields.items() if v})


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    all_names = draw(st.lists(st.sampled_from(APP_POOL), min_size=1, max_size=4, unique=True))
    split = draw(st.integers(1, len(all_names)))
    containers = [_container(n, draw(_env), draw(_mounts)) for n in all_names[:split]]
    inits = [_container(n, [], []) for n in all_names[split:]]
    labels = {"app": draw(st.sampled_from(["web", "web", "web", "db"]))}
    annotations = None
    if draw(st.booleans()):
        annotations = draw(
            st.dictionaries(
                st.sampled_from([names.ANN_DEFAULT_CONTAINER, "m", "x/y"]), st.sampled_from(["app", "{}", "z"])
            )
        )
    spec: dict[str, Any] = {}
    empty_init_list = draw(st.booleans())
    if inits or empty_init_list:
        spec["initContainers"] = inits
    if draw(st.booleans()):
        spec["volumes"] = [{"name": v, "emptyDir": {}} for v in draw(st.lists(st.sampled_from(VOLUMES), unique=True))]
    if draw(st.booleans()):
        spec["imagePullSecrets"] = [{"name": "reg"}]
    return builders.pod("p", labels=labels, annotations=annotations, containers=containers, **spec)


@st.composite
def sidecarsets(draw: st.DrawFn) -> list[SidecarSet]:
    out: list[SidecarSet] = []
    for i in range(draw(st.integers(1, 3))):
        sidecar_names = draw(st.lists(st.sampled_from(SIDECAR_POOL), min_size=1, max_size=3, unique=True))
        split = draw(st.integers(0, len(sidecar_names)))
        containers = []
        for n in sidecar_names[:split]:
            c = _container(n, draw(_env), draw(_mounts))
            c["podInjectPolicy"] = draw(st.sampled_from(["BeforeAppContainer", "AfterAppContainer"]))
            if draw(st.booleans()):
                c["shareVolumePolicy"] = {"type": "enabled"}
            if draw(st.booleans()):
                c["transferEnv"] = [{"sourceContainerName": draw(st.sampled_from(APP_POOL)), "envNames": ["A", "B"]}]
            containers.append(c)
        inits = []
        for n in sidecar_names[split:]:
            c = _container(n, [], draw(_mounts))
            if draw(st.booleans()):
                c["restartPolicy"] = "Always"
            inits.append(c)
        spec: dict[str, Any] = {
            "selector": {"matchLabels": {"app": draw(st.sampled_from(["web", "web", "web", "db"]))}},
            "containers": containers,
            "initContainers": inits,
            "volumes": [
                {"name": v, "secret": {"secretName": v}} for v in draw(st.lists(st.sampled_from(VOLUMES), unique=True))
            ],
            "imagePullSecrets": [{"name": s} for s in draw(st.lists(st.sampled_from(["reg", "mesh"]), unique=True))],
            "patchPodMetadata": [
                {
                    "annotations": {draw(st.sampled_from(["m", "x/y"])): draw(st.sampled_from(['{"a":1}', "v"]))},
                    "patchPolicy": draw(st.sampled_from(["Retain", "Overwrite", "MergePatchJson"])),
                }
            ],
        }
        created = {"creationTimestamp": f"2024-01-0{draw(st.integers(1, 3))}T00:00:00Z"}
        out.append(SidecarSet.from_object(builders.sidecarset(f"ss{i}", metadata=created, **spec)))
    return out


def _object_ids(value: Any, out: set[int]) -> set[int]:
    if isinstance(value, dict | list):
        out.add(id(value))
        for item in value.values() if isinstance(value, dict) else value:
            _object_ids(item, out)
    return out


def _names(pod: dict[str, Any]) -> list[str]:
    spec = pod["spec"]
    return [c["name"] for c in spec["containers"] + (spec.get("initContainers") or [])]


@settings(max_examples=150, deadline=None)
@given(pod=pods(), sets=sidecarsets())
def test_engine_properties(pod: dict[str, Any], sets: list[SidecarSet]) -> None:
    before = copy.deepcopy(pod)
    result = engine.inject(pod, namespace="shop", namespace_labels=ENABLED, sidecarsets=sets, now=NOW)
    assert pod == before
    json.dumps(result.patch)
    inputs = _object_ids([pod, [ss.obj for ss in sets]], set())
    inputs.update(*(_object_ids(sc.container, set()) for ss in sets for sc in ss.containers + ss.init_containers))
    assert _object_ids(result.patch, set()).isdisjoint(inputs), "the patch shares objects with its inputs"
    assert result.denied is None
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, result.patch)

    all_names = _names(patched)
    assert len(all_names) == len(set(all_names))
    volumes = [v["name"] for v in patched["spec"].get("volumes") or []]
    assert len(volumes) == len(set(volumes))

    sidecar_names = {n for ss in sets if ss.name in result.injected for n in ss.all_container_names}
    apps_before = [c["name"] for c in pod["spec"]["containers"] if c["name"] not in sidecar_names]
    apps_after = [c["name"] for c in patched["spec"]["containers"] if c["name"] not in sidecar_names]
    assert apps_before == apps_after

    if result.injected:
        assert result.patch
        ann = patched["metadata"]["annotations"]
        assert set(json.loads(ann[names.ANN_HASH])) == set(result.injected)
        assert ann[names.ANN_INJECTED_LIST] == ",".join(sorted(result.injected))
        assert patched["metadata"]["labels"][names.POD_INJECTED_LABEL] == "true"
        for ss in sets:
            if ss.name in result.injected:
                for sc in ss.containers:
                    (c,) = [c for c in patched["spec"]["containers"] if c["name"] == sc.name]
                    assert {"name": names.ENV_IS_INJECTED, "value": "true"} in c["env"]
    else:
        assert result.patch == []
        assert result.skipped

    again = engine.inject(
        patched, namespace="shop", namespace_labels=ENABLED, sidecarsets=sets, now="2031-01-01T00:00:00Z"
    )
    assert again.patch == []
