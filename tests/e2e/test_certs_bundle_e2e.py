"""caBundle upkeep by the real manager on the real API server: CA rotation, repair, self-signed mode.

The API server trusts only what `caBundle` says and learns of changes through its own informer, so
the CA-rotation claims are judged by its admission calls (failurePolicy Fail), not only by reading
the field back.
"""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY

from cabundle.syncer import SyncResult
from certwatcher import pem
from sidecarsets.spec import names
from tests.certutil import make_ca, pems, write_dir
from tests.e2e.certsupport import (
    LABEL,
    RESYNC,
    SECRETS,
    SLACK,
    Rig,
    entry_bundles,
    failures_text,
    fp,
    leaf_for,
    published,
    report,
    resource_version,
    scrape,
    served_leaf,
)
from tests.kube.client import eventually
from tests.kube.controlplane import free_port
from tests.kube.managerharness import VWC_PATH, wait_ready, webhook_configs

# --- CA rotation with overlap -----------------------------------------------------------------------

OLD_CA_TTL = 28.0  # seconds: long enough to set the rotation up, short enough to watch it expire


def test_ca_rotation_overlap_and_expired_ca_dropped(rig: Rig) -> None:
    started = datetime.now(UTC)
    old_ca = make_ca("old-ca", not_after=started + timedelta(seconds=OLD_CA_TTL))
    new_ca = make_ca("new-ca", lifetime=timedelta(days=2))
    old_leaf = leaf_for(old_ca, not_after=started + timedelta(seconds=OLD_CA_TTL))
    new_leaf = leaf_for(new_ca)
    expiry = old_ca.cert.not_valid_after_utc
    d = rig.cert_dir()
    write_dir(d, leaf=old_leaf, ca_pem=old_ca.cert_pem)
    port = free_port()
    rig.configs(f"https://127.0.0.1:{port}")
    m = rig.child(d, webhook_port=port)
    wait_ready(m)
    rig.wait_called([m.probe_url])
    paths = [rig.vwc_path, rig.mwc_path]
    watch = rig.watch(*paths)
    hammer = rig.hammer(port, {"published": watch.context})
    prober = rig.prober()

    # Phase 1: the new CA joins ca.crt; the old leaf keeps serving; the bundle becomes old + new.
    write_dir(d, leaf=old_leaf, ca_pem=pems(old_ca, new_ca))
    both = {fp(old_ca), fp(new_ca)}
    eventually(lambda: all(published(rig.kube, p) == both for p in paths), timeout=5, what="bundle = old + new CA")
    # The API server sees configuration changes through its informer; give it that moment before
    # the first leaf from the new CA is served (the self-signed issuer waits `ca_propagation`).
    time.sleep(2.0)
    assert rig.aloop.run(served_leaf(port, old_ca.cert_pem)).serial_number == old_leaf.serial

    # Phase 2: a leaf from the new CA; ca.crt now holds the new CA only.
    write_dir(d, leaf=new_leaf, ca_pem=new_ca.cert_pem)
    eventually(
        lambda: rig.aloop.run(served_leaf(port, pems(old_ca, new_ca))).serial_number == new_leaf.serial,
        timeout=5,
        what="new-CA leaf served",
    )
    left = (expiry - datetime.now(UTC)).total_seconds()
    assert left > 3, f"set-up took too long: the old CA expires in {left:.1f}s, nothing left to observe"

    # Phase 3: the old CA stays published while valid, and goes within one resync of its expiry.
    def dropped() -> bool:
        return all(fp(old_ca) not in published(rig.kube, p) for p in paths)

    eventually(dropped, timeout=left + RESYNC + SLACK + 5, interval=0.1, what="expired old CA dropped")
    dropped_at, dropped_mono = datetime.now(UTC), time.monotonic()
    time.sleep(1.0)
    rig.stop(prober)
    rig.stop(hammer)
    rig.stop(watch)

    before_expiry = [seen for at, seen in watch.samples if at < expiry - timedelta(seconds=0.3)]
    after_drop = [seen for at, seen in watch.samples if at > dropped_at]
    lag = (dropped_at - expiry).total_seconds()
    report(
        old_ca_dropped_after_expiry_s=round(lag, 2),
        handshakes=len(hammer.shots),
        failed=len(hammer.failures),
        api_calls=len(prober.calls),
        api_failed=len(prober.failures),
    )
    assert before_expiry, "no caBundle samples before the old CA expired"
    assert all(fp(old_ca) in s[p] for s in before_expiry for p in paths), "old CA left caBundle before expiring"
    assert all(s[p] == {fp(new_ca)} for s in after_drop for p in paths)
    assert 0 <= lag <= RESYNC + SLACK, f"old CA dropped {lag:.2f}s after its expiry (resync {RESYNC}s)"
    assert not prober.failures, f"API server admission calls failed: {failures_text(prober.failures)}"
    assert len(prober.calls) >= 50
    # A caBundle change makes the API server build a new client, so these calls verified the new
    # leaf against the new-CA-only bundle on fresh connections.
    assert [c for c in prober.calls if c.at > dropped_mono], "no admission call after the old CA left caBundle"
    assert not hammer.failures, f"failed handshakes: {failures_text(hammer.failures)}"
    assert {s.serial for s in hammer.shots} == {old_leaf.serial, new_leaf.serial}


