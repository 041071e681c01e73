"""Object builders shared by every test tier, the benchmarks and the demo."""

from __future__ import annotations

from typing import Any

from sidecarsets.model import SidecarSet


def model(obj: Any) -> SidecarSet:
    """A SidecarSet object read the way the controller reads objects from the cluster."""
    return SidecarSet.from_object(obj, tolerant=True)
