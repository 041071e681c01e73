"""The order in which outdated pods get their sidecars upgraded.

Order decides which pods go first when maxUnavailable allows only a few at a time, so it
follows the rules Kruise users already rely on, applied in three layers:

1. Kubernetes' ActivePods order: pods that are least useful right now go first (unscheduled,
   Pending, not ready, ready for a shorter time, restarting more, newer).
2. `priorityStrategy`, a stable re-sort on top: weighted label terms (sum of weights of the
   matching terms, higher first) or ordered keys (the integer at the end of the label value,
   higher first; pods without any of the keys last).
3. `scatterStrategy`: pods carrying a given `key=value` (`*`: each value of the key) are
   spread evenly through the order instead of bunching up, so one zone or rack is not
   upgraded all at once. Kruise spreads term by term, where a later term can undo an
   earlier one; here all values of a key are interleaved together.

Every step is deterministic: ties end in namespace/name order, whatever order pods arrive in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sidecarsets import selectors
from sidecarsets.projection import PodProjection
from sidecarsets.strategies import UpdateStrategy

_PHASE_ORDINAL = {"Pending": 0, "Unknown": 1, "Running": 2}


@lru_cache(maxsize=4096)  # replicas share creation and ready times: each is parsed once, not once per pod
def _epoch(timestamp: str) -> float | None:
    if not timestamp:
        return None
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _zero_first_newer_first(timestamp: str) -> tuple[int, float]:
    """Empty time < later time < earlier time (Kubernetes' afterOrZero)."""
    t = _epoch(timestamp)
    return (0, 0.0) if t is None else (1, -t)


def active_pods_key(pod: PodProjection) -> tuple[Any, ...]:
    ready_time = _zero_first_newer_first(pod.ready_since) if pod.ready else (0, 0.0)
    max_restarts = max((cs.restart_count for cs in pod.container_statuses), default=0)
    return (
        1 if pod.node_name else 0,
        _PHASE_ORDINAL.get(pod.phase, 0),
        1 if pod.ready else 0,
        ready_time,
        -max_restarts,
        _zero_first_newer_first(pod.creation_timestamp),
        pod.namespace,
        pod.name,
        pod.uid,
    )


def _suffix_int(value: str) -> int:
    digits = len(value) - len(value.rstrip("0123456789"))
    return int(value[len(value) - digits :]) if digits else 0


def priority_key(strategy: Any) -> Callable[[PodProjection], Any] | None:
    """A sort key function for `priorityStrategy`, or None when it orders nothing.

    Weight terms win when both kinds are given (admission refuses that combination anyway).
    """
    if not isinstance(strategy, Mapping):
        return None
    weights: list[tuple[int, Callable[[Mapping[str, str]], bool]]] = []
    for term in strategy.get("weightPriority") or []:
        if isinstance(term, Mapping):
            w, sel = term.get("weight"), term.get("matchSelector")
            if isinstance(w, int) and isinstance(sel, Mapping):
                weights.append((w, selectors.matcher(sel)))
    if weights:

        def by_weight(pod: PodProjection) -> int:
            return -sum(w for w, selected in weights if selected(pod.labels))

        return by_weight
    keys: list[str] = []
    for term in strategy.get("orderPriority") or []:
        if isinstance(term, Mapping) and isinstance(term.get("orderedKey"), str):
            keys.append(term["orderedKey"])
    if keys:

        def by_order(pod: PodProjection) -> tuple[int, int]:
            for level, key in enumerate(keys):
                value = pod.labels.get(key)
                if value is not None:
                    return (level, -_suffix_int(value))
            return (len(keys), 0)

        return by_order
    return None


def scatter_groups(terms: Any, pods: Sequence[PodProjection]) -> list[tuple[str, list[str]]]:
    """Scatter terms as (key, values), one entry per key in spec order.

    `value: "*"` stands for every value of the key seen on the matched pods (sorted, so the
    result does not depend on pod order).
    """
    by_key: dict[str, list[str]] = {}
    for term in terms if isinstance(terms, list) else []:
        if not isinstance(term, Mapping) or not isinstance(term.get("key"), str) or not term["key"]:
            continue
        key, value = term["key"], term.get("value")
        if value == "*":
            values = sorted({p.labels[key] for p in pods if key in p.labels})
        elif isinstance(value, str):
            values = [value]
        else:
            continue
        named = by_key.setdefault(key, [])
        named.extend(v for v in values if v not in named)
    return list(by_key.items())


def spread(order: Sequence[PodProjection], key: str, values: Sequence[str]) -> list[PodProjection]:
    """Interleave the pods so that each named `key=value` group is spread evenly.

    Pods whose value is not named form one more group. The j-th of a group's s pods is placed
    at the midpoint (j + 1/2) / s of the order; ties keep the current order, and so does the
    order inside each group.
    """
    named = set(values)

    def group(p: PodProjection) -> str | None:
        value = p.labels.get(key)
        return value if value in named else None

    sizes: dict[str | None, int] = {}
    for p in order:
        g = group(p)
        sizes[g] = sizes.get(g, 0) + 1
    if len(sizes) <= 1:
        return list(order)
    seen: dict[str | None, int] = {}
    placed: list[tuple[float, int, PodProjection]] = []
    for i, p in enumerate(order):
        g = group(p)
        j = seen[g] = seen.get(g, -1) + 1
        placed.append(((2 * j + 1) / (2 * sizes[g]), i, p))
    placed.sort(key=lambda t: (t[0], t[1]))
    return [p for _, _, p in placed]


def upgrade_order(
    candidates: Sequence[PodProjection], matched: Sequence[PodProjection], strategy: UpdateStrategy
) -> list[PodProjection]:
    """Candidates in upgrade order under `updateStrategy` (priority and scatter).

    Scatter keys are applied last to first, so where two keys pull different ways the first
    key listed has the final say.
    """
    order = sorted(candidates, key=active_pods_key)
    key = priority_key(strategy.priority)
    if key is not None:
        order.sort(key=key)
    for k, values in reversed(scatter_groups(list(strategy.scatter), matched)):
        order = spread(order, k, values)
    return order
