"""The admission workers of the real `sidecarctl run`: connections split evenly over them, and a
killed worker replaced without one pod answered from a store that has not listed its SidecarSets yet.

The manager reaches the API server through a proxy (tests.kube.apiproxy) that, once the manager is
up, holds every list of SidecarSets for a few seconds: the replacement of a killed worker starts
with an empty store and stays so until that list arrives. Connections are counted per process
from /proc (the server end of each established connection on the webhook port).
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecarsets.spec import names
from tests.kube.apiproxy import ApiProxy
from tests.kube.managerharness import ManagerProcess
from tests.kube.measure import WebhookClient, injected_names, percentile, pod_review
from tests.reliability.harness import ReliabilityCluster, child_pids, ready_to_inject, report, supervisor_restarts

APP = "web"
SIDECARSETS = {"mesh": APP}
CONNECTIONS = 24
LIST_HOLD = 4.0  # seconds each SidecarSet list is held once the manager is up
TCP_ESTABLISHED = "01"  # /proc/net/tcp state


@pytest.fixture
def manager(cluster: ReliabilityCluster, proxy: ApiProxy) -> Iterator[ManagerProcess]:
    m = cluster.start_manager("workers", kubeconfig_path=cluster.kubeconfig_for(proxy.url))
    try:
        yield m
    finally:
        proxy.delay_lists("sidecarsets", 0.0)
        cluster.stop_manager(m)


def webhook_workers(m: ManagerProcess) -> set[int]:
    found = set()
    for pid in child_pids(m):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"webhook" in argv:
            found.add(pid)
    return found


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    except OSError:
        pass
    return inodes


def sockets_on_port(port: int, state: str) -> set[str]:
    """Inodes of the sockets whose local port is `port`, in TCP state `state`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                found.add(fields[9])
    return found


def connections_per_worker(m: ManagerProcess, workers: set[int]) -> dict[int, int]:
    established = sockets_on_port(_port(m.webhook_url), TCP_ESTABLISHED)
    return {pid: len(_socket_inodes(pid) & established) for pid in workers}


def ready_since(m: ManagerProcess, since: float) -> list[float]:
    """When the supervisor marked a worker ready for connections (its log line), at or after `since`."""
    found = []
    for line in m.log_path.read_text(errors="replace").splitlines():
        if "is ready: it is handed connections" in line:
            at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= since - 0.001:
                found.append(at)
    return found


