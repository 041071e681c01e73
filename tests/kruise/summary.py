"""Counts the differential tests record, printed as the tier's summary lines at the end of the run."""

from __future__ import annotations

from collections import Counter

_counts: dict[str, Counter[str]] = {}


def record(kind: str, outcome: str) -> None:
    """`outcome` is `equal`, `undocumented`, or `documented: <rule>`."""
    _counts.setdefault(kind, Counter())[outcome] += 1


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
