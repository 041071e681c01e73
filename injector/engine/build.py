"""The sidecars of the SidecarSets being injected, built as they enter one pod.

Each sidecar is the SidecarSet's container, freshly copied, plus what it takes from the pod: the
app containers' volume mounts and devices when it shares them, transferred env vars, resources
computed by its resourcesPolicy, IS_INJECTED; a HotUpgrade sidecar becomes its `-1`/`-2` pair.
The volumes the sidecars mount and the pull secrets are collected beside them. A pod's override
(sidecarsets.overrides) replaces the fields it names, after resourcesPolicy and before the env vars
taken from the pod (so an overridden var wins, as the sidecar's own does); each is recorded as
applied or refused. Nothing built here shares an object with the SidecarSet or the pod, so the
patch can own every value it adds.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from injector.engine import envs, hotupgrade, volumes
from kuberuntime.jsontypes import JsonObj
from sidecarsets.overrides import merge
from sidecarsets.overrides.annotation import NONE, OverrideError, PodOverrides
from sidecarsets.spec import resourcespolicy as resources
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.sidecar import SidecarContainer


@dataclass(slots=True)
class Built:
    """Containers and pod-level additions collected from the SidecarSets being injected."""

    init_containers: list[tuple[str, JsonObj]]
    containers: list[tuple[str, JsonObj]]
    volumes: list[JsonObj]
    pull_secrets: list[JsonObj]
    warnings: list[str]
    hot: list[str]  # the HotUpgrade sidecars split into pairs, by their own names
    overrides: list[merge.Outcome]  # each override of a sidecar built here: applied or refused


class Refused(Exception):
    """The pod cannot be injected as its SidecarSets ask; the message says why and names them."""


class Apps:
    """The pod's app containers (those without IS_INJECTED=true), and what sharing sidecars take
    from them: the same for every sidecar of the pod, so found once per pod. Also what a
    resourcesPolicy reads: the pod's spec as submitted and the names of its SidecarSets' containers."""

    __slots__ = ("_shared", "containers", "sidecar_names", "spec")

    def __init__(
        self,
        containers: Sequence[JsonObj],
        *,
        spec: Mapping[str, Any] | None = None,
        sidecar_names: frozenset[str] = frozenset(),
    ) -> None:
        self.containers = [c for c in containers if not envs.is_injected(c)]
        self.spec: Mapping[str, Any] = spec or {}
        self.sidecar_names = sidecar_names
        self._shared: dict[str, tuple[list[JsonObj], list[JsonObj]]] = {}

    def shared(self, key: str) -> tuple[list[JsonObj], list[JsonObj]]:
        """`volumes.shared_from(self.containers, key=key)`; the lists belong to the pod: copy what is kept."""
        found = self._shared.get(key)
        if found is None:
            found = self._shared[key] = volumes.shared_from(self.containers, key=key)
        return found


_ATOMS = frozenset({str, int, float, bool, type(None)})


def _copy_json(value: Any, memo: dict[int, Any]) -> Any:
    """`copy.deepcopy(value, memo)`, with JSON's dicts, lists and scalars handled without its dispatch.

    For the few pod objects a sidecar takes over (shared mounts, transferred env vars). Objects
    shared within one sidecar stay shared, as with `copy.deepcopy`; dict keys, being immutable,
    are kept rather than copied.
    """
    kind = type(value)
    if kind in _ATOMS:
        return value
    found = memo.get(id(value))
    if found is not None:
        return found
    if kind is dict:
        out: Any = value.copy()
        memo[id(value)] = out
        for key, item in out.items():
            if type(item) not in _ATOMS:
                out[key] = _copy_json(item, memo)
        return out
    if kind is list:
        out = value.copy()
        memo[id(value)] = out
        for i, item in enumerate(out):
            if type(item) not in _ATOMS:
                out[i] = _copy_json(item, memo)
        return out
    return copy.deepcopy(value, memo)


def sidecars(
    todo: Sequence[SidecarSet],
    *,
    pod_metadata: Mapping[str, Any],
    containers: Sequence[JsonObj],
    apps: Apps,
    volumes_in_pod: Sequence[JsonObj],
    overrides: PodOverrides = NONE,
) -> Built:
    built = Built(init_containers=[], containers=[], volumes=[], pull_secrets=[], warnings=[], hot=[], overrides=[])
    pod_volume_names = {v.get("name") for v in volumes_in_pod}
    for ss in todo:
        pairs = hotupgrade.pairs_of(ss)
        for init, group, out in (
            (True, ss.init_containers, built.init_containers),
            (False, ss.containers, built.containers),
        ):
            for sc in group:
                container = _sidecar(sc, ss, pod_metadata, containers, apps, built, overrides)
                pair = pairs.get((init, sc.name)) if pairs else None
                if pair is None:
                    out.append((sc.inject_policy, container))
                else:
                    # Both containers go where the sidecar would, `-1` first. A pod that already
                    # has `<n>-1` / `<n>-2` gets them replaced at their places, as a cold sidecar
                    # replaces its namesake (Kruise's mergeSidecarContainers); a pod already at
                    # this SidecarSet's hash was left out by the selection.
                    first, second = hotupgrade.split(container, pair)
                    out += [(sc.inject_policy, first), (sc.inject_policy, second)]
                    built.hot.append(sc.name)
                for vol_name in sc.mounted_volume_names():
                    vol = ss.fresh_volume(vol_name)
                    if vol is not None:
                        built.volumes.append(vol)
                    elif vol_name not in pod_volume_names:
                        built.warnings.append(
                            f"{ss.kind} {ss.name}, container {sc.name}: volume {vol_name} is defined "
                            "neither by the SidecarSet nor by the pod"
                        )
        built.pull_secrets.extend(ss.fresh_image_pull_secrets())
    return built


def _sidecar(
    sc: SidecarContainer,
    ss: SidecarSet,
    pod_metadata: Mapping[str, Any],
    containers: Sequence[JsonObj],
    apps: Apps,
    built: Built,
    overrides: PodOverrides,
) -> JsonObj:
    """The container as it goes into the pod: the pod's override, shared mounts, IS_INJECTED and
    transferred env added.

    The result shares no object with the SidecarSet or the pod: the SidecarSet's part is a fresh
    copy and what comes from the pod is copied as it is added.
    """
    out = sc.fresh_container()
    if sc.resources_policy is not None:
        try:
            out["resources"] = resources.computed_resources(sc.resources_policy, apps.spec, apps.sidecar_names)
        except resources.ResourcesPolicyError as e:
            raise Refused(f"{_where(ss, sc)}: resourcesPolicy: {e}") from None
    override = overrides.get(sc.name) if overrides.containers else None
    if override is not None:
        try:
            own = None if sc.resources_policy is not None else sc.container.get("resources")
            merge.apply(out, ss, override, own=own if isinstance(own, dict) else None)
            built.overrides.append(merge.applied(ss, override))
        except OverrideError as e:
            built.overrides.append(merge.Outcome(sc.name, merge.REFUSED, str(e), e.reason))
    memo: dict[int, Any] = {}

    def adopt(item: JsonObj) -> JsonObj:
        copied: JsonObj = _copy_json(item, memo)
        return copied

    shared_env: list[JsonObj] = []
    if sc.share_volumes:
        mounts, shared_env = apps.shared("volumeMounts")
        out["volumeMounts"] = volumes.merged_mounts(
            out.get("volumeMounts") or [], mounts, path_key="mountPath", copy_added=adopt
        )
    if sc.share_volume_devices:
        devices, _ = apps.shared("volumeDevices")
        out["volumeDevices"] = volumes.merged_mounts(
            out.get("volumeDevices") or [], devices, path_key="devicePath", copy_added=adopt
        )
    transferred: list[JsonObj] = []
    if sc.transfer_env:
        transferred, problems = envs.transferred(sc.transfer_env, pod_metadata=pod_metadata, pod_containers=containers)
        built.warnings.extend(f"{_where(ss, sc)}: {p}" for p in problems)
    out["env"] = envs.merged(out.get("env") or [], transferred, shared_env, copy_added=adopt)
    return out


def _where(ss: SidecarSet, sc: SidecarContainer) -> str:
    return f"{ss.kind} {ss.name}, container {sc.name}"