# --- idempotence, foreign writes, ownership ------------------------------------------------------------


def test_no_op_reconciles_repair_of_foreign_writes_and_unlisted_config_untouched(rig: Rig) -> None:
    ca = make_ca("idem-ca")
    d = rig.cert_dir()
    write_dir(d, leaf=leaf_for(ca), ca_pem=ca.cert_pem)
    port = free_port()
    rig.configs(f"https://127.0.0.1:{port}")
    # Same shape, another name, never matching anything: not in the manager's list.
    _, other = webhook_configs(f"https://127.0.0.1:{port}", mutating="unused", validating=f"{rig.vwc}-other")
    for hook in other["webhooks"]:
        hook["objectSelector"] = {"matchLabels": {LABEL: f"{rig.token}-never"}}
        hook["failurePolicy"] = "Ignore"
    other_path = f"{VWC_PATH}/{other['metadata']['name']}"
    other_rv = rig.create(VWC_PATH, other)["metadata"]["resourceVersion"]

    m = rig.in_process_manager(d, webhook_port=port)
    wait_ready(m)
    syncer = m.manager.syncer
    assert syncer is not None
    assert not m.manager.leading, "the test manager took a Lease it should not hold"
    eventually(lambda: published(rig.kube, rig.vwc_path) == {fp(ca)}, timeout=10, what="caBundle filled")
    eventually(lambda: published(rig.kube, rig.mwc_path) == {fp(ca)}, timeout=10, what="caBundle filled")

    def metric_writes() -> float:
        # The in-process manager shares this process's registry; its series are labelled by our names.
        got = (REGISTRY.get_sample_value("sidecarctl_cabundle_writes_total", {"configuration": n}) for n in ours)
        return sum(v or 0.0 for v in got)

    ours = (rig.mwc, rig.vwc)

    rvs = {p: resource_version(rig.kube, p) for p in (rig.mwc_path, rig.vwc_path)}
    writes, counted = syncer.write_count, metric_writes()
    results = [rig.aloop.run(syncer.reconcile_once()) for _ in range(10)]
    assert all(set(r.values()) == {SyncResult.IN_SYNC} for r in results), results
    time.sleep(RESYNC + 0.5)  # and a background resync
    assert syncer.write_count == writes and metric_writes() == counted, "a no-op reconcile wrote"
    assert {p: resource_version(rig.kube, p) for p in rvs} == rvs

    repairs: dict[str, float] = {}
    foreign = make_ca("foreign-ca")
    for label, value in (("empty", b""), ("other-ca", foreign.cert_pem)):
        rig.kube.patch(
            rig.vwc_path,
            [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": base64.b64encode(value).decode()}],
            patch_type="json",
        )
        written = time.monotonic()
        eventually(
            lambda: fp(ca) in published(rig.kube, rig.vwc_path),
            timeout=RESYNC + SLACK + 3,
            interval=0.05,
            what=f"caBundle repaired after a foreign write ({label})",
        )
        repairs[label] = time.monotonic() - written
    # Policy: a valid CA found in the bundle is kept (another replica may serve from it), ours is added.
    assert published(rig.kube, rig.vwc_path) == {fp(ca), fp(foreign)}
    eventually(rig.admits, timeout=10, interval=0.1, what="the API server calls the webhook after the repair")
    report(repair_empty_s=round(repairs["empty"], 2), repair_other_ca_s=round(repairs["other-ca"], 2))
    assert all(t <= RESYNC + SLACK for t in repairs.values()), f"repair slower than one resync: {repairs}"
    assert syncer.write_count == writes + 2
    assert metric_writes() == counted + 2
    got = rig.kube.get(other_path)
    assert got["metadata"]["resourceVersion"] == other_rv, "a configuration not in the list was modified"
    assert entry_bundles(got) == [b""]


# --- two self-signed managers on one Secret -------------------------------------------------------------


def test_two_self_signed_managers_agree_on_one_ca_and_both_answer(rig: Rig) -> None:
    secret = f"certs-e2e-{rig.token}"
    service = f"certs-e2e-svc-{rig.token}"
    ports = [free_port(), free_port()]
    vwc = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": rig.vwc},
        "webhooks": [
            {
                "name": f"{tag}.certs-e2e.sidecarctl.io",
                "clientConfig": {"url": f"https://127.0.0.1:{p}{names.VALIDATE_PATH}"},
                "rules": [
                    {
                        "apiGroups": [names.GROUP],
                        "apiVersions": [names.VERSION],
                        "operations": ["CREATE"],
                        "resources": [names.PLURAL],
                        "scope": "Cluster",
                    }
                ],
                "objectSelector": rig.selector(),
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
            }
            for tag, p in zip("ab", ports, strict=True)
        ],
    }
    rig.create(VWC_PATH, vwc)
    rig.owned.append(f"{SECRETS}/{secret}")
    flags = ("--self-signed", f"--secret-name={secret}", f"--service-name={service}", "--extra-ip=127.0.0.1")
    managers = [rig.child(rig.cert_dir(), *flags, webhook_port=p, tag=f"-{i}") for i, p in enumerate(ports)]
    for m in managers:
        wait_ready(m, timeout=45)
    rig.wait_called([m.probe_url for m in managers])

    data = rig.kube.get(f"{SECRETS}/{secret}")["data"]
    cas = pem.certificates(base64.b64decode(data["ca.crt"]))
    assert len(cas) == 1, f"the Secret holds {len(cas)} CAs"
    ca = cas[0]
    ca_pem = pem.to_pem([ca])
    leaves = [rig.aloop.run(served_leaf(p, ca_pem)) for p in ports]
    for leaf in leaves:
        leaf.verify_directly_issued_by(ca)
        assert not pem.is_ca(leaf)
    assert published(rig.kube, rig.vwc_path) == {pem.fingerprint(ca)}
    before = [scrape(m.probe_url).value("sidecarctl_admissions_total", webhook="validate") for m in managers]
    for _ in range(5):
        rig.admit()
    after = [scrape(m.probe_url).value("sidecarctl_admissions_total", webhook="validate") for m in managers]
    report(self_signed_cas=len(cas), calls_a=after[0] - before[0], calls_b=after[1] - before[1])
    assert all(a - b >= 5 for a, b in zip(after, before, strict=True)), (before, after)
