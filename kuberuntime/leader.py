"""Leader election on a coordination.k8s.io/v1 Lease, asyncio-native, with release on stop.

Why not `kubernetes.leaderelection`: it is thread-based and blocking (`time.sleep` in the
acquire loop, the callback in a daemon thread), exits the process on bad durations, and has no
release-on-cancel, so after a rolling update the standby waits out the whole lease. This is the
client-go algorithm on our async raw-JSON client:

- A candidate takes the Lease when it is absent, released (empty holder), or expired. Expiry is
  judged by *our* monotonic clock: the record must have been seen unchanged for
  `leaseDurationSeconds` since we first observed it. The remote `renewTime` is never compared with
  the local wall clock, so clock skew between replicas cannot cause two leaders. A standby tries
  again at client-go's jittered interval, or at the moment that rule says the Lease it saw expires
  if that comes first (`next_attempt_in`): a takeover starts at the expiry, not up to a retry later.
- Writes are optimistic (`update` with the read resourceVersion); a Conflict means someone else
  wrote, so the Lease is read again.
- The leader renews every `retry_period`. If no renewal has succeeded for `renew_deadline`
  (counted from when the last successful request was *sent*) it stops leading: the leading task is
  cancelled and `lost` is set. `renew_deadline < lease_duration` leaves a margin before any
  standby may take over.
- On `stop` the leading task is cancelled first, then the Lease is released (empty holder,
  `leaseDurationSeconds: 1`, as client-go's ReleaseOnCancel) so a standby takes over at once.
  Cancelling `run` itself does not release: that is what a crash looks like to the others.
- The handover is bounded whatever the load: a renewal in flight when `stop` comes is abandoned,
  the leading task gets `STOP_LEADING_SECONDS` to end, and the release (one update of the Lease
  last read or written, re-read only on a Conflict) gets `RELEASE_SECONDS`; a release that fails or
  runs out of time says so in the log, and the standby then takes over when the Lease expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from kuberuntime import api
from kuberuntime.backoff import JITTER
from kuberuntime.clock import first_of, micro_time, utc_now
from kuberuntime.jsontypes import JsonObj
from kuberuntime.leaserecord import LeaseRecord
from kuberuntime.metrics import IS_LEADER, LEADER_ACQUISITIONS

log = logging.getLogger(__name__)

LEASE_API = "/apis/coordination.k8s.io/v1"
DEFAULT_LEASE_NAME = "sidecarctl-controller"
# client-go waits retry_period * (1 + rand * 1.2) between acquisition attempts.
JITTER_FACTOR = 1.2
# Seconds past the expiry of the Lease we saw within which a standby tries to take it.
EXPIRY_JITTER = 0.1
# On stop: the time the leading task gets to end after it is cancelled, and the time the release
# gets. Both together stay well inside the control process's 10 s shutdown window
# (sidecarctl.manager.control), so the release is never itself cut off.
STOP_LEADING_SECONDS = 2.0
RELEASE_SECONDS = 4.0

OnStarted = Callable[[asyncio.Event], Awaitable[None]]


class LeaderElector:
    """One candidate for the Lease `namespace/name`; `run` campaigns until `stop` is set."""

    def __init__(
        self,
        client: api.Client,
        *,
        namespace: str,
        identity: str,
        name: str = DEFAULT_LEASE_NAME,
        lease_duration: int = 15,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utc_now,
        rand: Callable[[], float] = JITTER.random,
    ) -> None:
        if not identity:
            raise ValueError("leader election identity must not be empty")
        if not namespace or not name:
            raise ValueError("leader election needs a Lease namespace and name")
        if isinstance(lease_duration, bool) or not isinstance(lease_duration, int) or lease_duration < 1:
            raise ValueError(f"lease_duration must be a whole number of seconds >= 1, got {lease_duration!r}")
        if retry_period <= 0:
            raise ValueError(f"retry_period must be > 0, got {retry_period}")
        if not renew_deadline < lease_duration:
            raise ValueError(f"renew_deadline ({renew_deadline}) must be less than lease_duration ({lease_duration})")
        if not renew_deadline > retry_period * JITTER_FACTOR:
            raise ValueError(
                f"renew_deadline ({renew_deadline}) must be greater than retry_period * {JITTER_FACTOR} "
                f"({retry_period * JITTER_FACTOR:g})"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        IS_LEADER.labels(f"{namespace}/{name}")  # a standby exports 0 (a new series starts at 0), not nothing
        LEADER_ACQUISITIONS.labels(f"{namespace}/{name}")
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self._wall_clock = wall_clock
        self._rand = rand
        self._observed: LeaseRecord | None = None
        self._observed_time = 0.0
        self._lease: JsonObj | None = None  # the Lease object last read or written
        self._leading = False
        self._taken = asyncio.Event()  # `confirm` saw another holder: stop leading now

    @property
    def path(self) -> str:
        return f"{LEASE_API}/namespaces/{self.namespace}/leases/{self.name}"

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def observed_holder(self) -> str | None:
        """The holder in the last Lease we read or wrote ("" when released, None before the first read)."""
        return None if self._observed is None else self._observed.holder

    def _set_leading(self, leading: bool) -> None:
        if leading and not self._leading:
            LEADER_ACQUISITIONS.labels(f"{self.namespace}/{self.name}").inc()
        self._leading = leading
        IS_LEADER.labels(f"{self.namespace}/{self.name}").set(1 if leading else 0)

    def _observe(self, lease: JsonObj) -> LeaseRecord:
        self._lease = lease
        record = LeaseRecord.from_spec(lease.get("spec"))
        if record != self._observed:
            self._observed = record
            self._observed_time = self._clock()
        return record

    def _expires_at(self, record: LeaseRecord) -> float:
        """When `record`, seen unchanged since `_observed_time`, has expired by our clock."""
        return self._observed_time + (record.duration or self.lease_duration)

    def _expired(self, record: LeaseRecord) -> bool:
        return self._expires_at(record) <= self._clock()

    async def try_acquire_or_renew(self) -> bool:
        """One attempt to take or keep the Lease; True when we hold it afterwards."""
        for _ in range(2):  # a Conflict re-reads once right away
            now = micro_time(self._wall_clock())
            try:
                lease = await self.client.get(self.path)
            except api.NotFound:
                mine = LeaseRecord(self.identity, self.lease_duration, now, now, 0)
                body: JsonObj = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": mine.to_spec(),
                }
                try:
                    created = await self.client.create(f"{LEASE_API}/namespaces/{self.namespace}/leases", body)
                except api.Conflict:
                    continue  # another candidate created it first
                except Exception as e:
                    log.warning("lease %s/%s: create failed: %s", self.namespace, self.name, e)
                    return False
                self._observe(created)
                return True
            except Exception as e:
                log.warning("lease %s/%s: read failed: %s", self.namespace, self.name, e)
                return False

            old = self._observe(lease)
            if old.holder and old.holder != self.identity and not self._expired(old):
                return False
            if old.holder == self.identity:
                mine = LeaseRecord(self.identity, self.lease_duration, old.acquire_time or now, now, old.transitions)
            else:
                mine = LeaseRecord(self.identity, self.lease_duration, now, now, old.transitions + 1)
            body = {**lease, "spec": {**(lease.get("spec") or {}), **mine.to_spec()}}
            try:
                updated = await self.client.update(self.path, body)
            except api.Conflict:
                continue
            except Exception as e:
                log.warning("lease %s/%s: update failed: %s", self.namespace, self.name, e)
                return False
            self._observe(updated)
            return True
        return False

    async def confirm(self) -> bool:
        """Before a write: False when we do not lead, or the Lease now names another holder.

        A leader learns of a forced takeover only when it reads the Lease; reading it right before
        writing closes that window to the time of one request. When the read itself fails the
        answer is True: renewals (and `renew_deadline`) decide about an unreachable API server.
        """
        if not self._leading:
            return False
        try:
            # Not wait_for: on 3.11 it returns the answer to a caller cancelled as the answer arrives,
            # and a reconcile that lost its cancellation kept the term (and the next campaign) waiting.
            async with asyncio.timeout(self.retry_period):
                lease = await self.client.get(self.path)
        except (api.ApiError, OSError, TimeoutError):
            return True
        holder = self._observe(lease).holder
        if holder != self.identity:
            log.error(
                "lease %s/%s is held by %s now: %s stops writing", self.namespace, self.name, holder, self.identity
            )
            self._taken.set()
            return False
        return True

    async def release(self, timeout: float = RELEASE_SECONDS) -> bool:
        """Give the Lease up if we hold it, so a standby need not wait for it to expire.

        Bounded by `timeout` whatever the API server's load; the outcome is logged either way.
        """
        started = self._clock()
        try:
            released = await asyncio.wait_for(self._release(), timeout=timeout)
        except TimeoutError:
            log.error(
                "lease %s/%s: release by %s not done within %.1fs; a standby takes over when it expires "
                "(%ss after the last renewal)",
                self.namespace,
                self.name,
                self.identity,
                timeout,
                self.lease_duration,
            )
            return False
        if released:
            log.info(
                "lease %s/%s released by %s in %.2fs", self.namespace, self.name, self.identity, self._clock() - started
            )
        return released

    async def _release(self) -> bool:
        """One update of the Lease we last saw (no read first: each request counts on shutdown);
        a Conflict means it changed since, so it is read once and released if still ours."""
        lease = self._lease
        for attempt in range(2):
            if lease is None or attempt:
                try:
                    lease = await self.client.get(self.path)
                except api.NotFound:
                    return True
                except Exception as e:
                    log.error("lease %s/%s: read for release failed: %s", self.namespace, self.name, e)
                    return False
            old = self._observe(lease)
            if old.holder != self.identity:
                return True
            now = micro_time(self._wall_clock())
            released = LeaseRecord("", 1, now, now, old.transitions)
            body = {**lease, "spec": {**(lease.get("spec") or {}), **released.to_spec()}}
            try:
                self._observe(await self.client.update(self.path, body))
            except api.Conflict:
                continue
            except Exception as e:
                log.error("lease %s/%s: release failed: %s", self.namespace, self.name, e)
                return False
            return True
        log.error("lease %s/%s: release failed: the Lease kept changing", self.namespace, self.name)
        return False

    async def _pause(self, delay: float, *wake: asyncio.Event | asyncio.Task[None]) -> None:
        """Sleep `delay` seconds, or less when an event is set or a task finishes."""
        if any(w.is_set() if isinstance(w, asyncio.Event) else w.done() for w in wake):
            return
        ours = [asyncio.ensure_future(w.wait()) for w in wake if isinstance(w, asyncio.Event)]
        tasks = [w for w in wake if isinstance(w, asyncio.Task)]
        try:
            if ours or tasks:
                await asyncio.wait([*ours, *tasks], timeout=max(0.0, delay))
            else:
                await asyncio.sleep(max(0.0, delay))
        finally:
            for f in ours:
                f.cancel()

    async def _attempt(self, timeout: float) -> bool:
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), timeout=max(0.001, timeout))
        except TimeoutError:
            log.warning("lease %s/%s: request timed out after %.1fs", self.namespace, self.name, timeout)
            return False

    async def _attempt_unless(self, stop: asyncio.Event, timeout: float) -> bool:
        """`_attempt`, abandoned when `stop` is set meanwhile: a renewal slowed by a loaded API server
        must not hold up the release."""
        attempt = asyncio.ensure_future(self._attempt(timeout))
        await first_of(asyncio.shield(attempt), stop.wait())
        if attempt.done():
            return attempt.result()
        attempt.cancel()
        await asyncio.gather(attempt, return_exceptions=True)
        return False

    async def _acquire(self, stop: asyncio.Event) -> bool:
        while not stop.is_set():
            if await self._attempt(self.renew_deadline):
                return True
            await self._pause(self.next_attempt_in(), stop)
        return False

    def next_attempt_in(self) -> float:
        """Seconds until a standby tries again: client-go's jittered `retry_period`, or less when the
        Lease we saw will have expired by our clock before then, so the takeover starts at the expiry
        and not up to 4.4 s (2 s x 2.2) after it. The same rule decides (`_expired`); only the timing
        of the read that applies it moves. A small jitter keeps several standbys from all reading
        at the same instant (the one that writes first wins; the others get a Conflict)."""
        wait = self.retry_period * (1 + JITTER_FACTOR * self._rand())
        record = self._observed
        if record is None or not record.holder or record.holder == self.identity:
            return wait
        expires_in = self._expires_at(record) - self._clock()
        if expires_in <= 0:
            return wait  # expired already, and the attempt failed all the same: back off as usual
        return min(wait, expires_in + EXPIRY_JITTER * self._rand())

    async def _renew(self, stop: asyncio.Event, task: asyncio.Task[None]) -> str:
        """Keep the Lease while leading; returns "stop", "done" (the task ended) or "lost"."""
        last_renew = self._clock()
        while True:
            await self._pause(self.retry_period, stop, task, self._taken)
            while True:
                if stop.is_set():
                    return "stop"
                if self._taken.is_set():
                    return "lost"
                if task.done():
                    return "done"
                remaining = last_renew + self.renew_deadline - self._clock()
                if remaining <= 0:
                    return "lost"
                sent = self._clock()
                if await self._attempt_unless(stop, remaining):
                    last_renew = sent
                    break
                if self.observed_holder not in (None, "", self.identity):
                    return "lost"  # someone else holds it now: never keep acting as leader
                await self._pause(min(self.retry_period, remaining), stop, task)

    async def run(self, stop: asyncio.Event, on_started: OnStarted) -> None:
        """Campaign, lead (running `on_started(lost)` as a task), and campaign again, until `stop`."""
        while not stop.is_set():
            if not await self._acquire(stop) or stop.is_set():
                break
            lost = asyncio.Event()
            self._taken.clear()
            self._set_leading(True)
            log.info("lease %s/%s acquired by %s", self.namespace, self.name, self.identity)
            task = asyncio.create_task(_lead(on_started, lost), name=f"leading-{self.identity}")
            try:
                outcome = await self._renew(stop, task)
            except BaseException:
                self._set_leading(False)
                lost.set()
                await _cancel(task)
                raise
            self._set_leading(False)
            lost.set()
            await _cancel(task, timeout=STOP_LEADING_SECONDS if outcome == "stop" else None)
            if outcome == "lost":
                log.error("lease %s/%s lost by %s: stopped leading", self.namespace, self.name, self.identity)
                continue
            if outcome == "done":
                exc = None if task.cancelled() else task.exception()
                log.log(
                    logging.ERROR if exc else logging.WARNING,
                    "leading task of %s ended (%s); releasing the lease",
                    self.identity,
                    exc or "returned",
                )
                await self.release()
                await self._pause(self.retry_period, stop)
                continue
            break
        if stop.is_set():
            await self.release()


async def _lead(on_started: OnStarted, lost: asyncio.Event) -> None:
    await on_started(lost)


async def _cancel(task: asyncio.Task[None], timeout: float | None = None) -> None:
    """Cancel `task` and wait for it to end, at most `timeout` seconds (then say so and go on)."""
    if not task.done():
        task.cancel()
    done, _ = await asyncio.wait([task], timeout=timeout)
    if not done:
        log.error("the leading task did not end within %.1fs of its cancellation; releasing the lease anyway", timeout)
        return
    await asyncio.gather(task, return_exceptions=True)
