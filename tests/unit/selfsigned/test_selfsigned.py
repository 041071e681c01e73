"""Self-signed mode: renewal arithmetic on fixed dates, what is issued, the two-phase CA rotation,
and several replicas converging on one CA against an API fake that enforces resourceVersion."""

from __future__ import annotations

import asyncio
import base64
import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from hypothesis import given
from hypothesis import strategies as st

from certwatcher import pem
from certwatcher.reloader import CertReloader
from selfsigned.issuer import (
    Material,
    SelfSignedConfig,
    SelfSignedIssuer,
    material_from_secret,
    plan_material,
)
from selfsigned.issuing import generate_ca, issue_leaf, renewal_due, renewal_time, service_dns_names
from tests.certutil import make_ca, make_leaf, now, utc
from tests.kube.fakeapi import FakeApiServer

# --- renewal arithmetic ------------------------------------------------------------------------------

NB, NA = utc(2030, 1, 1), utc(2030, 4, 1)  # 90 days


def test_renewal_time_is_a_third_before_not_after() -> None:
    assert renewal_time(NB, NA) == utc(2030, 3, 2)
    assert NB < renewal_time(NB, NA) < NA
    # cert-manager's outage: lifetime taken as not_before - not_after put this *after* not_after.
    wrong = NA - (NB - NA) / 3
    assert wrong > NA and renewal_time(NB, NA) != wrong


def test_renewal_due_around_the_threshold() -> None:
    assert not renewal_due(NB, NA, utc(2030, 3, 1, 23, 59, 59))
    assert renewal_due(NB, NA, utc(2030, 3, 2))
    assert renewal_due(NB, NA, utc(2030, 3, 31))


def test_three_year_ca() -> None:
    # 1096 days (2032 is a leap year): a third is 365 d 8 h.
    assert renewal_time(utc(2030, 1, 1), utc(2033, 1, 1)) == utc(2032, 1, 1, 16)


def test_not_yet_valid_and_expired() -> None:
    assert not renewal_due(NB, NA, utc(2029, 12, 1))  # whole lifetime ahead
    assert renewal_due(NB, NA, utc(2030, 4, 1, 0, 0, 1))  # expired
    assert renewal_due(NB, NA, utc(2031, 1, 1))


def test_broken_inputs() -> None:
    assert renewal_due(NA, NB, utc(2020, 1, 1))  # notAfter before notBefore: renew
    with pytest.raises(ValueError, match="not_after"):
        renewal_time(NA, NB)
    with pytest.raises(ValueError, match="timezone-aware"):
        renewal_due(datetime(2030, 1, 1), NA, NB)
    with pytest.raises(ValueError, match="fraction"):
        renewal_due(NB, NA, NB, fraction=0)


@given(
    start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1)),
    seconds=st.integers(min_value=1, max_value=20 * 365 * 86400),
    fraction=st.floats(min_value=0.01, max_value=1.0),
)
def test_renewal_time_is_inside_the_lifetime(start: datetime, seconds: int, fraction: float) -> None:
    nb = start.replace(tzinfo=utc(2000, 1, 1).tzinfo)
    na = nb + timedelta(seconds=seconds)
    at = renewal_time(nb, na, fraction=fraction)
    assert nb <= at <= na
    before = at - timedelta(seconds=1)
    assert not renewal_due(nb, na, before, fraction=fraction)
    assert renewal_due(nb, na, at, fraction=fraction) and renewal_due(nb, na, na, fraction=fraction)


# --- issuing -----------------------------------------------------------------------------------------

CFG = SelfSignedConfig(
    namespace="sidecarctl-system",
    service="sidecarctl-webhook",
    extra_dns=("localhost",),
    extra_ips=("127.0.0.1",),
)


