"""`sidecarctl run`: a small supervisor over the control process and the admission workers.

Why processes: the pod webhook is fail-closed, so while it cannot answer no pod starts in a
labelled namespace. In one process, a request that parses or validates for seconds would delay
every other admission, the Lease renewal and the watches. Here the control role (leader election,
controller, certificates, caBundle) has a process of its own, and admission is served by
`--webhook-workers` processes, so throughput grows with cores. The supervisor accepts on the
webhook port and hands each connection to the ready worker holding the fewest
(sidecarctl.manager.handoff); requests then go straight to that worker.

The supervisor binds the ports, serves the probes and /metrics (every process's metrics, through
prometheus-client's multiprocess files), restarts a child that dies, and on SIGTERM asks the
children to drain (the workers finish in-flight requests, the control process releases the Lease)
before it exits. Children die with it even when it is killed outright (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from certwatcher.reloader import CertReloader
from certwatcher.tls import HTTP1_ONLY
from injector.http.server import Limits, Listener
from kuberuntime import kubeapi, kubeconfig
from kuberuntime.authn import DelegatedAuth
from kuberuntime.backoff import Backoff
from kuberuntime.clock import first_of
from sidecarctl.manager import rundir
from sidecarctl.manager.handoff import ConnectionsCollector, Dispatcher
from sidecarctl.manager.healthport import create_metrics_app, create_probe_app, serve_plain, tls_self_check
from sidecarctl.manager.listeners import bind_only, bound_address, listen
from sidecarctl.manager.options import ManagerOptions

log = logging.getLogger("sidecarctl.supervisor")

STATUS_STALE = 5.0  # seconds without a heartbeat after which a child counts as not ready
DOWN_TOO_LONG = 60.0  # seconds a child may stay down before /healthz fails
DRAIN_SECONDS = 20.0  # SIGTERM to SIGKILL for children (terminationGracePeriodSeconds is 30)
# glibc keeps freed memory in per-thread arenas and raises its mmap threshold after large frees;
# fixed thresholds give memory back after a burst of large requests. The mmap threshold is 1 MiB,
# not lower: parsing an ordinary pod's review allocates buffers of a few hundred KiB, and taking
# each from mmap (page faults on every call) made orjson.loads of an 11 KB review 1.8x slower.
MALLOC_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "131072"}


def _cpu_quota() -> tuple[str, str] | None:
    """(quota, period) of this cgroup, v2 or v1; None when neither file is readable."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return quota, period
    except (OSError, ValueError):
        pass
    try:
        v1 = Path("/sys/fs/cgroup/cpu")
        return (v1 / "cpu.cfs_quota_us").read_text().strip(), (v1 / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None


def usable_cpus() -> int:
    """CPUs this process may use: its affinity, limited by a cgroup CPU quota when there is one."""
    count = len(os.sched_getaffinity(0))
    found = _cpu_quota()
    if found is not None and found[0] not in ("max", "-1") and int(found[1]) > 0:
        count = min(count, math.ceil(int(found[0]) / int(found[1])))
    return max(1, count)


@dataclass
class Child:
    name: str
    args: list[str]
    slot: int | None = None  # the admission worker's place in Supervisor.dispatcher
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    down_since: float | None = None
    backoff: Backoff = field(default_factory=lambda: Backoff(base=0.5, cap=10.0, jitter=(0.8, 1.2)))
    next_start: float = 0.0
    pidfd: int | None = None  # readable once the process has exited (Linux pidfd_open)


class Supervisor:
    def __init__(self, opts: ManagerOptions) -> None:
        self.opts = opts
        # Fail here, in one line, rather than in children restarted forever.
        kubeconfig.load_config(opts.kubeconfig)
        # Locked while this process or a child lives; what a killed manager left is removed here.
        self.run_dir, self.run_lock = rundir.create()
        self.metrics_dir = self.run_dir / "metrics"
        self.metrics_dir.mkdir()
        if opts.tls.cert_dir:
            self.cert_dir = Path(opts.tls.cert_dir)
        elif opts.tls.self_signed:
            self.cert_dir = self.run_dir / "certs"
            self.cert_dir.mkdir()
        else:
            raise ValueError("either --cert-dir or --self-signed is required")
        self.workers = opts.serving.webhook_workers or usable_cpus()
        self.webhook_sock = bind_only(opts.serving.webhook_bind)
        self.webhook_address = bound_address(opts.serving.webhook_bind, self.webhook_sock)
        self.dispatcher = Dispatcher(self.webhook_sock)
        flat = {**opts.flat(), "cert_dir": str(self.cert_dir)}
        self.env = {
            **os.environ,
            **MALLOC_ENV,
            "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
            "SIDECARCTL_RUN_DIR": str(self.run_dir),
            "SIDECARCTL_SUPERVISOR_PID": str(os.getpid()),
            "SIDECARCTL_CHILD_OPTIONS": orjson.dumps(flat).decode(),
        }
        child = [sys.executable, "-m", "sidecarctl.manager.child"]
        self.children = [Child("control", [*child, "control"])] + [
            Child(f"webhook-{i}", [*child, "webhook", f"--name=webhook-{i}"], i) for i in range(self.workers)
        ]
        self._exited = asyncio.Event()  # a child exited (set from its pidfd)
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=str(self.metrics_dir))  # type: ignore[no-untyped-call]
        self.registry.register(ConnectionsCollector(self.dispatcher))
        serving = opts.serving
        if serving.metrics_secure and not serving.metrics_bind:
            raise ValueError("--metrics-secure needs --metrics-bind (for example 0.0.0.0:8443)")
        self.metrics_sock = listen(serving.metrics_bind) if serving.metrics_bind else None

    # -- children --------------------------------------------------------------------------------
    def _start(self, child: Child) -> None:
        args = child.args
        channel: socket.socket | None = None
        if child.slot is not None:
            channel = self.dispatcher.attach(child.slot)
            args = [*args, f"--channel={channel.fileno()}"]
        try:
            # The run directory's lock goes to every child: it stays locked while any of them lives.
            fds = (self.run_lock,) if channel is None else (self.run_lock, channel.fileno())
            child.proc = subprocess.Popen(args, env=self.env, pass_fds=fds)
        finally:
            if channel is not None:
                channel.close()
        self._watch_exit(child)
        log.info("started %s (pid %d)", child.name, child.proc.pid)

    def _watch_exit(self, child: Child) -> None:
        """Wake the supervision loop the moment `child` exits, not at its next 0.2 s poll, so that
        it is restarted without delay. Without pidfd_open (not Linux, or a kernel before 5.3) the
        poll alone notices."""
        assert child.proc is not None
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None:
            return
        try:
            child.pidfd = pidfd_open(child.proc.pid)
            asyncio.get_running_loop().add_reader(child.pidfd, self._exited.set)
        except (OSError, RuntimeError):
            self._unwatch_exit(child)

    def _unwatch_exit(self, child: Child) -> None:
        if child.pidfd is None:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().remove_reader(child.pidfd)
        os.close(child.pidfd)
        child.pidfd = None

    def _reap(self, child: Child, now: float) -> None:
        if child.proc is None or child.proc.poll() is None:
            return
        code = child.proc.returncode
        if child.slot is not None:
            # Usually done already: the dispatcher reads the end of its channel when it dies.
            self.dispatcher.detach(child.slot)
        self._unwatch_exit(child)
        mark_process_dead(child.proc.pid, str(self.metrics_dir))  # type: ignore[no-untyped-call]
        (self.run_dir / f"{child.name}.status").unlink(missing_ok=True)
        child.proc = None
        child.restarts += 1
        child.down_since = child.down_since or now
        wait = child.backoff.next()
        child.next_start = now + wait
        log.warning("%s exited with %s; restarting in %.1fs", child.name, code, wait)

    async def _supervise(self, stop: asyncio.Event) -> None:
        for child in self.children:
            self._start(child)
        while not stop.is_set():
            now = time.monotonic()
            for child in self.children:
                self._reap(child, now)
                if child.proc is None and now >= child.next_start:
                    self._start(child)
                elif child.proc is not None and child.down_since is not None and self._status(child)[0]:
                    child.down_since = None
                    child.backoff.reset()
            self._exited.clear()
            await first_of(self._exited.wait(), stop.wait(), timeout=0.2)

    async def _drain(self) -> None:
        for child in self.children:
            self._unwatch_exit(child)  # an exited child's pidfd stays readable: no wake-ups while draining
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline and any(c.proc and c.proc.poll() is None for c in self.children):
            await asyncio.sleep(0.1)
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                log.warning("%s did not stop within %.0fs; killing it", child.name, DRAIN_SECONDS)
                child.proc.kill()
                child.proc.wait()

    # -- probes ----------------------------------------------------------------------------------
    def _status(self, child: Child) -> tuple[bool, str]:
        try:
            status = orjson.loads((self.run_dir / f"{child.name}.status").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return False, f"{child.name} has not reported yet"
        if child.proc is None or status.get("pid") != child.proc.pid:
            return False, f"{child.name} is restarting"
        if time.time() - float(status.get("time", 0)) > STATUS_STALE:
            return False, f"{child.name} stopped reporting"
        return bool(status.get("ready")), f"{child.name}: {status.get('why')}"

    async def readiness(self) -> tuple[bool, str]:
        for child in self.children:
            ok, why = self._status(child)
            if not ok:
                return False, why
        try:
            ca = (self.cert_dir / "ca.crt").read_bytes()
        except OSError as e:
            return False, f"no CA to check the webhook port against: {e}"
        return await tls_self_check(self.webhook_address, ca)

    async def liveness(self) -> tuple[bool, str]:
        now = time.monotonic()
        for child in self.children:
            if child.down_since is not None and now - child.down_since > DOWN_TOO_LONG:
                return False, f"{child.name} has been down for {now - child.down_since:.0f}s"
        return True, "ok"

    async def _serve_metrics(self, stop: asyncio.Event) -> None:
        """/metrics on its own port: plain, or over TLS behind the API server's TokenReview and SAR."""
        assert self.metrics_sock is not None
        if not self.opts.serving.metrics_secure:
            await serve_plain(
                create_probe_app(ready=self.readiness, registry=self.registry), "", stop, self.metrics_sock
            )
            return
        client = kubeapi.KubeClient(kubeconfig.load_config(self.opts.kubeconfig))
        auth = DelegatedAuth(client)
        reloader = CertReloader(self.cert_dir, serving=False, alpn=HTTP1_ONLY)
        reloader.reload_now()
        loop_task = asyncio.create_task(reloader.run(stop))
        try:
            app = create_metrics_app(self.registry, auth.check)
            await Listener(app, self.metrics_sock, reloader.front_context, Limits(max_connections=256)).serve(stop)
        finally:
            await asyncio.gather(loop_task, return_exceptions=True)
            await client.close()

    async def run(self, stop: asyncio.Event) -> None:
        metrics_here = self.metrics_sock is None
        probes = create_probe_app(
            ready=self.readiness, live=self.liveness, registry=self.registry if metrics_here else None
        )
        log.info(
            "manager started",
            extra={"object": f"webhook={self.webhook_address} workers={self.workers} run_dir={self.run_dir}"},
        )
        tasks = [
            asyncio.create_task(self._supervise(stop), name="supervise"),
            asyncio.create_task(serve_plain(probes, self.opts.serving.probe_bind, stop), name="probes"),
        ]
        dispatch = asyncio.create_task(self.dispatcher.serve(), name="dispatch")
        if self.metrics_sock is not None:
            tasks.append(asyncio.create_task(self._serve_metrics(stop), name="metrics"))
        try:
            await stop.wait()
        finally:
            # New connections are refused from here on; the open ones are the workers' to drain.
            dispatch.cancel()
            await asyncio.gather(dispatch, return_exceptions=True)
            self.webhook_sock.close()
            await self._drain()
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.dispatcher.close()
            # Its children are gone: their status files, metrics and any self-signed key with them,
            # so a host that restarts the manager does not collect one directory per run.
            shutil.rmtree(self.run_dir, ignore_errors=True)
            os.close(self.run_lock)
            log.info("manager stopped")


def _stopping(sig: signal.Signals, stop: asyncio.Event) -> None:
    if not stop.is_set():
        log.info("manager received %s: draining its processes", sig.name)
    stop.set()


def run_forever(opts: ManagerOptions) -> int:
    """Entry point of `sidecarctl run`: runs until SIGTERM or SIGINT."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stopping, sig, stop)
        await Supervisor(opts).run(stop)

    asyncio.run(main())
    return 0
