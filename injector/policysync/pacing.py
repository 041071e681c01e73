"""When the sync may write its next policy: at a pace the API server's compile time allows.

Why: kube-apiserver type-checks a policy's CEL when the policy is written (the write waits for it)
and again to enforce it, about 0.1 s of a core per SidecarSet group; its checker allocates so much
that the garbage collector makes every other request of the API server assist it. Measured on the
2-core machine with 600 two-label SidecarSets created at once, policies written back to back: pods
that no SidecarSet selects were admitted at 1-8 % of their rate before (11 pods/s of 766, p99 6.7 s)
while the policies were written, and the first policy was rewritten four times as SidecarSets
arrived (1, 5, 30, then 60 groups: every rewrite compiles all of its groups again).

So a write waits until the SidecarSets have been quiet for `quiet` seconds (a burst is written in
whole policies, once; one still waiting for its first revision has not arrived yet), but never more
than `max_quiet` seconds from the first wait; and after a write that took T seconds the next waits
`pace` x T, so the API server compiles our policies at most 1 / (1 + pace) of the time. Meanwhile
the webhook serves those SidecarSets' pods: the sync widened it for them before anything was
written (make before break).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Mapping

from injector.policy.plan import Path, Route, Why
from kuberuntime.clock import first_of
from sidecarsets.spec.model import SidecarSet

# Passes that no arrival asks for (recorded revisions, the events of our own writes) start at most
# this often. During a burst of 600 SidecarSets such events kept the sync planning back to back,
# each pass 0.1-0.2 s of CPU over 600 SidecarSets: half a core of the 2-core machine, taken from
# the API server for most of the burst. An arrival is planned at once (the webhook widens for it).
# Not the controller's rule (sidecarsets.controller.passpace: 4x the last pass's own cost, at most 1 s):
# a pass here costs the API server more than it costs us (each change of the webhook's condition is a
# write kube-apiserver compiles again), and a fixed second batches a burst's changes into one write.
PASS_SPACING_SECONDS = 1.0
# The longest a burst holds a policy write back waiting for quiet: SidecarSets created without pause
# (a tool applying thousands) still get their policies, each arrival meanwhile served by the webhook.
MAX_QUIET_SECONDS = 10.0


class WritePacing:
    """`due()`: when the next policy write may start; `wrote` and `arrived` move it."""

    def __init__(self, *, pace: float, quiet: float, max_quiet: float, monotonic: Callable[[], float]) -> None:
        self.pace = pace
        self.quiet = quiet
        self.max_quiet = max_quiet
        self.monotonic = monotonic
        self.next_write = -math.inf  # `pace` x the last write's time after it ended
        self.last_arrival = -math.inf  # a SidecarSet created or changed (not a status write)
        self.waiting_since: float | None = None  # since when a write has been held back

    def arrived(self) -> None:
        self.last_arrival = self.monotonic()

    def due(self, *, awaiting: bool = False) -> float:
        """The time the next write may start (now or earlier: at once).

        `awaiting`: the plan leaves SidecarSets out until the controller records their first revision.
        They are still arriving: a burst's first policy was written with 34 of its 60 SidecarSets,
        the rest waiting for their revisions, then written again with all 60 (two compiles of one
        policy, 4.5 and 9.1 s). So the write waits for them as for an arrival, and for no longer
        than `max_quiet`: a revision that never comes holds nothing back for good."""
        now = self.monotonic()
        if self.waiting_since is None:
            self.waiting_since = now
        last_arrival = now if awaiting else self.last_arrival
        quiet_until = min(last_arrival + self.quiet, self.waiting_since + self.max_quiet)
        return max(self.next_write, quiet_until)

    def wrote(self, started: float, ended: float) -> None:
        self.next_write = ended + self.pace * max(0.0, ended - started)
        self.waiting_since = None

    def idle(self) -> None:
        """Nothing is waiting to be written: the next wait starts its own `max_quiet`."""
        self.waiting_since = None


async def spaced(
    dirty: asyncio.Event, arrivals: asyncio.Event, stop: asyncio.Event, last: float, monotonic: Callable[[], float]
) -> None:
    """Before a pass asked for by an event (`dirty`) other than an arrival: wait until
    PASS_SPACING_SECONDS after the last pass started (at `last`), or an arrival, or `stop`."""
    if dirty.is_set() and not arrivals.is_set():
        await first_of(arrivals.wait(), stop.wait(), timeout=last + PASS_SPACING_SECONDS - monotonic())


def routes_so_far(
    planned: Mapping[str, Route], published: Mapping[str, Route], unwritten: Collection[str]
) -> dict[str, Route]:
    """The routes to publish while the writes of the policies `unwritten` wait for the pace: every
    SidecarSet's as planned, except those of a policy not written yet, which keep the route they
    had (a changed SidecarSet is served by its policy's previous version meanwhile) or, new, say the
    webhook serves them until then. Published at each deferral, not only once a pass has written
    every policy: during a burst of 2,000 SidecarSets the passes that wrote the first policies
    deferred the rest for minutes, and the sets those policies already served kept no condition."""
    out = dict(planned)
    for name, route in planned.items():
        if route.policy is not None and route.policy in unwritten:
            waiting = Route(
                Path.WEBHOOK,
                Why.PENDING,
                f"the webhook serves it until MutatingAdmissionPolicy {route.policy} is written",
            )
            out[name] = published.get(name) or waiting
    return out


def is_news(planned: SidecarSet | None, now: SidecarSet) -> bool:
    """A SidecarSet the pass did not plan for: new (or made again), or its spec, labels or annotations
    changed. A status write (the controller records revisions and counts all the time) changes
    nothing the webhook would do: widening for it would send policy-served pods to it for nothing.
    Whether the plan itself changes is injector.policy.partscache.plans_alike's question."""
    if planned is None:
        return True
    if planned is now:
        return False
    before = (planned.uid, planned.generation, planned.labels, planned.annotations)
    return before != (now.uid, now.generation, now.labels, now.annotations)
