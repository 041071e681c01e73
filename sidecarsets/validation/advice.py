"""Warnings for SidecarSets that are valid but will not do what a Kruise user may expect.

Kruise's pod webhook reacts to some annotations a SidecarSet can patch into pods; sidecarctl
writes the annotation like any other and implements nothing behind it. The SidecarSet is admitted
(refusing it would break manifests written for Kruise) with an admission warning saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAUNCH_PRIORITY = "apps.kruise.io/container-launch-priority"


def warnings(obj: Any) -> list[str]:
    """One warning per patchPodMetadata entry that patches an annotation sidecarctl gives no effect
    (each under the 256 characters the API server keeps of a warning)."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    entries = spec.get("patchPodMetadata") if isinstance(spec, Mapping) else None
    out: list[str] = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        annotations = entry.get("annotations") if isinstance(entry, Mapping) else None
        if isinstance(annotations, Mapping) and LAUNCH_PRIORITY in annotations:
            out.append(
                f"spec.patchPodMetadata[{i}] sets {LAUNCH_PRIORITY}, but sidecarctl does not implement Kruise's "
                "Container Launch Priority; to start a sidecar first, use spec.initContainers with "
                "restartPolicy: Always"
            )
    return out
