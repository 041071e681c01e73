"""Kruise's upgrade order (`SortUpdateIndexes`, v1.9.1: ActivePods, then priorityStrategy, then
scatterStrategy) and ours (`upgrade_order`) on 200 generated pod sets with generated strategies, and
Kruise's own scatter sort table through Kruise's scatter sorter and ours.

Kruise's first pass is Go's unstable `sort.Slice`, so pods that tie on every ActivePods key may come
out in any order there; the generated pods never tie (distinct creation and ready times), which
leaves no choice to either side. Kruise's own sort tables are replayed in
tests/unit/rollout/test_kruise_order.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from sidecarsets.pods.projection import project
from sidecarsets.rollout.ordering import _chosen_terms, scatter_by, scatter_terms, upgrade_order
from tests.kruise import summary
from tests.kruise.oracle import Oracle
from tests.kube.builders import injected_pod, model, shop_sidecarset

SETS = 200
ZONES = ("a", "b", "c")


def _time(rng: random.Random, used: set[int]) -> str:
    while True:
        minute = rng.randrange(0, 24 * 60)
        if minute not in used:
            used.add(minute)
            return f"2024-05-01T{minute // 60:02d}:{minute % 60:02d}:00Z"


def _strategy(rng: random.Random) -> dict[str, Any]:
    strategy: dict[str, Any] = {}
    kind = rng.choice(("none", "weight", "order", "scatter", "weight+scatter", "order+scatter"))
    if "weight" in kind:
        strategy["priorityStrategy"] = {
            "weightPriority": [
                {"weight": rng.randint(1, 100), "matchSelector": {"matchLabels": {"zone": z}}}
                for z in rng.sample(ZONES, rng.randint(1, 3))
            ]
        }
    if "order" in kind:
        strategy["priorityStrategy"] = {"orderPriority": [{"orderedKey": k} for k in rng.sample(("tier", "rank"), 2)]}
    if "scatter" in kind:
        terms = [{"key": "zone", "value": rng.choice(("*", *ZONES))}]
        if rng.random() < 0.5:
            terms.append({"key": "tier", "value": rng.choice(("*", "front", "back"))})
        strategy["scatterStrategy"] = terms
    return strategy


def _pods(rng: random.Random, ss: dict[str, Any]) -> list[dict[str, Any]]:
    created: set[int] = set()
    ready: set[int] = set()
    pods = []
    for i in range(rng.randint(2, 14)):
        labels = {"zone": rng.choice(ZONES)}
        if rng.random() < 0.7:
            labels["tier"] = rng.choice(("front", "back", "front-1", "back-12"))
        if rng.random() < 0.5:
            labels["rank"] = f"r-{rng.randint(0, 20)}"
        state = rng.random()
        pods.append(
            injected_pod(
                f"pod-{i}",
                ss,
                labels=labels,
                created=_time(rng, created),
                ready_since=_time(rng, ready),
                ready=state > 0.2,
                phase="Pending" if state < 0.1 else "Running",
                node="" if state < 0.05 else "node-1",
                restarts=rng.choice((0, 0, 0, 1, 3)),
            )
        )
    return pods


def _generated() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    rng = random.Random(20261204)
    ss = shop_sidecarset()
    return [(_strategy(rng), _pods(rng, ss)) for _ in range(SETS)]


def test_upgrade_order_agrees_with_kruise(oracle: Oracle) -> None:
    generated = _generated()
    answers = oracle.ask({"op": "sort", "strategy": strategy, "pods": pods} for strategy, pods in generated)
    disagree = []
    for n, ((strategy, pods), answer) in enumerate(zip(generated, answers, strict=True)):
        assert "error" not in answer, answer["error"]
        theirs = [pods[i]["metadata"]["name"] for i in answer["order"]]
        projected = [project(p) for p in pods]
        strategy_model = model({**shop_sidecarset(), "spec": {"updateStrategy": strategy}}).update_strategy
        mine = [p.name for p in upgrade_order(projected, projected, strategy_model)]
        if mine == theirs:
            summary.record("upgrade order", "equal")
        else:
            summary.record("upgrade order", "undocumented")
            disagree.append(f"set {n} {strategy}: ours {mine}, Kruise {theirs}")
    assert not disagree, "\n".join(disagree[:5])
    # The strategies matter: in many sets they move pods away from the ActivePods order.
    plain = oracle.ask({"op": "sort", "strategy": {}, "pods": pods} for _strategy, pods in generated)
    moved = sum(a["order"] != p["order"] for a, p in zip(answers, plain, strict=True))
    assert moved >= SETS // 4, f"only {moved} of {SETS} strategies changed the order"


SCATTER_TABLES = json.loads(
    (Path(__file__).parents[1] / "unit" / "rollout" / "data" / "kruise_scatter_cases.json").read_text()
)


def test_kruises_own_scatter_tables_through_both(oracle: Oracle) -> None:
    """Kruise's scatter sort test table (pkg/util/updatesort), run through Kruise's sorter itself and
    through ours: both give the table's expected order."""
    cases = SCATTER_TABLES["sort"]
    assert len(cases) >= 20
    for case in cases:
        labels = case["podLabels"]
        pods = [None if lab is None else {"metadata": {"name": f"p{i}", "labels": lab}} for i, lab in enumerate(labels)]
        answer = oracle.one(
            {"op": "scatter", "strategy": case["strategy"], "pods": pods, "indexes": case["candidates"]}
        )
        assert "error" not in answer, answer["error"]
        slots = [
            None if lab is None else project(injected_pod(f"p{i:03d}", shop_sidecarset(), labels=lab))
            for i, lab in enumerate(labels)
        ]
        everyone = [p for p in slots if p is not None]
        order = [p for i in case["candidates"] if (p := slots[i]) is not None]
        for term in _chosen_terms(scatter_terms(case["strategy"], everyone), order):
            order = scatter_by(term, order, everyone)
        mine = [slots.index(p) for p in order]
        summary.record("upgrade order", "equal" if mine == answer["order"] else "undocumented")
        assert answer["order"] == case["expected"], case["desc"]
        assert mine == answer["order"], case["desc"]
