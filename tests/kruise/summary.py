"""Counts the differential tests record, printed as the tier's summary lines at the end of the run."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

_counts: dict[str, Counter[str]] = {}
_quiet = False


def record(kind: str, outcome: str) -> None:
    """`outcome` is `equal`, `undocumented`, or `documented: <rule>`."""
    if not _quiet:
        _counts.setdefault(kind, Counter())[outcome] += 1


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Cases run a second time (to check the rules) are not counted again."""
    global _quiet
    _quiet = True
    try:
        yield
    finally:
        _quiet = False


def lines() -> list[str]:
    out = []
    for kind, counts in _counts.items():
        total = sum(counts.values())
        documented = {k.removeprefix("documented: "): v for k, v in counts.items() if k.startswith("documented: ")}
        detail = ", ".join(f"{v} {k}" for k, v in sorted(documented.items()))
        out.append(
            f"kruise differential ({kind}): {total} cases, {counts['equal']} equal, "
            f"{sum(documented.values())} documented differences{f' ({detail})' if detail else ''}, "
            f"{counts['undocumented']} undocumented"
        )
    return out
