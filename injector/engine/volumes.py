"""Volumes and mounts at injection: what a sidecar shares with the app and what the pod gains.

A sidecar with `shareVolumePolicy: enabled` sees every mount of the app containers (never of
other sidecars, never of init containers); its own mountPath wins a clash. The pod gains only the
SidecarSet volumes some injected container actually uses, and a volume the pod already defines
under that name is kept: the pod is the user's, the SidecarSet only fills gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from injector.engine import envs
from kuberuntime.jsontypes import JsonObj


def _same(item: JsonObj) -> JsonObj:
    return item


def shared_from(app_containers: Sequence[JsonObj], *, key: str = "volumeMounts") -> tuple[list[JsonObj], list[JsonObj]]:
    """Mounts (or devices) of the app containers, plus the env vars their subPathExprs refer to.

    The caller passes only app containers (without IS_INJECTED=true): the engine sorts them once per pod.
    """
    mounts: list[JsonObj] = []
    env_vars: list[JsonObj] = []
    for container in app_containers:
        for mount in container.get(key) or []:
            mounts.append(mount)
            expr = mount.get("subPathExpr")
            refs = envs.referenced_vars(str(expr)) if expr else None
            if refs:
                env_vars.extend(env for env in container.get("env") or [] if env.get("name") in refs)
    return mounts, env_vars


def merged_mounts(
    own: Iterable[JsonObj],
    additional: Iterable[JsonObj],
    *,
    path_key: str,
    copy_added: Callable[[JsonObj], JsonObj] = _same,
) -> list[JsonObj]:
    """Own mounts first; an additional mount is dropped when its path is already mounted.

    Additional mounts kept are passed through `copy_added`, so that the result need not share the app's objects.
    """
    out = list(own)
    paths = {m.get(path_key) for m in out}
    for mount in additional:
        if mount.get(path_key) not in paths:
            out.append(copy_added(mount))
            paths.add(mount.get(path_key))
    return out


def new_by_name(existing: Iterable[JsonObj], additional: Iterable[JsonObj]) -> list[JsonObj]:
    """Entries of `additional` whose name is neither in `existing` nor earlier in `additional`."""
    seen = {item.get("name") for item in existing}
    out: list[JsonObj] = []
    for item in additional:
        if item.get("name") not in seen:
            out.append(item)
            seen.add(item.get("name"))
    return out