def test_ca_and_leaf_shapes() -> None:
    t = now()
    ca = generate_ca(now=t, lifetime=timedelta(days=30))
    leaf = issue_leaf(ca, now=t, dns_names=CFG.dns_names, ip_addresses=["127.0.0.1"], lifetime=timedelta(days=90))
    ca_cert, leaf_cert = ca.cert, leaf.cert
    bc = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca
    ku = ca_cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign
    assert isinstance(ca_cert.public_key(), ec.EllipticCurvePublicKey)
    assert ca_cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]

    assert not pem.is_ca(leaf_cert) and pem.issued_by(leaf_cert, ca_cert)
    san = leaf_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "sidecarctl-webhook",
        "sidecarctl-webhook.sidecarctl-system",
        "sidecarctl-webhook.sidecarctl-system.svc",
        "sidecarctl-webhook.sidecarctl-system.svc.cluster.local",
        "localhost",
    ]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = leaf_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # The leaf never outlives its CA.
    assert leaf_cert.not_valid_after_utc == ca_cert.not_valid_after_utc
    assert leaf_cert.not_valid_before_utc <= t


def test_a_real_verifier_accepts_the_leaf_for_every_service_name() -> None:
    t = now()
    ca = generate_ca(now=t)
    leaf = issue_leaf(ca, now=t, dns_names=service_dns_names("svc", "ns"))
    for name in service_dns_names("svc", "ns"):
        verifier = PolicyBuilder().store(Store([ca.cert])).time(t).build_server_verifier(x509.DNSName(name))
        verifier.verify(leaf.cert, [])
    other = PolicyBuilder().store(Store([generate_ca(now=t).cert])).time(t).build_server_verifier(x509.DNSName("svc"))
    with pytest.raises(VerificationError):
        other.verify(leaf.cert, [])


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="namespace"):
        SelfSignedConfig(namespace="", service="s")
    with pytest.raises(ValueError, match="extra_ips"):
        SelfSignedConfig(namespace="n", service="s", extra_ips=("nope",))
    with pytest.raises(ValueError, match="leaf_lifetime"):
        SelfSignedConfig(namespace="n", service="s", leaf_lifetime=timedelta(0))
    with pytest.raises(ValueError, match="renew_fraction"):
        SelfSignedConfig(namespace="n", service="s", renew_fraction=1.5)


# --- planning ----------------------------------------------------------------------------------------

T0 = utc(2030, 1, 1)
SHORT = SelfSignedConfig(
    namespace="ns",
    service="svc",
    extra_ips=("127.0.0.1",),
    ca_lifetime=timedelta(days=300),
    leaf_lifetime=timedelta(days=30),
    ca_propagation=timedelta(minutes=5),
    backdate=timedelta(minutes=5),
)


def leaf_of(m: Material) -> x509.Certificate:
    return pem.certificates(m.cert_pem)[0]


def cas_of(m: Material) -> list[int]:
    return [c.serial_number for c in pem.certificates(m.ca_pem)]


def test_bootstrap_then_steady() -> None:
    plan = plan_material(None, SHORT, now=T0)
    assert plan.changed and all(plan.material.secret_data().values())
    assert pem.issued_by(leaf_of(plan.material), pem.certificates(plan.material.ca_pem)[0])
    again = plan_material(plan.material, SHORT, now=T0 + timedelta(days=1))
    assert not again.changed and again.material == plan.material
    # Next wake-up: the leaf's renewal time (20 days in).
    # Leaf: notBefore T0 - 5 min (backdate), notAfter T0 + 30 d; a third of 30 d 5 min before notAfter.
    assert again.wake_at == T0 + timedelta(days=20) - timedelta(seconds=100)


def test_leaf_renewed_at_two_thirds_under_the_same_ca() -> None:
    first = plan_material(None, SHORT, now=T0).material
    renew_at = renewal_time(
        pem.not_before(leaf_of(first)), pem.not_after(leaf_of(first)), fraction=SHORT.renew_fraction
    )
    assert not plan_material(first, SHORT, now=renew_at - timedelta(seconds=1)).changed
    renewed = plan_material(first, SHORT, now=renew_at)
    assert renewed.changed
    assert renewed.material.ca_pem == first.ca_pem and renewed.material.ca_key_pem == first.ca_key_pem
    assert leaf_of(renewed.material).serial_number != leaf_of(first).serial_number


