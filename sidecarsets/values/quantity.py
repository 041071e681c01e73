"""Kubernetes `resource.Quantity`, as apimachinery parses, adds, rounds and prints it.

Why not a Decimal: resourcesPolicy writes computed resources into pods, and Kruise computes them
with apimachinery's Quantity. Its rules decide the bytes a user sees: values are rounded up to
nano units when parsed; `MilliValue` rounds away from zero; the format of a sum is the first
non-zero addend's; a BinarySI value that is not a whole multiple prints as DecimalSI
(`memory*30%` of 1Gi is `322122547200m`); a string that already looks canonical is printed as it
was given (`+1`, `1.500` and `01m` survive). To print what Kruise prints, the same rules are
needed, including whether Go would hold a value as an int64 or as a big decimal (they round
negative milli values differently).

Only what resourcesPolicy, per-pod overrides and validation use is here: parse (and the text of a
JSON value), canonical string, add, negate, compare, sign, milli value, set-milli and the two
constructors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sidecarsets.values.gofmt import INT64_MAX, INT64_MIN, wrap_int64

DECIMAL_SI = "DecimalSI"
BINARY_SI = "BinarySI"
DECIMAL_EXPONENT = "DecimalExponent"

SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT = f"quantities must match the regular expression '{SPLIT_RE}'"
ERR_NUMERIC = "unable to parse numeric part of quantity"
ERR_SUFFIX = "unable to parse quantity's suffix"

_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_BY_EXPONENT = {v: k for k, v in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_EXPONENT = {v: k for k, v in _BINARY_SUFFIXES.items()}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
# Go accepts any int32 exponent and then computes with it (a large one hangs the API server);
# no resource needs more than this, and more digits than Python converts by default are refused.
MAX_EXPONENT = 1000
MAX_DIGITS = 1000


class QuantityError(ValueError):
    """A string that is not a quantity; the message is apimachinery's."""


@dataclass(frozen=True, slots=True)
class Quantity:
    """value = unscaled * 10**scale. `big` is Go's inf.Dec form (else its int64 form); `text` is the
    string Go keeps and prints as is, when it was parsed from one that looked canonical."""

    unscaled: int = 0
    scale: int = 0
    format: str = ""
    big: bool = False
    text: str | None = None

    def __str__(self) -> str:
        return self.text if self.text is not None else _canonical(self)

    def sign(self) -> int:
        return (self.unscaled > 0) - (self.unscaled < 0)

    def is_zero(self) -> bool:
        return self.unscaled == 0

    def cmp(self, other: Quantity) -> int:
        a, b = _aligned(self, other)
        return (a > b) - (a < b)

    def neg(self) -> Quantity:
        value = -self.unscaled if self.big else wrap_int64(-self.unscaled)
        return replace(self, unscaled=value, text=None)

    def add(self, other: Quantity) -> Quantity:
        """`q.Add(other)` on a copy of q: if q is zero, the sum takes other's format."""
        fmt = other.format if self.is_zero() else self.format
        if not self.big and not other.big:
            summed = _add_int64(self, other)
            if summed is not None:
                return Quantity(summed[0], summed[1], fmt)
        scale = min(self.scale, other.scale)
        value = self.unscaled * _p10(self.scale - scale) + other.unscaled * _p10(other.scale - scale)
        return Quantity(value, scale, fmt, big=True)

    def milli_value(self) -> int:
        """`MilliValue()`: ceil(q * 1000) as an int64, with Go's overflow and rounding rules."""
        if not self.big:
            if self.scale < -3:
                q, r = divmod(abs(self.unscaled), _p10(-3 - self.scale))
                return (q + (r != 0)) * self.sign()
            out = self.unscaled * _p10(self.scale + 3)
            return out if INT64_MIN <= out <= INT64_MAX else 0
        return _big_milli_value(self.unscaled, -self.scale)

    def set_milli(self, value: int) -> Quantity:
        """`SetMilli(value)` on a copy: the value is replaced, the format kept."""
        return Quantity(value, -3, self.format)


def new_quantity(value: int, fmt: str) -> Quantity:
    return Quantity(value, 0, fmt)


