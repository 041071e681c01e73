"""A SidecarSet's HotUpgrade sidecars: each served in a pod by a pair of containers, `<n>-1` and `<n>-2`.

What the spec says about them, read the same way by injection (injector.engine.hotupgrade), by
the status counters and by the rollout (sidecarsets.rollout.hotupgrade): the logical name, the
image, and the `hotUpgradeEmptyImage` the idle container runs. The pair's names are
`sidecar.hot_pair`; every name a SidecarSet's sidecars take in a pod is the model's
`container_names_in_pod`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kuberuntime.jsontypes import resolve
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.sidecar import hot_pair


@dataclass(frozen=True)
class HotSidecar:
    name: str  # the logical name, `<name>-1` and `<name>-2` in the pod
    image: str
    empty_image: str
    init: bool  # a native-sidecar init container

    @property
    def pair(self) -> tuple[str, str]:
        return hot_pair(self.name)

    @property
    def field(self) -> str:
        return "initContainers" if self.init else "containers"


def hot_sidecars(ss: SidecarSet) -> list[HotSidecar]:
    """The SidecarSet's HotUpgrade sidecars, with their empty images (from the spec: the model
    keeps only what goes into the pod)."""
    empty: dict[str, str] = {}
    for key in ("containers", "initContainers"):
        for raw in ss.spec.get(key) or []:
            if isinstance(raw, Mapping):
                value = resolve(raw, "upgradeStrategy", "hotUpgradeEmptyImage")
                empty[str(raw.get("name"))] = value if isinstance(value, str) else ""
    out = [HotSidecar(c.name, c.image or "", empty.get(c.name, ""), False) for c in ss.containers if c.hot]
    natives = [c for c in ss.init_containers if c.hot and c.native]
    return out + [HotSidecar(c.name, c.image or "", empty.get(c.name, ""), True) for c in natives]
