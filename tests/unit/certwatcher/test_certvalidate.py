"""Checks a pair must pass before it is served, and tolerant PEM bundle parsing."""

from __future__ import annotations

import ssl
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certwatcher import pem
from certwatcher.tls import (
    ALPN_PROTOCOLS,
    CertSwitch,
    CertValidationError,
    build_context,
    validate_pair,
)
from tests.certutil import KeyPair, make_ca, make_leaf, now, pems

CA = make_ca("ca-one")
OTHER_CA = make_ca("ca-two")
LEAF = make_leaf(CA)


def reason_of(cert: bytes, key: bytes, ca: bytes) -> str:
    with pytest.raises(CertValidationError) as info:
        validate_pair(cert, key, ca, now=now())
    assert info.value.message  # every refusal says why
    return info.value.reason


def test_valid_pair_passes_and_names_its_anchor() -> None:
    pair = validate_pair(LEAF.cert_pem, LEAF.key_pem, pems(OTHER_CA, CA), now=now())
    assert pair.leaf.serial_number == LEAF.serial
    assert pair.anchor.serial_number == CA.serial


def test_key_of_another_leaf_is_a_mismatch() -> None:
    other = make_leaf(CA)
    assert reason_of(LEAF.cert_pem, other.key_pem, CA.cert_pem) == "key_mismatch"


def test_half_written_files_are_parse_errors() -> None:
    assert reason_of(LEAF.cert_pem[: len(LEAF.cert_pem) // 2], LEAF.key_pem, CA.cert_pem) == "parse"
    assert reason_of(LEAF.cert_pem, LEAF.key_pem[:40], CA.cert_pem) == "parse"
    assert reason_of(LEAF.cert_pem, b"", CA.cert_pem) == "parse"
    assert reason_of(LEAF.cert_pem, LEAF.key_pem, b"") == "parse"


def test_leaf_from_another_ca_is_untrusted() -> None:
    assert reason_of(LEAF.cert_pem, LEAF.key_pem, OTHER_CA.cert_pem) == "untrusted"


def test_expired_and_future_leaves_are_refused() -> None:
    t = now()
    old = make_leaf(CA, not_before=t - timedelta(days=2), not_after=t - timedelta(seconds=1))
    future = make_leaf(CA, not_before=t + timedelta(hours=1), lifetime=timedelta(days=1))
    assert reason_of(old.cert_pem, old.key_pem, CA.cert_pem) == "expired"
    assert reason_of(future.cert_pem, future.key_pem, CA.cert_pem) == "not_yet_valid"


def test_expired_anchor_is_refused() -> None:
    t = now()
    dead_ca = make_ca("dead", not_before=t - timedelta(days=3), not_after=t - timedelta(minutes=1))
    leaf = make_leaf(dead_ca)
    assert reason_of(leaf.cert_pem, leaf.key_pem, dead_ca.cert_pem) == "expired"


def test_intermediate_in_tls_crt_is_followed() -> None:
    root = make_ca("root")
    inter = make_leaf(root, ca=True, dns=(), ips=(), cn="intermediate")
    leaf = make_leaf(inter)
    pair = validate_pair(leaf.cert_pem + inter.cert_pem, leaf.key_pem, root.cert_pem, now=now())
    assert pair.anchor.serial_number == root.serial
    # Without the intermediate the leaf does not reach the root.
    assert reason_of(leaf.cert_pem, leaf.key_pem, root.cert_pem) == "untrusted"


def test_self_signed_leaf_as_its_own_anchor() -> None:
    solo = make_ca("solo", ca=False)
    assert validate_pair(solo.cert_pem, solo.key_pem, solo.cert_pem, now=now()).anchor == solo.cert


def test_build_context_has_server_settings() -> None:
    ctx = build_context(validate_pair(LEAF.cert_pem, LEAF.key_pem, CA.cert_pem, now=now()))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.options & ssl.OP_NO_COMPRESSION
    ciphers = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert ciphers and all("ECDHE" in c and "GCM" in c for c in ciphers)


def test_front_context_refuses_until_something_is_loaded() -> None:
    switch = CertSwitch()
    assert switch.current is None
    assert switch.front.sni_callback is not None
    assert ALPN_PROTOCOLS == ("h2", "http/1.1")


# --- PEM bundles -------------------------------------------------------------------------------------

POOL: list[KeyPair] = [CA, OTHER_CA, LEAF]
junk = st.sampled_from(
    [
        b"",
        b"\n",
        b"# comment\n",
        b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        b"garbage without markers",
    ]
)
piece = st.one_of(st.sampled_from(POOL).map(lambda kp: kp.cert_pem), junk)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(piece, max_size=8))
def test_parse_finds_every_good_certificate_among_junk(pieces: list[bytes]) -> None:
    data = b"".join(pieces)
    parsed = pem.parse_bundle(data)
    known = {kp.cert_pem for kp in POOL}
    good = [p for p in pieces if p in known]
    assert [pem.to_pem([c]) for c in parsed.certs] == good
    bad = sum(1 for p in pieces if p.startswith(b"-----BEGIN") and p not in known)
    assert parsed.bad_blocks == bad


def test_dedupe_keeps_first_occurrence_order() -> None:
    certs = pem.certificates(pems(CA, OTHER_CA, CA, LEAF, OTHER_CA))
    assert [c.serial_number for c in pem.dedupe(certs)] == [CA.serial, OTHER_CA.serial, LEAF.serial]


def test_ca_detection() -> None:
    assert pem.is_ca(CA.cert) and not pem.is_ca(LEAF.cert)
    assert pem.is_self_signed(CA.cert) and not pem.is_self_signed(LEAF.cert)
    assert pem.issued_by(LEAF.cert, CA.cert) and not pem.issued_by(LEAF.cert, OTHER_CA.cert)
