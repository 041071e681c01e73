"""The election fields of a coordination.k8s.io/v1 Lease spec, as the elector reads and writes them.

Kept apart from the elector (kuberuntime.leader) so that the record's parsing and its JSON form
can be read, and tested, without the election's timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kuberuntime.jsontypes import JsonObj, mapping


@dataclass(frozen=True)
class LeaseRecord:
    """The election fields of a Lease spec; compared whole to detect any change."""

    holder: str = ""
    duration: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_spec(cls, spec: Any) -> LeaseRecord:
        spec = mapping(spec)
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> JsonObj:
        spec: JsonObj = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return spec