def test_ca_rotation_in_two_phases_then_old_ca_pruned() -> None:
    first = plan_material(None, SHORT, now=T0).material
    old_ca = pem.certificates(first.ca_pem)[0]
    ca_renew = renewal_time(pem.not_before(old_ca), pem.not_after(old_ca), fraction=SHORT.renew_fraction)
    # A fresh leaf from the old CA a day before the CA is due.
    before = plan_material(
        Material(b"", b"", first.ca_pem, first.ca_key_pem), SHORT, now=ca_renew - timedelta(days=1)
    ).material
    assert pem.issued_by(leaf_of(before), old_ca)

    phase1 = plan_material(before, SHORT, now=ca_renew)
    assert phase1.changed and phase1.phase == "ca-propagating"
    new_ca = pem.certificates(phase1.material.ca_pem)[0]
    assert cas_of(phase1.material) == [new_ca.serial_number, old_ca.serial_number]
    assert phase1.material.cert_pem == before.cert_pem  # old leaf still served
    resign_at = ca_renew + SHORT.ca_propagation
    assert phase1.wake_at == resign_at

    assert not plan_material(phase1.material, SHORT, now=resign_at - timedelta(seconds=1)).changed
    phase2 = plan_material(phase1.material, SHORT, now=resign_at)
    assert phase2.changed and pem.issued_by(leaf_of(phase2.material), new_ca)
    assert phase2.material.ca_pem == phase1.material.ca_pem  # both CAs still in ca.crt

    after_expiry = pem.not_after(old_ca) + timedelta(seconds=1)
    pruned = plan_material(phase2.material, SHORT, now=after_expiry)
    assert cas_of(pruned.material) == [new_ca.serial_number]
    assert pem.issued_by(leaf_of(pruned.material), new_ca)


def test_replaced_ca_forces_immediate_resign() -> None:
    first = plan_material(None, SHORT, now=T0).material
    other = generate_ca(now=T0, lifetime=timedelta(days=300))
    swapped = Material(first.cert_pem, first.key_pem, other.cert_pem, other.key_pem)
    plan = plan_material(swapped, SHORT, now=T0 + timedelta(hours=1))
    assert plan.changed and pem.issued_by(leaf_of(plan.material), other.cert)
    assert any("ca.crt" in r for r in plan.reasons)


def test_san_change_and_garbage_and_expired_ca() -> None:
    first = plan_material(None, SHORT, now=T0).material
    more = SelfSignedConfig(namespace="ns", service="svc", extra_dns=("extra.example",), extra_ips=("127.0.0.1",))
    plan = plan_material(first, more, now=T0)
    assert plan.changed and "extra.example" in plan.reasons[-1]
    assert plan.material.ca_pem == first.ca_pem

    junk = Material(b"junk", b"junk", b"junk", b"junk")
    assert plan_material(junk, SHORT, now=T0).changed

    late = pem.not_after(pem.certificates(first.ca_pem)[0]) + timedelta(days=1)
    expired = plan_material(first, SHORT, now=late)
    assert cas_of(expired.material) != cas_of(first)
    assert pem.issued_by(leaf_of(expired.material), pem.certificates(expired.material.ca_pem)[0])


# --- the issuer against an API ----------------------------------------------------------------------


