"""IntOrString values such as `partition: 30%` or `maxUnavailable: 2`.

Percentages round up (Kruise #1834: `5%` of 10 pods is 1, not 0, so a rollout never stalls).
"""

from __future__ import annotations

import math
import re
from typing import Any

_PERCENT = re.compile(r"^(\d+)%$")


class IntOrPercentError(ValueError):
    """Not a non-negative integer or an integer percentage."""


def parse(value: Any) -> tuple[int, bool]:
    """Return (number, is_percent); raise IntOrPercentError on anything else."""
    if isinstance(value, bool):
        raise IntOrPercentError(f"{value!r} is not an integer or a percentage")
    if isinstance(value, int):
        if value < 0:
            raise IntOrPercentError(f"{value} must be >= 0")
        return value, False
    if isinstance(value, str):
        m = _PERCENT.match(value)
        if m:
            n = int(m.group(1))
            if n > 100:
                raise IntOrPercentError(f"{value} must not be more than 100%")
            return n, True
    raise IntOrPercentError(f"{value!r} is not a non-negative integer or a percentage like '10%'")


def scaled(value: Any, total: int, *, default: int = 0) -> int:
    """Resolve against `total`, rounding percentages up. None gives `default`."""
    if value is None:
        return default
    n, pct = parse(value)
    return math.ceil(n * total / 100) if pct else n
