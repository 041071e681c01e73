"""What the pod webhook takes beyond the plan: the SidecarSets settling on a policy, and new arrivals.

A policy is enforced only after kube-apiserver's next refresh of its policies, while the webhook's
condition takes effect at once. So the webhook is widened for the SidecarSets whose policy is being
written (they settle until the canary's barrier shows it enforced), and for every SidecarSet created
or changed since the pass planned, the moment it arrives while a policy is written or the barrier is
asked (each can take kube-apiserver seconds); for every SidecarSet created since, right after the pass
writes its condition and between passes. The policy sync (injector.policysync.sync) owns the plan and
the narrowing; this keeps who is widened for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from injector.policy import selecting
from injector.policysync.pacing import is_news
from sidecarsets.spec.model import SidecarSet

T = TypeVar("T")


class Widening:
    """`settling`: the SidecarSets the webhook takes pods of beyond the plan. `news` is set by the sync
    when a SidecarSet changes; `write` stores a condition on the webhook, once `may_write` (the leader's
    check of its Lease, as before every pass) allows: a widening can come between two passes."""

    def __init__(
        self,
        models: Mapping[str, SidecarSet],
        write: Callable[[str], Awaitable[bool]],
        may_write: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.models = models  # the sync's own map, kept current by its informer handler
        self.write = write
        self.may_write = may_write
        self.settling: set[str] = set()
        self.news = asyncio.Event()
        # The condition this pass last wrote and the SidecarSets it planned (None until it wrote one):
        # what an arrival between two passes is widened against.
        self.written: tuple[str, dict[str, SidecarSet]] | None = None

    def with_news(self, condition: str, planned: dict[str, SidecarSet], *, new_only: bool = False) -> str:
        """`condition` widened for the SidecarSets created or changed since the pass planned `planned`
        (they are added to it, and settle); `new_only`: created only (or made again). A changed one is
        served meanwhile by the path of the version planned, whole: an image alone must not widen.

        Before the first narrowing the webhook took every pod, and so already injected the pods of a
        SidecarSet stored a moment before the pass, which the pass did not plan: a condition without it
        left such pods with neither the webhook nor a policy until the next pass (tens of milliseconds to
        a second, seen on kube-apiserver 1.37). So the sync writes that narrowing only once the SidecarSet
        watches have caught up with a quorum read, widened by this for what they brought."""
        news = [
            ss
            for name, ss in self.models.items()
            if (_is_new(planned.get(name), ss) if new_only else is_news(planned.get(name), ss))
        ]
        if not news:
            return condition
        self.settling |= {ss.name for ss in news}
        planned.update((ss.name, ss) for ss in news)
        return f"({condition}) || ({selecting.pods_selected(news, approximate=True)})"

    async def for_news(self, condition: str, planned: dict[str, SidecarSet], *, new_only: bool = False) -> str:
        """`with_news`, written when it widens: SidecarSets created or changed since the pass planned go
        to the webhook now, not after the pass, so a new SidecarSet reaches new pods as fast as the
        webhook's store whatever the number of policies."""
        widened = self.with_news(condition, planned, new_only=new_only)
        if widened != condition and (self.may_write is None or await self.may_write()):
            await self.write(widened)
        self.written = (widened, planned)
        return widened

    async def during(
        self, work: Awaitable[T], condition: str, planned: dict[str, SidecarSet], *, new_only: bool = False
    ) -> tuple[T, str]:
        """`work` (a policy's write, the barrier), and while it is in flight, widen the webhook for every
        SidecarSet that arrives. Storing a policy of 60 groups takes kube-apiserver seconds of compiling, and
        a burst makes a pass write several: widening only between two writes left the last of 1,000 new
        SidecarSets without either path for over a minute. The condition's patch does not wait for `work`."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                self.news.clear()  # before looking: an arrival after the look wakes the wait below
                condition = await self.for_news(condition, planned, new_only=new_only)
                if task.done():
                    return task.result(), condition
                arrival = asyncio.ensure_future(self.news.wait())
                try:
                    await asyncio.wait({task, arrival}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    arrival.cancel()
                    await asyncio.gather(arrival, return_exceptions=True)
        finally:
            if not task.done():  # the widening failed or the pass was cancelled: the work goes with it
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def between_passes(self, wait: Awaitable[object]) -> None:
        """`wait` (for the next pass), widening meanwhile for every SidecarSet that arrives, against the
        condition the last pass wrote. An arrival starts a pass at once, but a pass plans before it writes
        (passes started by arrivals wrote 60-100 ms apart in the adoption e2e test): a SidecarSet whose
        first pods the webhook took just before a narrowing kept neither path that long; one patch takes
        milliseconds."""
        if self.written is None:
            await wait
            return
        condition, planned = self.written
        await self.during(wait, condition, planned, new_only=True)


def _is_new(planned: SidecarSet | None, now: SidecarSet) -> bool:
    """A SidecarSet the pass did not plan at all: created, or deleted and made again, since."""
    return planned is None or planned.uid != now.uid