def test_replicas_starting_together_agree_on_one_ca(tmp_path: Path) -> None:
    api = FakeApiServer(latency=0.001)
    issuers = [SelfSignedIssuer(api, CFG, cert_dir=tmp_path / f"r{i}") for i in range(6)]

    async def main() -> list[Material]:
        return list(await asyncio.gather(*(i.reconcile() for i in issuers)))

    materials = asyncio.run(main())
    assert len({m.ca_pem for m in materials}) == 1 and len({m.cert_pem for m in materials}) == 1
    assert len(api.objects) == 1
    (secret,) = api.objects.values()
    assert material_from_secret(secret) == materials[0]
    assert len(pem.certificates(materials[0].ca_pem)) == 1
    assert sum(i.secret_writes for i in issuers) == 1
    for i in range(6):
        cert_dir = tmp_path / f"r{i}"
        assert os.path.islink(cert_dir / "..data") and not (cert_dir / "ca.key").exists()
        pair = CertReloader(cert_dir).load_initial()
        assert pair.anchor.public_bytes(serialization.Encoding.PEM) == materials[0].ca_pem


def test_secret_layout_and_update_keeps_foreign_fields() -> None:
    api = FakeApiServer()

    async def main() -> None:
        first = await SelfSignedIssuer(api, CFG, cert_dir=None).reconcile()
        path = CFG.secret_path
        secret = api.objects[path]
        assert secret["type"] == "kubernetes.io/tls"
        assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
        assert secret["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "sidecarctl"}
        assert path == "/api/v1/namespaces/sidecarctl-system/secrets/sidecarctl-webhook-certs"

        def tamper(obj: dict[str, object]) -> None:
            data = obj["data"]
            assert isinstance(data, dict)
            data["tls.key"] = base64.b64encode(b"broken").decode()
            data["note"] = base64.b64encode(b"keep me").decode()
            obj["metadata"]["annotations"] = {"a": "b"}  # type: ignore[index]

        api.foreign_write(path, tamper)
        repaired = await SelfSignedIssuer(api, CFG, cert_dir=None).reconcile()
        assert repaired.ca_pem == first.ca_pem and repaired.cert_pem != first.cert_pem
        secret = api.objects[path]
        assert secret["data"]["note"] == base64.b64encode(b"keep me").decode()
        assert secret["metadata"]["annotations"] == {"a": "b"}

    asyncio.run(main())


def test_concurrent_renewal_has_one_winner_and_everyone_adopts_it() -> None:
    api = FakeApiServer(latency=0.001)
    start = SelfSignedIssuer(api, SHORT, cert_dir=None, clock=lambda: T0)
    later = T0 + timedelta(days=25)  # the leaf is due (20 days), the CA is not

    async def main() -> list[Material]:
        first = await start.reconcile()
        issuers = [SelfSignedIssuer(api, SHORT, cert_dir=None, clock=lambda: later) for _ in range(5)]
        results = list(await asyncio.gather(*(i.reconcile() for i in issuers)))
        assert sum(i.secret_writes for i in issuers) == 1
        assert all(m.ca_pem == first.ca_pem and m.cert_pem != first.cert_pem for m in results)
        return results

    results = asyncio.run(main())
    assert len({m.cert_pem for m in results}) == 1


def test_run_writes_files_and_stops_promptly(tmp_path: Path) -> None:
    api = FakeApiServer()
    issuer = SelfSignedIssuer(api, CFG, cert_dir=tmp_path, check_interval=30)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(issuer.run(stop))
        for _ in range(100):
            if (tmp_path / "tls.crt").exists():
                break
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(task, 1)

    asyncio.run(main())
    served = CertReloader(tmp_path).load_initial()
    assert issuer.material is not None and served.cert_pem == issuer.material.cert_pem


def test_leaf_from_an_independent_helper_ca_is_replaced() -> None:
    # A Secret filled by hand with a pair from some other CA that is not in ca.crt.
    ca = make_ca("by-hand")
    leaf = make_leaf(ca)
    first = plan_material(None, CFG, now=now()).material
    hand = Material(leaf.cert_pem, leaf.key_pem, first.ca_pem, first.ca_key_pem)
    plan = plan_material(hand, CFG, now=now())
    assert plan.changed and plan.material.ca_pem == first.ca_pem
    assert pem.issued_by(leaf_of(plan.material), pem.certificates(first.ca_pem)[0])
