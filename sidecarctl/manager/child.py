"""A child process of `sidecarctl run`: the control role, or one admission worker.

Started by the supervisor with its options in SIDECARCTL_CHILD_OPTIONS and, for a worker, the
channel its connections arrive on as an inherited fd (sidecarctl.manager.handoff). It reports
readiness in a status file the supervisor's /readyz reads, and ends on SIGTERM (draining) or when
the supervisor dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from kuberuntime.clock import sleep_or_stop
from sidecarctl.manager import logs
from sidecarctl.manager.options import ManagerOptions

if TYPE_CHECKING:
    from sidecarctl.manager.control import ControlRole
    from sidecarctl.manager.webhook import WebhookRole

log = logging.getLogger("sidecarctl.child")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    # The supervisor died before prctl took effect (it may itself be PID 1, in a container).
    if str(os.getppid()) != os.environ.get("SIDECARCTL_SUPERVISOR_PID", str(os.getppid())):
        sys.exit(1)


def _stopping(name: str, sig: signal.Signals, stop: asyncio.Event) -> None:
    """The moment shutdown starts, in the log: a slow handover is read against it."""
    if not stop.is_set():
        log.info("%s received %s: stopping", name, sig.name)
    stop.set()


async def _report(path: Path, ready: Callable[[], tuple[bool, str]], stop: asyncio.Event) -> None:
    """Write {pid, ready, why, time} every second, atomically, for the supervisor's probes."""
    tmp = path.with_suffix(".tmp")
    while not stop.is_set():
        ok, why = ready()
        tmp.write_bytes(orjson.dumps({"pid": os.getpid(), "ready": ok, "why": why, "time": time.time()}))
        os.replace(tmp, path)
        await sleep_or_stop(stop, 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sidecarctl-child")
    parser.add_argument("role", choices=["control", "webhook"])
    parser.add_argument("--name", default="control")
    parser.add_argument("--channel", type=int)
    args = parser.parse_args(argv)
    _die_with_parent()
    logs.setup(os.environ.get("SIDECARCTL_LOG_LEVEL", "info"), os.environ.get("SIDECARCTL_LOG_FORMAT", "json"))
    opts = ManagerOptions.build(**orjson.loads(os.environ["SIDECARCTL_CHILD_OPTIONS"]))
    cert_dir = Path(opts.tls.cert_dir or ".")
    run_dir = Path(os.environ["SIDECARCTL_RUN_DIR"])

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stopping, args.name, sig, stop)
        if args.role == "control":
            from sidecarctl.manager.control import ControlRole

            # Listing thousands of pods allocates millions of short-lived objects; the default GC
            # thresholds collect so often that collection dominates the list time.
            gc.set_threshold(100_000, 50, 100)
            role: ControlRole | WebhookRole = ControlRole(opts, cert_dir)
        else:
            from sidecarctl.manager.handoff import WorkerChannel
            from sidecarctl.manager.webhook import WebhookRole

            role = WebhookRole(opts, cert_dir, source=WorkerChannel(args.channel), name=args.name)
        reporter = asyncio.create_task(_report(run_dir / f"{args.name}.status", role.readiness, stop))
        try:
            await role.run(stop)
        finally:
            stop.set()
            await asyncio.gather(reporter, return_exceptions=True)

    asyncio.run(run())
    log.info("%s stopped", args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
