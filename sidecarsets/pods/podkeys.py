"""The `namespace/name` key of a pod, from its raw object or its projection.

The preview modules (sidecarsets.rollout.preview, .rolloutsim, .simnode, .specdiff) index raw pods and
projections by the same key and report pods by it; one definition keeps the two from drifting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kuberuntime.jsontypes import mapping
from sidecarsets.pods.projection import PodProjection


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = mapping(pod, "metadata")
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def projection_key(p: PodProjection) -> str:
    return f"{p.namespace}/{p.name}"
