"""Go's text formats and number conversions, where sidecarctl must say or compute what Go does.

Kruise's expression calculator and the API server are Go programs: their messages quote values
with `%q` and print numbers with `%g`, and the calculator truncates float64s to int64. Users
compare our messages and results with theirs, so these follow Go's rules rather than Python's
(`repr` quotes differently, `format(x, "g")` rounds to six digits, `int(float("inf"))` raises).
"""

from __future__ import annotations

import math
from decimal import Decimal

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

_ESCAPES = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v"}


def quote(text: str) -> str:
    """`strconv.Quote`: double quotes, Go's backslash escapes, non-printable runes as \\x, \\u or \\U."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def format_g(value: float) -> str:
    """`fmt.Sprintf("%g", value)`: the shortest digits that round-trip, exponent form below 1e-4 or from 1e6."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    # repr gives the shortest round-tripping digits, as Go's shortest formatting does.
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    point = len(digit_tuple) + exponent  # digits before the decimal point
    exp = point - 1
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def float_to_int64(value: float) -> int:
    """Go's `int64(f)` on amd64: truncation toward zero; NaN and values out of range give the minimum int64."""
    if math.isnan(value) or not -(2.0**63) <= value < 2.0**63:
        return INT64_MIN
    return int(value)


def wrap_int64(value: int) -> int:
    """The low 64 bits of `value` as a signed integer (Go's big.Int.Int64 and int64 overflow)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value > INT64_MAX else value