def new_milli_quantity(value: int, fmt: str) -> Quantity:
    return Quantity(value, -3, fmt)


def _p10(exponent: int) -> int:
    if exponent < 0:
        raise ValueError(f"10**{exponent} is not an integer")
    return int(10**exponent)


def _aligned(a: Quantity, b: Quantity) -> tuple[int, int]:
    scale = min(a.scale, b.scale)
    return a.unscaled * _p10(a.scale - scale), b.unscaled * _p10(b.scale - scale)


def _add_int64(a: Quantity, b: Quantity) -> tuple[int, int] | None:
    """int64Amount.Add: the sum at the smaller scale, or None when it would overflow an int64."""
    if b.unscaled == 0:
        return a.unscaled, a.scale
    if a.unscaled == 0:
        return b.unscaled, b.scale
    x, y = _aligned(a, b)
    total = x + y
    if not (INT64_MIN <= x <= INT64_MAX and INT64_MIN <= y <= INT64_MAX and INT64_MIN <= total <= INT64_MAX):
        return None
    return total, min(a.scale, b.scale)


def _big_milli_value(unscaled: int, inf_scale: int) -> int:
    """apimachinery's scaledValue for an inf.Dec: rounds up, by int64 division while it fits."""
    dif = inf_scale - 3
    if dif <= 0:
        return wrap_int64(unscaled * _p10(-dif))
    divisor = _p10(dif)
    if unscaled < INT64_MAX and dif < 19:
        small = wrap_int64(unscaled)
        result = abs(small) // divisor * (1 if small >= 0 else -1)  # Go's truncating division
        return wrap_int64(result + (small - result * divisor != 0))
    q, r = divmod(unscaled, divisor)
    return wrap_int64(wrap_int64(q) + (r != 0))


def parse(text: str) -> Quantity:
    """`resource.ParseQuantity`; raises QuantityError with apimachinery's message."""
    if not text:
        raise QuantityError(ERR_FORMAT)
    if text == "0":
        return Quantity(0, 0, DECIMAL_SI, text=text)
    positive, value, num, denom, suffix = _split(text)
    base, exponent, fmt = _interpret(suffix)
    if len(num) + len(denom) > MAX_DIGITS:
        raise QuantityError(f"{ERR_NUMERIC}: more than {MAX_DIGITS} digits")
    fast = _parse_int64(text, positive, num, denom, exponent, fmt)
    if fast is not None:
        return fast
    if not any(c in _DIGITS for c in value):
        raise QuantityError(ERR_NUMERIC)
    sign = 1 if positive else -1
    unscaled, scale = int(num + denom), -len(denom)
    if base == 10:
        scale += exponent
    else:
        unscaled <<= exponent
    if unscaled != 0:
        unscaled, scale = _round_up(unscaled, scale, -9), -9
    if fmt == BINARY_SI and unscaled != 0:
        if unscaled > INT64_MAX * 10**9:  # at nano scale; capped at the largest int64
            unscaled, scale = INT64_MAX, 0
        elif unscaled < 10**9:  # between 0 and 1: no binary suffix fits
            fmt = DECIMAL_SI
    return Quantity(sign * unscaled, scale, fmt, big=True)


def json_text(raw: object) -> str:
    """A quantity as written in a manifest or an annotation: a string, or a YAML/JSON number;
    QuantityError for anything else."""
    if isinstance(raw, str):
        return raw.strip()
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return repr(raw)
    raise QuantityError(ERR_FORMAT)


def _parse_int64(text: str, positive: bool, num: str, denom: str, exponent: int, fmt: str) -> Quantity | None:
    """ParseQuantity's int64 fast path, or None where Go takes the inf.Dec path."""
    mantissa = 1
    scale = 0
    if fmt == BINARY_SI:
        if exponent < 0 or denom:
            return None
        mantissa = 1 << exponent
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
    else:
        scale = exponent
        precision = 18 - (len(num) + len(denom))
    if precision < 0:
        return None
    scale -= len(denom)
    if scale < -9:
        return None
    shifted = num + denom
    value = int(shifted)
    if value > INT64_MAX:
        raise QuantityError(ERR_NUMERIC)
    result = value * mantissa
    if result > INT64_MAX:
        return None
    result = result if positive else -result
    if fmt == BINARY_SI:
        keep = exponent % 10 == 0 and value & 0x07 != 0
    else:
        keep = scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
    return Quantity(result, scale, fmt, text=text if keep else None)