def handed_out(m: ManagerProcess) -> list[int]:
    """The connections each worker holds, as the supervisor counts them (its gauge)."""
    with urllib.request.urlopen(m.probe_url + "/metrics", timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return [int(float(line.split()[-1])) for line in lines if line.startswith("sidecarctl_webhook_worker_connections{")]


def wait_all_closed(m: ManagerProcess) -> None:
    """Until every connection a client has closed is closed by its worker too: an idle one whose
    client went away ends after a 0.5 s grace (injector.http.server.LOST_GRACE), and until then
    it counts for its worker, so connections opened at once would be split by stale counts."""
    deadline = time.monotonic() + 5
    while any(handed_out(m)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(handed_out(m)), f"connections still counted 5 s after their clients closed: {handed_out(m)}"


def open_connections(m: ManagerProcess, cluster: ReliabilityCluster, ns: str, count: int) -> list[WebhookClient]:
    """`count` keep-alive connections, each of which has had one pod injected."""
    clients = []
    for i in range(count):
        client = WebhookClient(m.webhook_url, cluster.ca_file)
        status, body, _ = client.post(names.INJECT_PATH, pod_review(ns, f"spread-{time.monotonic_ns()}-{i}"))
        assert status == 200 and "proxy" in injected_names(body), (status, body[:300])
        clients.append(client)
    return clients


@dataclass
class Probe:
    at: float  # seconds after the kill
    outcome: str  # injected, bare, refused (a 4xx/5xx answer), or the connection error's name
    took: float


def probe_fresh_connections(
    m: ManagerProcess, cluster: ReliabilityCluster, ns: str, t0: float, stop: threading.Event
) -> list[Probe]:
    """One pod per new connection, every 50 ms, until `stop`: what a client opening connections sees."""
    probes = []
    i = 0
    while not stop.is_set():
        i += 1
        client = WebhookClient(m.webhook_url, cluster.ca_file, timeout=12)
        started = time.monotonic()
        try:
            status, body, _ = client.post(names.INJECT_PATH, pod_review(ns, f"probe-{i}"))
            outcome = ("injected" if "proxy" in injected_names(body) else "bare") if status == 200 else "refused"
        except OSError as e:
            outcome = type(e).__name__
        finally:
            client.close()
        probes.append(Probe(started - t0, outcome, time.monotonic() - started))
        time.sleep(0.05)
    return probes


def test_connections_split_evenly_over_the_workers_and_a_killed_worker_is_replaced_without_a_bare_pod(
    cluster: ReliabilityCluster, proxy: ApiProxy, manager: ManagerProcess
) -> None:
    ns, warm = ready_to_inject(cluster, manager)
    warm.close()
    wait_all_closed(manager)
    workers = webhook_workers(manager)
    assert len(workers) == 2, f"expected two admission workers, found {workers}"

    clients = open_connections(manager, cluster, ns, CONNECTIONS)
    spread_before = connections_per_worker(manager, workers)
    for c in clients:
        c.close()
    # The supervisor hands each connection to the worker holding the fewest: 12 and 12, or 13 and
    # 11 when its own readiness check held one for a moment.
    assert max(spread_before.values()) - min(spread_before.values()) <= 2, f"connections per worker: {spread_before}"
    assert sorted(handed_out(manager)) == sorted(spread_before.values()), "the supervisor's counts are off"

    # From now on a process that starts waits LIST_HOLD seconds for its first list of SidecarSets.
    proxy.delay_lists("sidecarsets", LIST_HOLD)
    victim = min(workers)
    survivor = max(workers)
    stop = threading.Event()
    found: list[list[Probe]] = []
    t0, killed_at = time.monotonic(), time.time()
    os.kill(victim, signal.SIGKILL)
    prober = threading.Thread(target=lambda: found.append(probe_fresh_connections(manager, cluster, ns, t0, stop)))
    prober.start()
    replacement = None
    try:
        deadline = t0 + 30
        while time.monotonic() < deadline and replacement is None:
            new = webhook_workers(manager) - {survivor}
            if new and victim not in new:
                replacement = next(iter(new))
            time.sleep(0.02)
        while time.monotonic() < deadline and not ready_since(manager, killed_at):
            time.sleep(0.05)
        time.sleep(1.0)  # pods answered by the replacement once it is handed connections
    finally:
        stop.set()
        prober.join(timeout=30)
    probes = found[0] if found else []
    assert replacement is not None, f"no worker replaced pid {victim} in 30 s:\n{manager.log_tail(40)}"
    ready = ready_since(manager, killed_at)
    assert len(ready) == 1, f"workers made ready after the kill: {ready}\n{manager.log_tail(40)}"
    served_at = ready[0] - killed_at
    assert proxy.delayed_lists >= 1, "the replacement's SidecarSet list was not held: the test proved nothing"

    wait_all_closed(manager)
    clients = open_connections(manager, cluster, ns, CONNECTIONS)
    spread_after = connections_per_worker(manager, {survivor, replacement})
    counted_after = handed_out(manager)
    for c in clients:
        c.close()

    outcomes: dict[str, int] = {}
    for p in probes:
        outcomes[p.outcome] = outcomes.get(p.outcome, 0) + 1
    failed = [p for p in probes if p.outcome not in ("injected",)]
    answered = [p.took for p in probes if p.outcome == "injected"]
    report(
        "admission workers: 24 connections each side of a SIGKILL of one worker (SidecarSet lists held "
        f"{LIST_HOLD:g} s for its replacement)",
        {
            "connections per worker before": sorted(spread_before.values()),
            "replacement handed connections from": f"{served_at:.2f} s after the kill",
            "pods on fresh connections": f"{len(probes)}: {outcomes}",
            "failures at (s after kill)": [round(p.at, 2) for p in failed],
            "answer p50 / p99 / max": f"{percentile(answered, 50) * 1000:.1f} / "
            f"{percentile(answered, 99) * 1000:.1f} / {max(answered) * 1000:.1f} ms",
            "connections per worker after": f"{sorted(spread_after.values())} (the supervisor's count: "
            f"{sorted(counted_after)})",
        },
    )
    # Never a pod admitted without its sidecar, whoever answered it.
    assert outcomes.get("bare", 0) == 0, outcomes
    # The replacement is handed connections only once it has its lists: not before the hold is over.
    assert served_at >= LIST_HOLD, f"the replacement served {served_at:.2f} s after the kill"
    # Connections the dead worker held may fail; none later: the supervisor reads the end of its
    # channel the moment it dies and hands every new connection to the survivor.
    assert all(p.at < 1.0 for p in failed), [(round(p.at, 2), p.outcome) for p in failed]
    assert len(probes) >= 40, f"only {len(probes)} probes"
    assert max(answered) < 2.0, f"an answer took {max(answered):.2f} s"
    assert max(spread_after.values()) - min(spread_after.values()) <= 2, (
        f"after the restart: {spread_after} in /proc, {counted_after} by the supervisor"
    )
    assert len(supervisor_restarts(manager)) == 1, supervisor_restarts(manager)
