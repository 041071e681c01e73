"""Serving-certificate reload in the real manager, seen by TLS clients and by the real API server.

The unit tests prove the reloader against an echo server; here the webhook port is hypercorn in a
`sidecarctl run` child, the handshakes trust only what the webhook configuration publishes, and the
API server's admission calls must keep succeeding while the files change underneath.
"""

from __future__ import annotations

import random
import re
import signal
import ssl
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from tests.certutil import make_ca, write_dir
from tests.e2e.certsupport import (
    RESYNC,
    SWAPS,
    Rig,
    failures_text,
    fp,
    leaf_for,
    published,
    readyz,
    report,
    resource_version,
    scrape,
    served_leaf,
)
from tests.kube.client import eventually
from tests.kube.controlplane import free_port
from tests.kube.managerharness import wait_ready

# --- symlink swap under load ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_interval", "poll_interval", "bound"),
    [(0.2, 30.0, 1.0), (0.0, 1.0, 2.0)],
    ids=["fast-checks", "poll-only"],
)
def test_symlink_swap_serves_new_leaf_without_failed_handshakes(
    rig: Rig, event_interval: float, poll_interval: float, bound: float
) -> None:
    ca = make_ca("swap-ca")
    old = leaf_for(ca)
    d = rig.cert_dir()
    write_dir(d, leaf=old, ca_pem=ca.cert_pem)
    port = free_port()
    rig.configs(f"https://127.0.0.1:{port}")
    m = rig.child(
        d,
        f"--cert-event-interval={event_interval:g}",
        f"--cert-poll-interval={poll_interval:g}",
        webhook_port=port,
    )
    wait_ready(m)
    rig.wait_called([m.probe_url])
    watch = rig.watch(rig.vwc_path)
    assert watch.context() is not None
    hammer = rig.hammer(port, {"published": watch.context})
    prober = rig.prober()
    reloads_before = scrape(m.probe_url).value("sidecarctl_cert_reloads_total")
    time.sleep(1.0)  # load running against the old pair first

    # Several swaps at uneven spacing, so the swap falls at different points of the poll cycle.
    spacing = random.Random(rig.token)
    leaves = [old]
    latencies: list[float] = []
    seen: list[float] = []
    for _ in range(SWAPS):
        new = leaf_for(ca)
        swapped_at = time.monotonic()
        write_dir(d, leaf=new, ca_pem=ca.cert_pem)
        seen_at = rig.aloop.run(hammer.wait_for_serial(new.serial, timeout=bound + 5))
        assert seen_at is not None, f"new leaf not served within {bound + 5}s:\n{m.log_tail()}"
        leaves.append(new)
        seen.append(seen_at)
        latencies.append(seen_at - swapped_at)
        time.sleep(spacing.uniform(0.5, 1.5))  # load after it
    rig.stop(hammer)
    rig.stop(prober)

    shots = hammer.shots
    report(
        mode="fast" if event_interval else "poll",
        poll_interval=poll_interval,
        swaps=SWAPS,
        time_to_new_cert_s="/".join(f"{t:.3f}" for t in latencies),
        handshakes=len(shots),
        failed=len(hammer.failures),
        api_calls=len(prober.calls),
        api_failed=len(prober.failures),
    )
    assert max(latencies) <= bound, f"new leaf first served {latencies}s after the swaps (bound {bound}s)"
    assert not hammer.failures, f"{len(hammer.failures)} failed handshakes: {failures_text(hammer.failures)}"
    assert len(shots) >= 20 * (1 + SWAPS * 0.5), f"only {len(shots)} handshakes made"
    assert all(s.alpn == "http/1.1" for s in shots), "ALPN (HTTP/1.1 only, the default) lost on some handshakes"
    assert {s.serial for s in shots} == {leaf.serial for leaf in leaves}
    for i, seen_at in enumerate(seen):
        stale = {leaf.serial for leaf in leaves[: i + 1]}
        late = [s for s in shots if s.serial in stale and s.at > seen_at + 0.25]
        assert not late, f"a replaced leaf was served {len(late)} times after swap {i + 1} took effect"
    assert not prober.failures, f"API server admission calls failed: {failures_text(prober.failures)}"
    assert len(prober.calls) >= 10, f"only {len(prober.calls)} admission calls"
    after = scrape(m.probe_url)
    assert after.value("sidecarctl_cert_reloads_total") == reloads_before + SWAPS
    assert after.value("sidecarctl_leader") == 0, "the test manager took a Lease it should not hold"


# --- half-written pair -------------------------------------------------------------------------------


