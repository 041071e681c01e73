"""Hot reload of the webhook's serving certificate from a cert directory.

`CertReloader.run` is a task in the manager's event loop. Two polls drive it:
- a cheap `dir_stamp` every `event_interval` (default 0.2 s), standing in for file events: a `..data`
  swap or an in-place write changes it, and for the next second the contents are re-read on every
  tick, so a new pair is served well within 1 s;
- a full content read and sha256 every `poll_interval` (default 10 s), the fallback that catches
  anything the stamp misses (same size and mtime granularity), so the bound without "events" is
  one poll interval (at most 2 x).

Contents that fail a check (half-written pair, wrong key, untrusted, expired, missing files) never
replace the served pair: the error counter rises and one line is logged per distinct content and
reason, then the same contents are retried quietly, since a not-yet-valid pair becomes valid later.

Serving with hypercorn, which calls `create_ssl_context()` once per worker: subclass its `Config`,
return `reloader.front_context` from `create_ssl_context()`, and keep `certfile`/`keyfile` set (to the
files in the cert dir) so that `ssl_enabled` stays true; then run `reloader.run(stop)` as a task.

A missing cert dir at start-up is waited for: `run` keeps polling, `ready` stays False and every
handshake is refused until a valid pair appears (logged once). Callers that prefer to fail fast call
`load_initial()`, which raises `CertReloadError` with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from certwatcher import metrics, pem
from certwatcher.files import CertFiles, CertFilesError, dir_stamp, read_cert_dir
from certwatcher.tls import ALPN_PROTOCOLS, CertSwitch, CertValidationError, ServingPair, build_context, validate_pair
from kuberuntime.clock import sleep_or_stop, utc_now

log = logging.getLogger(__name__)

_HOT_WINDOW = 1.0  # seconds of content re-reads after a stamp change


class CertReloadError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class CertReloader:
    def __init__(
        self,
        cert_dir: str | Path,
        *,
        poll_interval: float = 10.0,
        event_interval: float | None = 0.2,
        clock: Callable[[], datetime] = utc_now,
        on_reload: Callable[[ServingPair], None] | None = None,
        alpn: tuple[str, ...] = ALPN_PROTOCOLS,
        serving: bool = True,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: must be > 0, got {poll_interval}")
        if event_interval is not None and event_interval <= 0:
            raise ValueError(f"event_interval: must be > 0 or None, got {event_interval}")
        self.cert_dir = Path(cert_dir)
        self.poll_interval = poll_interval
        self.event_interval = event_interval
        self._clock = clock
        self._on_reload = on_reload
        self._alpn = alpn
        # False: the pair is only read (for its CA), not served; the serving metrics are not touched.
        self._serving = serving
        self._switch = CertSwitch(alpn)
        self._pair: ServingPair | None = None
        self._served_digest: str | None = None
        self._last_failure: tuple[str | None, str] | None = None
        self._last_error: tuple[str, str] | None = None
        self._ready = asyncio.Event()
        self.reloads = 0
        self.errors: dict[str, int] = {}

    @property
    def front_context(self) -> ssl.SSLContext:
        """Give this to the TLS server once; it keeps serving whatever pair is current."""
        return self._switch.front

    @property
    def current(self) -> ServingPair | None:
        return self._pair

    @property
    def ready(self) -> bool:
        return self._pair is not None

    async def wait_ready(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def load_initial(self) -> ServingPair:
        """Synchronous first load for fail-fast start-up; raises `CertReloadError` naming the reason."""
        self.reload_now()
        if self._pair is None:
            reason, message = self._last_error or ("missing", f"cert dir {self.cert_dir}: nothing loaded")
            raise CertReloadError(reason, message)
        return self._pair

    def reload_now(self) -> bool:
        """Read, check and swap on the calling thread; True when a new pair is now being served."""
        files = self._read()
        if files is None or self._unchanged(files):
            return False
        try:
            pair = validate_pair(files.cert, files.key, files.ca, now=self._clock())
            ctx = build_context(pair, self._alpn)
        except CertValidationError as exc:
            self._failed(files.digest, exc.reason, exc.message)
            return False
        self._install(files, pair, ctx)
        return True

    async def check(self) -> bool:
        """Like `reload_now`, with the cryptography work on a worker thread."""
        files = self._read()
        if files is None or self._unchanged(files):
            return False
        now = self._clock()

        def prepare() -> tuple[ServingPair, ssl.SSLContext]:
            pair = validate_pair(files.cert, files.key, files.ca, now=now)
            return pair, build_context(pair, self._alpn)

        try:
            pair, ctx = await asyncio.to_thread(prepare)
        except CertValidationError as exc:
            self._failed(files.digest, exc.reason, exc.message)
            return False
        if files.digest == self._served_digest:  # another check installed it meanwhile
            return False
        self._install(files, pair, ctx)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_poll = loop.time()
        last_stamp: object = None
        hot_until = -1.0
        while not stop.is_set():
            now = loop.time()
            if self.event_interval is not None:
                stamp = dir_stamp(self.cert_dir)
                if stamp != last_stamp:
                    last_stamp = stamp
                    hot_until = now + _HOT_WINDOW
            if now >= next_poll or now <= hot_until:
                try:
                    await self.check()
                except Exception:  # never let the watcher die; the next poll retries
                    log.exception("cert reload: unexpected error reading %s", self.cert_dir)
                if now >= next_poll:
                    next_poll = now + self.poll_interval
            if self.event_interval is not None:
                await sleep_or_stop(stop, self.event_interval)
            else:
                await sleep_or_stop(stop, next_poll - loop.time())

    # internals

    def _read(self) -> CertFiles | None:
        try:
            return read_cert_dir(self.cert_dir)
        except CertFilesError as exc:
            self._failed(None, exc.reason, str(exc))
            return None

    def _unchanged(self, files: CertFiles) -> bool:
        """The files are the pair being served (a refused change that was put back ends the failure)."""
        if files.digest != self._served_digest:
            return False
        if self._last_error is not None:
            self._last_error = self._last_failure = None
            self._set_failing(False)
        return True

    def _set_failing(self, failing: bool) -> None:
        if self._serving:
            metrics.CERT_RELOAD_FAILING.set(1 if failing else 0)

    def _failed(self, digest: str | None, reason: str, message: str) -> None:
        self._last_error = (reason, message)
        self._set_failing(True)
        key = (digest, reason)
        if self._last_failure == key:
            return
        self._last_failure = key
        self.errors[reason] = self.errors.get(reason, 0) + 1
        if self._serving:
            metrics.CERT_RELOAD_ERRORS.labels(reason=reason).inc()
        if self._pair is None:
            log.warning("serving certificate not loaded yet (%s): %s", reason, message)
        else:
            log.warning(
                "serving certificate not reloaded, still serving %s (%s): %s",
                pem.describe(self._pair.leaf),
                reason,
                message,
            )

    def _install(self, files: CertFiles, pair: ServingPair, ctx: ssl.SSLContext) -> None:
        previous = self._pair
        self._switch.swap(ctx)
        self._pair = pair
        self._served_digest = files.digest
        self._last_failure = None
        self._last_error = None
        self._set_failing(False)
        self.reloads += 1
        self._ready.set()
        if self._serving:
            metrics.CERT_RELOADS.inc()
            metrics.SERVING_CERT_EXPIRY.set(pair.not_after.timestamp())
            metrics.CA_CERT_EXPIRY.set(pem.not_after(pair.anchor).timestamp())
            log.info(
                "serving certificate %s (issuer %s, notAfter %s)%s",
                pem.describe(pair.leaf),
                pem.describe(pair.anchor),
                pair.not_after.isoformat(),
                "" if previous is None else f", replacing {pem.describe(previous.leaf)}",
            )
        if self._on_reload is not None:
            try:
                self._on_reload(pair)
            except Exception:
                log.exception("cert reload: on_reload callback failed")
