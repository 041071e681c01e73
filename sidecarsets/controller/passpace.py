"""When a pass that pod events ask for may start: paced by the SidecarSet's last pass.

Every pass reads all the SidecarSet's pods and may write its status, and each pod created, patched
or made ready is an event. Unpaced, 8 clients creating 145 pods/s through the webhook kept one
SidecarSet's passes back to back (370 passes in 23 s, 60 ms each at up to 3,400 pods; the control
process was half the manager's CPU), so a burst cost the square of its size. Here a pass a pod
event asks for starts no sooner than POD_PACE times the last pass's own duration after it ended,
and at most POD_PACE_CAP later: the passes take at most a fifth of the time while one costs under
a quarter of a second, and past that one a second at most (a status lagging its pods by more would
be worse than the CPU it saves). The first pod event after a quiet spell queues one at once; spec, namespace and
resync passes are queued by the controller directly and are not paced.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kuberuntime.workqueue import WorkQueue

POD_PACE = 4.0
POD_PACE_CAP = 1.0


class PassPace:
    """Pod events' passes for one controller's queue; `pace` 0 queues them at once."""

    def __init__(
        self, queue: WorkQueue, *, pace: float = POD_PACE, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.queue = queue
        self.pace = pace
        self.monotonic = monotonic
        self._last: dict[str, tuple[float, float]] = {}  # SidecarSet -> (when its last pass ended, its cost)
        self._running: dict[str, float] = {}  # SidecarSet -> when its pass began
        self._patching: dict[str, float] = {}  # SidecarSet -> when its pass began patching pods
        self._asked: set[str] = set()  # SidecarSets a pod event asked for during their pass

    def pod_event(self, name: str) -> None:
        """Queue a pass for a pod event: paced after the last one, or when the running one ends."""
        if name in self._running:
            self._asked.add(name)
            return
        last = self._last.get(name)
        wait = 0.0 if last is None else last[0] + self._wait(last[1]) - self.monotonic()
        self.queue.add_after(name, wait)

    def began(self, name: str) -> None:
        self._running[name] = self.monotonic()

    def began_patching(self, name: str) -> None:
        """From here on the pass's time is its pod patches', which the API server paces: left out."""
        self._patching[name] = self.monotonic()

    def ended(self, name: str) -> None:
        """The pass is over: its cost (reading, planning, the status) paces the next one."""
        ended = self.monotonic()
        cost = self._patching.pop(name, ended) - self._running.pop(name, ended)
        self._last[name] = (ended, cost)
        if name in self._asked:
            self._asked.discard(name)
            self.queue.add_after(name, self._wait(cost))

    def forget(self, name: str) -> None:
        """The SidecarSet is gone."""
        self._last.pop(name, None)
        self._asked.discard(name)

    def _wait(self, cost: float) -> float:
        return min(self.pace * cost, POD_PACE_CAP)