def test_half_written_pair_keeps_old_cert_and_counts_an_error(rig: Rig) -> None:
    ca = make_ca("half-ca")
    old = leaf_for(ca)
    d = rig.cert_dir()  # plain files, written in place: no ..data swap protects the reader here
    (d / "ca.crt").write_bytes(ca.cert_pem)
    (d / "tls.crt").write_bytes(old.cert_pem)
    (d / "tls.key").write_bytes(old.key_pem)
    port = free_port()
    rig.configs(f"https://127.0.0.1:{port}")
    m = rig.child(d, "--cert-poll-interval=1", webhook_port=port)
    wait_ready(m)
    rig.wait_called([m.probe_url])
    watch = rig.watch(rig.vwc_path)
    hammer = rig.hammer(port, {"published": watch.context})
    prober = rig.prober()
    before = scrape(m.probe_url)

    new = leaf_for(ca)
    (d / "tls.crt").write_bytes(new.cert_pem)  # the key is still the old one
    time.sleep(2.5)  # past the change-check hot window and two full polls
    half = scrape(m.probe_url)
    mid_shots = list(hammer.shots)
    status, _ = readyz(m.probe_url)
    (d / "tls.key").write_bytes(new.key_pem)
    seen_at = rig.aloop.run(hammer.wait_for_serial(new.serial, timeout=5))
    time.sleep(0.5)
    rig.stop(hammer)
    rig.stop(prober)

    errors = half.value("sidecarctl_cert_reload_errors_total") - before.value("sidecarctl_cert_reload_errors_total")
    mismatch = half.value("sidecarctl_cert_reload_errors_total", reason="key_mismatch") - before.value(
        "sidecarctl_cert_reload_errors_total", reason="key_mismatch"
    )
    report(half_written_errors=errors, key_mismatch=mismatch, handshakes=len(hammer.shots), failed=len(hammer.failures))
    assert {s.serial for s in mid_shots if s.error is None} == {old.serial}, "not the old leaf served mid-write"
    assert len(mid_shots) >= 40
    assert mismatch >= 1, f"reload-error metric did not rise for the half-written pair (all reasons: +{errors})"
    assert half.value("sidecarctl_cert_reloads_total") == before.value("sidecarctl_cert_reloads_total")
    assert status == 200, "readiness dropped while the old pair kept serving"
    assert seen_at is not None, "the completed pair was never served"
    assert not hammer.failures, f"failed handshakes: {failures_text(hammer.failures)}"
    assert not prober.failures, f"API server admission calls failed: {failures_text(prober.failures)}"


# --- leaf rotation under the same CA -----------------------------------------------------------------


def test_leaf_rotation_under_same_ca_writes_no_cabundle(rig: Rig) -> None:
    ca = make_ca("leaf-rotation-ca")
    d = rig.cert_dir()
    write_dir(d, leaf=leaf_for(ca), ca_pem=ca.cert_pem)
    port = free_port()
    rig.configs(f"https://127.0.0.1:{port}")
    m = rig.child(d, webhook_port=port)
    wait_ready(m)
    rig.wait_called([m.probe_url])
    for path in (rig.mwc_path, rig.vwc_path):
        assert published(rig.kube, path) == {fp(ca)}
    rvs = {p: resource_version(rig.kube, p) for p in (rig.mwc_path, rig.vwc_path)}
    writes = scrape(m.probe_url).value("sidecarctl_cabundle_writes_total")
    reloads = scrape(m.probe_url).value("sidecarctl_cert_reloads_total")

    def serving(serial: int) -> Callable[[], bool]:
        return lambda: rig.aloop.run(served_leaf(port, ca.cert_pem)).serial_number == serial

    for _ in range(2):
        new = leaf_for(ca)
        write_dir(d, leaf=new, ca_pem=ca.cert_pem)
        eventually(serving(new.serial), timeout=5, what="rotated leaf served")
    time.sleep(2 * RESYNC + 0.5)  # two resyncs with nothing to do
    rig.admit()

    after = scrape(m.probe_url)
    report(leaf_rotations=2, cabundle_writes=after.value("sidecarctl_cabundle_writes_total") - writes)
    assert after.value("sidecarctl_cert_reloads_total") == reloads + 2
    assert after.value("sidecarctl_cabundle_writes_total") == writes, "a leaf rotation wrote caBundle"
    assert {p: resource_version(rig.kube, p) for p in rvs} == rvs, "a webhook configuration was modified"


# --- readiness and metrics -------------------------------------------------------------------------


