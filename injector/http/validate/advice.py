"""Warnings for SidecarSets that are valid but will not do what a Kruise user may expect.

Kruise's pod webhook reacts to an annotation a SidecarSet can patch into pods, and to an env var
its sidecars can carry (Container Launch Priority); sidecarctl writes both like any other and
implements nothing behind them. The SidecarSet is admitted
(refusing it would break manifests written for Kruise) with an admission warning saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kuberuntime.jsontypes import mapping, resolve

LAUNCH_PRIORITY = "apps.kruise.io/container-launch-priority"
PRIORITY_ENV = "KRUISE_CONTAINER_PRIORITY"  # Kruise's other trigger: a container's start priority
_NOT_HERE = (
    "but sidecarctl does not implement Kruise's Container Launch Priority; to start a sidecar first, "
    "use spec.initContainers with restartPolicy: Always"
)


def warnings(obj: Any) -> list[str]:
    """One warning per patchPodMetadata entry or sidecar that asks for what sidecarctl gives no effect
    (each under the 256 characters the API server keeps of a warning)."""
    spec = mapping(obj, "spec")
    entries = spec.get("patchPodMetadata")
    out: list[str] = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        if LAUNCH_PRIORITY in mapping(entry, "annotations"):
            out.append(f"spec.patchPodMetadata[{i}] sets {LAUNCH_PRIORITY}, {_NOT_HERE}")
    for key in ("containers", "initContainers"):
        sidecars = spec.get(key)
        for i, c in enumerate(sidecars if isinstance(sidecars, list) else []):
            env = resolve(c, "env")
            names = [e.get("name") for e in (env if isinstance(env, list) else []) if isinstance(e, Mapping)]
            if PRIORITY_ENV in names:
                out.append(f"spec.{key}[{i}] sets the env {PRIORITY_ENV}, {_NOT_HERE}")
    return out