def _split(text: str) -> tuple[bool, str, str, str, str]:
    """apimachinery's parseQuantityString: (positive, value, numerator, denominator, suffix)."""
    positive, pos, end = True, 0, len(text)
    if text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    i = pos
    while i < end and text[i] in _DIGITS:
        i += 1
    if i >= end:
        return positive, text, text[pos:], "", ""
    num, pos = text[pos:i] or "0", i
    denom = ""
    if text[pos] == ".":
        pos += 1
        i = pos
        while i < end and text[i] in _DIGITS:
            i += 1
        if i >= end:
            return positive, text, num, text[pos:], ""
        denom, pos = text[pos:i], i
    value, start = text[:pos], pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(ERR_FORMAT)
    return positive, value, num, denom, text[start:]


def _interpret(suffix: str) -> tuple[int, int, str]:
    """(base, exponent, format) of a suffix."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], BINARY_SI
    digits = suffix[1:].lstrip("+-")
    if len(suffix) > 1 and suffix[0] in "eE" and digits and all(c in _DIGITS for c in digits):
        if suffix[1:].count("+") + suffix[1:].count("-") > 1:
            raise QuantityError(ERR_SUFFIX)
        parsed = int(suffix[1:])
        if not INT64_MIN <= parsed <= INT64_MAX:
            raise QuantityError(ERR_SUFFIX)
        exponent = wrap_int32(parsed)
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(f"{ERR_SUFFIX}: exponent {exponent} is out of range")
        return 10, exponent, DECIMAL_EXPONENT
    raise QuantityError(ERR_SUFFIX)


def wrap_int32(value: int) -> int:
    value &= (1 << 32) - 1
    return value - (1 << 32) if value >= 1 << 31 else value


def _round_up(unscaled: int, scale: int, to: int) -> int:
    """unscaled * 10**scale as a multiple of 10**to, rounded away from zero."""
    if scale >= to:
        return unscaled * _p10(scale - to)
    q, r = divmod(abs(unscaled), _p10(to - scale))
    return (q + (r != 0)) * (1 if unscaled >= 0 else -1)


def _canonical(q: Quantity) -> str:
    """CanonicalizeBytes: the largest suffix that keeps the value exact."""
    if q.is_zero():
        return "0"
    fmt = q.format
    if fmt == BINARY_SI:
        # Below 1Ki, or not a whole number, no binary suffix can print it exactly.
        small = abs(q.unscaled) * _p10(max(0, q.scale)) < 1024 * _p10(max(0, -q.scale))
        if small or (q.scale < 0 and q.unscaled % _p10(-q.scale) != 0):
            fmt = DECIMAL_SI
    elif fmt not in (DECIMAL_SI, DECIMAL_EXPONENT):
        fmt = DECIMAL_EXPONENT
    if fmt == BINARY_SI:
        whole = q.unscaled * _p10(q.scale) if q.scale >= 0 else q.unscaled // _p10(-q.scale)
        amount, times = _remove_factors(whole, 1024)
        return f"{amount}{_BINARY_BY_EXPONENT.get(times * 10, '')}"
    amount, times = _remove_factors(q.unscaled, 10)
    exponent = q.scale + times
    drop = exponent % 3
    amount, exponent = amount * _p10(drop), exponent - drop
    if fmt == DECIMAL_EXPONENT:
        return f"{amount}e{exponent}" if exponent else str(amount)
    # A DecimalSI exponent past E has no suffix; apimachinery then prints the bare mantissa.
    return f"{amount}{_DECIMAL_BY_EXPONENT.get(exponent, '')}"


def _remove_factors(value: int, base: int) -> tuple[int, int]:
    sign, value, times = (-1 if value < 0 else 1), abs(value), 0
    while value >= base and value % base == 0:
        value //= base
        times += 1
    return sign * value, times