def test_readyz_waits_for_a_served_cert_and_metrics_move(rig: Rig) -> None:
    d = rig.cert_dir()  # empty: nothing to serve yet
    port = free_port()
    rig.configs(f"https://127.0.0.1:{port}")
    m = rig.child(d, webhook_port=port)

    def waiting_for_cert() -> bool:
        if m.proc.poll() is not None:
            raise AssertionError(f"manager exited:\n{m.log_tail()}")
        try:
            status, body = readyz(m.probe_url)
        except OSError:
            return False  # probe server not listening yet
        return status == 503 and "no valid serving certificate" in body

    eventually(waiting_for_cert, timeout=30, interval=0.1, what="/readyz 503 waiting for the certificate")
    time.sleep(1.0)
    assert readyz(m.probe_url)[0] == 503
    empty = scrape(m.probe_url)
    for name in ("sidecarctl_cert_reloads_total", "sidecarctl_serving_cert_expiry_timestamp_seconds"):
        assert empty.has(name), f"{name} not exported"
    assert empty.value("sidecarctl_cert_reloads_total") == 0
    assert empty.value("sidecarctl_cert_reload_errors_total", reason="missing") >= 1
    assert empty.value("sidecarctl_serving_cert_expiry_timestamp_seconds") == 0
    assert empty.value("sidecarctl_cabundle_writes_total") == 0
    assert published(rig.kube, rig.vwc_path) == frozenset()
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        rig.aloop.run(served_leaf(port, make_ca("any").cert_pem))

    ca = make_ca("ready-ca")
    first = leaf_for(ca, lifetime=timedelta(days=1))
    write_dir(d, leaf=first, ca_pem=ca.cert_pem)
    written = time.monotonic()
    eventually(lambda: readyz(m.probe_url)[0] == 200, timeout=10, interval=0.05, what="/readyz 200")
    ready_after = time.monotonic() - written
    rig.wait_called([m.probe_url])
    loaded = scrape(m.probe_url)
    assert loaded.value("sidecarctl_cert_reloads_total") == 1
    assert (
        loaded.value("sidecarctl_serving_cert_expiry_timestamp_seconds") == first.cert.not_valid_after_utc.timestamp()
    )
    for cfg in (rig.mwc, rig.vwc):
        assert loaded.value("sidecarctl_cabundle_writes_total", configuration=cfg) == 1

    second = leaf_for(ca, lifetime=timedelta(days=1, hours=1))
    write_dir(d, leaf=second, ca_pem=ca.cert_pem)
    expiry = second.cert.not_valid_after_utc.timestamp()
    eventually(
        lambda: scrape(m.probe_url).value("sidecarctl_serving_cert_expiry_timestamp_seconds") == expiry,
        timeout=5,
        what="expiry gauge follows the new leaf",
    )
    time.sleep(RESYNC + 0.5)
    rotated = scrape(m.probe_url)
    report(ready_after_cert_s=round(ready_after, 2))
    assert rotated.value("sidecarctl_cert_reloads_total") == 2
    assert rotated.value("sidecarctl_cert_reload_errors_total") == loaded.value("sidecarctl_cert_reload_errors_total")
    assert rotated.value("sidecarctl_cabundle_writes_total") == loaded.value("sidecarctl_cabundle_writes_total")
    assert readyz(m.probe_url)[0] == 200


# --- shutdown ---------------------------------------------------------------------------------------------


def test_sigterm_stops_the_manager_promptly(rig: Rig) -> None:
    """SIGTERM: the servers drain (hypercorn's graceful_timeout is 5 s, and nothing is connected
    here), so the process should be gone well within 6 s, not at `Manager.run`'s 10 s drain limit.

    Catches a task that ignores `stop`: an informer that checks `stop` only between watch events
    sits in a quiet watch (namespaces, ControllerRevisions) until it is cancelled at that limit.
    """
    ca = make_ca("sigterm-ca")
    d = rig.cert_dir()
    write_dir(d, leaf=leaf_for(ca), ca_pem=ca.cert_pem)
    m = rig.child(d)
    wait_ready(m)
    sent = time.monotonic()
    m.proc.send_signal(signal.SIGTERM)
    m.proc.wait(timeout=30)
    took = time.monotonic() - sent
    report(sigterm_to_exit_s=round(took, 2))
    assert m.proc.returncode == 0, m.log_tail()
    assert took <= 6.0, f"the manager took {took:.1f}s to stop after SIGTERM:\n{m.log_tail(8)}"
    run_dir = re.search(r"run_dir=(\S+)", m.log_path.read_text())
    assert run_dir is not None and not Path(run_dir.group(1)).exists(), "its run directory is left behind"
