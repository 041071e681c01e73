"""The order in which outdated pods get their sidecars upgraded, exactly as Kruise orders them.

Order decides which pods go first when maxUnavailable allows only a few at a time, and Kruise
users plan rollouts around it, so each of Kruise's three passes (SortUpdateIndexes) is
reproduced, Kruise's own test tables included (tests/unit/rollout/test_kruise_order.py):

1. Kubernetes' ActivePods order: pods that are least useful right now go first (unscheduled,
   Pending, not ready, ready for a shorter time, restarting more, newer).
2. `priorityStrategy`, a stable re-sort on top: weighted label terms (sum of the weights of the
   matching terms, higher first) or ordered keys (by the first key the pod has; pods with none of
   the keys first, then by key position, then the integer at the end of the value, higher first).
3. `scatterStrategy`: `key=value` terms (`*`: one term per value the matched pods carry) are
   chosen and ordered by how many candidates each matches, then applied one after the other to
   the whole list, each spreading its pods through the order in groups sized from the counts
   over **all** matched pods, the already upgraded ones too. That is what keeps a zone spread out
   from one reconcile to the next, since the order is derived again on every pass.

Ties the passes leave keep namespace/name order, whatever order pods arrive in (Kruise keeps
its input order, which is the informer's: any tie-break is theirs too).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sidecarsets.pods.projection import PodProjection
from sidecarsets.spec import selectors
from sidecarsets.spec.strategies import UpdateStrategy

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


_INT64_MAX = 2**63 - 1


def _suffix_int(value: str) -> int:
    """The integer formed by the trailing digits of a label value (0 without any, or past int64)."""
    digits = len(value) - len(value.rstrip("0123456789"))
    if not digits:
        return 0
    n = int(value[len(value) - digits :])
    return n if n <= _INT64_MAX else 0


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
                try:
                    weights.append((w, selectors.matcher(sel)))
                except selectors.SelectorError:
                    continue  # as Kruise: a term whose selector does not parse is skipped
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
            return (-1, 0)  # none of the keys: first (Kruise's level -1)

        return by_order
    return None


Term = tuple[str, str]


def scatter_terms(terms: Any, pods: Sequence[PodProjection]) -> list[Term]:
    """The scatter terms with `value: "*"` expanded, in spec order: one term per value the matched
    `pods` carry (in pod order), each (key, value) once, the first occurrence kept."""
    out: list[Term] = []
    for term in terms if isinstance(terms, list | tuple) else []:
        if not isinstance(term, Mapping) or not isinstance(term.get("key"), str) or not term["key"]:
            continue
        key, value = term["key"], term.get("value")
        if value == "*":
            found = [(key, p.labels[key]) for p in pods if key in p.labels]
        elif isinstance(value, str):
            found = [(key, value)]
        else:
            continue
        out.extend(t for t in dict.fromkeys(found) if t not in out)
    return out


def _chosen_terms(terms: list[Term], candidates: Sequence[PodProjection]) -> list[Term]:
    """A single term as is; otherwise the terms some candidate carries, most carried first."""
    if len(terms) == 1:
        return terms
    counted = [(t, sum(1 for p in candidates if p.labels.get(t[0]) == t[1])) for t in terms]
    kept = [(t, n) for t, n in counted if n > 0]
    kept.sort(key=lambda tn: -tn[1])  # stable: equal counts keep spec order
    return [t for t, _ in kept]


def _go_round(x: float) -> int:
    """math.Round: halves away from zero (Python's round() goes to even)."""
    return math.floor(x + 0.5)


def _f32(x: float) -> float:
    """The value as a float32 (Kruise compares these ratios in float32)."""
    value: float = struct.unpack("f", struct.pack("f", x))[0]
    return value


def _group(m: int, u: int) -> tuple[int, int, int]:
    n = min(m, u)
    return _go_round(m / n), _go_round(u / n), n


def _density(total_m: int, total_u: int, m: int, u: int) -> tuple[int, int, int, int]:
    """(matched per group, others per group, groups, others placed first)."""
    if _f32(_f32(total_u) / _f32(total_m)) >= _f32(_f32(u) / _f32(m)):
        ms, us, n = _group(m, u)
        return ms, us, n, 0
    ms, us, _ = _group(total_m, total_u)
    n = m // ms if m // ms < u // us else u // us
    return ms, us, n, u - n * us


def scatter_by(term: Term, order: Sequence[PodProjection], pods: Sequence[PodProjection]) -> list[PodProjection]:
    """`order` with the pods carrying `term` spread through it (Kruise's scatterPodsByRule).

    A pod without the key counts as carrying "" (so a term with value "" matches it). The last
    carrier goes to the very end; the others are dealt out in groups whose sizes follow the
    share of carriers among all matched `pods` (or among the candidates, when that spreads them
    wider).
    """
    key, value = term
    matched = [p for p in order if p.labels.get(key, "") == value]
    others = [p for p in order if p.labels.get(key, "") != value]
    if len(matched) <= 1 or len(others) <= 1:
        return list(order)
    total_m = sum(1 for p in pods if p.labels.get(key, "") == value)
    total_u = len(pods) - total_m
    last = matched.pop()
    ms, us, groups, first = _density(total_m - 1, total_u, len(matched), len(others))
    out = others[:first]
    others = others[first:]
    for _ in range(groups):
        out += matched[:ms]
        matched = matched[ms:]
        out += others[:us]
        others = others[us:]
    return [*out, *matched, *others, last]


def upgrade_order(
    candidates: Sequence[PodProjection], matched: Sequence[PodProjection], strategy: UpdateStrategy
) -> list[PodProjection]:
    """Candidates in upgrade order under `updateStrategy`: ActivePods, priority, then scatter
    (terms expanded over, and group sizes counted over, every matched pod)."""
    order = sorted(candidates, key=active_pods_key)
    key = priority_key(strategy.priority)
    if key is not None:
        order.sort(key=key)
    if strategy.scatter:
        everyone = sorted(matched, key=lambda p: (p.namespace, p.name, p.uid))
        for term in _chosen_terms(scatter_terms(list(strategy.scatter), everyone), order):
            order = scatter_by(term, order, everyone)
    return order
