"""The Lease read before a reconcile's writes: one per reconcile, and begun early after a takeover.

Why: a leader learns that another replica took the Lease only when it reads it, so the controller
reads the Lease before it writes (kuberuntime.leader.LeaderElector.confirm). Read before each write,
a reconcile that wrote its status and then patched pods paid for two reads in a row, and a new
leader's first patch waited for them after its planning: at 10,000 pods, 1.0 s from the plan to the
first patch, while the Lease requests took 0.3-0.6 s each under that load. Here one read serves a
reconcile's writes (the window in which a takeover goes unnoticed is that reconcile's writes, not
one request), and a term's first reconcile of a SidecarSet whose status shows its rollout
unfinished (the one a takeover resumes) begins that read with its planning, so it is answered by
the time the plan is. Other reconciles read only when they are about to write: most write nothing,
and one Lease read per pass would cost the API server a request per pod event during a rollout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

MayWrite = Callable[[], Awaitable[bool]]


class LeaseReads:
    """Per SidecarSet, the Lease read its running reconcile's writes share; `may_write` None: always writable."""

    def __init__(self, may_write: MayWrite | None) -> None:
        self.may_write = may_write
        self._reads: dict[str, asyncio.Future[bool]] = {}
        self._looked_at: set[str] = set()  # SidecarSets this controller (this term) has reconciled

    def began(self, name: str, status: Mapping[str, Any] | None, generation: int | None) -> None:
        """A reconcile of `name` begins; its Lease read begins too on the term's first look at an unfinished rollout."""
        first = name not in self._looked_at
        self._looked_at.add(name)
        if self.may_write is not None and first and unfinished(status, generation):
            self._reads[name] = asyncio.ensure_future(self.may_write())

    async def writable(self, name: str) -> bool:
        """Whether the reconcile of `name` may write: the answer of its one Lease read."""
        if self.may_write is None:
            return True
        read = self._reads.get(name)
        if read is None:
            read = self._reads[name] = asyncio.ensure_future(self.may_write())
        return await read

    def ended(self, name: str) -> None:
        """The reconcile of `name` ended: its read goes with it (cancelled if still on its way)."""
        read = self._reads.pop(name, None)
        if read is not None and not read.done():
            read.cancel()

    def forget(self, name: str) -> None:
        self.ended(name)
        self._looked_at.discard(name)


def unfinished(status: Mapping[str, Any] | None, generation: int | None) -> bool:
    """Whether a SidecarSet's status shows a rollout still to do: a spec it has not observed, or
    fewer pods updated than matched."""
    if not status:
        return True
    if generation is not None and status.get("observedGeneration") != generation:
        return True
    return int(status.get("updatedPods") or 0) < int(status.get("matchedPods") or 0)
