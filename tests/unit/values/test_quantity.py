"""resource.Quantity as apimachinery has it: what it accepts, what it prints, how it adds and rounds.

The printed forms in PRINTED were read back from kube-apiserver 1.37 (a pod created with each value
as a cpu limit, `--dry-run=server`); the errors are the API server's answers to the same values.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecarsets.values import quantity
from sidecarsets.values.quantity import Quantity, QuantityError

PRINTED = [
    ("100m", "100m"),
    ("1000m", "1"),
    ("0.5", "500m"),
    ("1.0", "1"),
    ("10.000", "10"),
    ("1e2", "100"),
    ("1.5e3", "1500"),
    ("1e-2", "10e-3"),
    ("12e-1", "1200e-3"),
    ("1E", "1E"),
    ("5000P", "5E"),
    ("1Ki", "1Ki"),
    ("1024Ki", "1Mi"),
    ("1536Ki", "1536Ki"),
    ("2048Mi", "2Gi"),
    ("0.5Ki", "512"),
    ("0.1Ki", "102400m"),
    ("0.001Ki", "1024m"),
    ("1.5Gi", "1536Mi"),
    ("0.75Mi", "768Ki"),
    ("9223372036854775807Ki", "9223372036854775807"),  # BinarySI is capped at the largest int64
    ("123456789012345678901234567890", "123456789012345678901234567890"),
    ("1e21", "1e21"),
    # apimachinery has no DecimalSI suffix past E and prints the bare mantissa.
    ("1000E", "1"),
    # Strings that already look canonical are kept as given.
    ("+1", "+1"),
    ("1.", "1."),
    ("1.500", "1.500"),
    ("01m", "01m"),
    ("00100", "00100"),
    ("1e+3", "1e+3"),
    ("1E3", "1E3"),
    ("-0", "0"),
    (".", "0"),
    ("0", "0"),
]


@pytest.mark.parametrize(("text", "printed"), PRINTED)
def test_parse_then_print_as_the_api_server(text: str, printed: str) -> None:
    assert str(quantity.parse(text)) == printed


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "1e1.5", "1e.5", "1Qi", "1e3m", "1 m", "1Mb"])
def test_format_errors(text: str) -> None:
    with pytest.raises(QuantityError, match=r"^quantities must match the regular expression") as err:
        quantity.parse(text)
    assert str(err.value) == quantity.ERR_FORMAT


@pytest.mark.parametrize("text", ["1ki", "1e", "1mm", "1Mm", "1e+"])
def test_suffix_errors(text: str) -> None:
    with pytest.raises(QuantityError, match=r"^unable to parse quantity's suffix$"):
        quantity.parse(text)


def test_a_huge_exponent_is_refused_rather_than_computed() -> None:
    # kube-apiserver 1.37 times out on a pod with this value.
    with pytest.raises(QuantityError, match="out of range"):
        quantity.parse("1e99999999999")


def test_values_are_rounded_up_to_nano_units() -> None:
    assert str(quantity.parse("0.0000000001")) == "1n"
    assert str(quantity.parse("1.0000000001")) == "1000000001n"
    assert quantity.parse("-0.0000000001").sign() == -1  # away from zero


def test_the_first_non_zero_addend_gives_the_sum_its_format() -> None:
    zero = quantity.new_quantity(0, quantity.DECIMAL_SI)
    total = zero.add(quantity.parse("1Gi")).add(quantity.parse("512Mi"))
    assert str(total) == "1536Mi"
    assert str(quantity.parse("100m").add(quantity.parse("1Gi"))) == "1073741824100m"
    # A zero left side takes the right side's format even when the sum is printed in another.
    assert quantity.Quantity().add(quantity.parse("1Ki")).format == quantity.BINARY_SI


def test_sums_past_int64_switch_to_big_decimals() -> None:
    big = quantity.parse("9223372036854775807")
    total = big.add(big)
    assert total.big and str(total) == "18446744073709551614"


def test_binary_values_that_are_not_whole_print_as_decimal() -> None:
    thirty_percent = quantity.parse("1Gi").set_milli(322122547200)
    assert str(thirty_percent) == "322122547200m"
    assert str(quantity.parse("1Gi").set_milli(1024 * 1000)) == "1Ki"
    assert str(quantity.parse("1Ki").set_milli(1000 * 1000)) == "1k"  # under 1Ki: DecimalSI


@pytest.mark.parametrize(
    ("text", "milli"),
    [("1", 1000), ("1m", 1), ("1500u", 2), ("1u", 1), ("-1500u", -2), ("1.5Gi", 1610612736000), ("0", 0)],
)
def test_milli_value_rounds_away_from_zero(text: str, milli: int) -> None:
    assert quantity.parse(text).milli_value() == milli


def test_milli_value_of_an_int64_that_overflows_is_zero_as_in_go() -> None:
    assert quantity.parse("9e18").milli_value() == 0


def test_negation_and_comparison() -> None:
    a, b = quantity.parse("1"), quantity.parse("1000m")
    assert a.cmp(b) == 0 and a.cmp(quantity.parse("999m")) == 1
    assert str(a.neg()) == "-1" and a.neg().cmp(a) == -1
    assert str(quantity.parse("+1").neg().neg()) == "1"  # arithmetic drops the kept string


@given(st.integers(min_value=-(10**15), max_value=10**15), st.sampled_from(["", "m", "k", "Mi", "Gi", "u", "n"]))
def test_printing_and_parsing_round_trip(value: int, suffix: str) -> None:
    q = quantity.parse(f"{value}{suffix}")
    assert quantity.parse(str(q)).cmp(q) == 0


def test_default_is_go_zero() -> None:
    zero = Quantity()
    assert zero.is_zero() and str(zero) == "0" and zero.format == ""
