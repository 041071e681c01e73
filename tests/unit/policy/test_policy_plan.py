"""Which SidecarSets MutatingAdmissionPolicies serve, grouped how, and what the webhook keeps.

What the generated CEL does to pods is shown against the real API server by the differential
tier (tests/e2e/test_policy_differential_e2e.py); here: the routes, the groups, the reasons, the
objects' shape, and the CEL text helpers whose output the API server must parse.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from injector.policy import bundle, cel, generate, partscache, plan, selecting
from injector.policy.plan import Mode, Path, Why
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

TS = "2024-01-01T00:00:00Z"
NS = "sidecarctl-system"


def ss(name: str, app: str = "web", **spec: Any) -> SidecarSet:
    selector = spec.pop("selector", {"matchLabels": {"app": app}})
    return SidecarSet.from_object(builders.sidecarset(name, selector=selector, **spec))


def hot(name: str = "proxy") -> dict[str, Any]:
    return builders.container(
        name, "proxy:1", upgradeStrategy={"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}
    )


def planned(*sets: SidecarSet, mode: Mode = Mode.AUTO, **kw: Any) -> plan.Plan:
    return plan.plan(sets, mode=mode, manager_namespace=NS, timestamp=TS, **kw)


P0 = bundle.NAME_PREFIX + "0"


def variables(g: generate.Generated) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in g.policy["spec"]["variables"]}


def test_a_plain_sidecarset_gets_a_policy_and_a_binding() -> None:
    p = planned(ss("mesh"))
    assert [g.name for g in p.policies] == [P0]
    route = p.routes["mesh"]
    assert (route.path, route.why, route.policy) == (Path.POLICY, Why.POLICY_SERVED, P0)
    assert route.condition() == ("True", "PolicyServed", f"MutatingAdmissionPolicy {P0}")
    policy, binding = p.policies[0].policy, p.policies[0].binding
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail" and spec["reinvocationPolicy"] == "Never"
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    # One label to parse per write: the system namespaces are a test of the condition, after the
    # lookup that turns away the pods none of its groups could select.
    assert spec["matchConstraints"]["namespaceSelector"] == {"matchLabels": {names.NS_INJECTION_LABEL: "enabled"}}
    excluded = f'["kube-node-lease", "kube-public", "kube-system", "{NS}"]'
    condition = spec["matchConditions"][0]["expression"]
    assert condition.startswith(f"({selecting.pods_selected([ss('mesh')], approximate=True)})")
    assert f"!(request.namespace in {excluded})" in condition
    opt_out = spec["matchConstraints"]["objectSelector"]["matchExpressions"]
    assert opt_out == [
        {"key": names.POD_INJECT_LABEL, "operator": "NotIn", "values": ["false"]},
        {"key": "app", "operator": "In", "values": ["web"]},  # what every group of it requires
    ]
    assert [m["patchType"] for m in spec["mutations"]] == ["JSONPatch"]
    # The policy's condition asks whether one of its groups could select the pod (a set lookup);
    # the group's own variable decides exactly, its selector first.
    [gates] = spec["matchConditions"]
    assert '("app" in l && l["app"] == "web")' in gates["expression"]
    selects = f"(({cel.selector({'matchLabels': {'app': 'web'}}, 'variables.labels')}))"
    group = variables(p.policies[0])["groups0"]
    assert group.startswith("[(0 in variables.candidates ? (") and f"({selects} // a-member-selects-the-pod" in group
    assert binding["spec"] == {
        "policyName": P0,
        "paramRef": {"name": P0, "namespace": NS, "parameterNotFoundAction": "Deny"},
        "matchResources": {"objectSelector": {"matchExpressions": opt_out[:1]}},
    }, "the binding matches every pod its policy may see, and refuses them without its parameter object"
    assert spec["paramKind"] == {"apiVersion": "v1", "kind": "PodTemplate"}
    # Nothing for the webhook but what a policy declines.
    assert p.webhook_condition.startswith("(false) || (")
    assert p.webhook_condition.endswith(f"({plan.policies_decline([ss('mesh')])})")


def test_the_namespace_field_and_selector_are_a_guard_of_the_mutation() -> None:
    p = planned(ss("mesh", namespace="shop"))
    go = variables(p.policies[0])["groups0"]
    assert f'{cel.NAMESPACE_LABELS}["{names.NS_NAME_LABEL}"] == "shop"' in go
    assert "namespaceObject" not in p.policies[0].policy["spec"]["matchConditions"][0]["expression"]


def test_many_groups_share_few_policies_and_each_keeps_its_own_code() -> None:
    sets = [ss(f"team-{k:03}", selector={"matchLabels": {"team": f"t{k}"}}) for k in range(250)]
    p = planned(*sets)
    assert 4 <= len(p.policies) <= 5, [g.name for g in p.policies]
    assert all(len(g.groups) <= bundle.MAX_GROUPS for g in p.policies)
    assert all(len(orjson.dumps(g.policy)) <= bundle.MAX_BYTES + 64 * 1024 for g in p.policies)
    assert sorted(m for g in p.policies for m in g.members) == sorted(s.name for s in sets)
    first = p.policies[0]
    spec = first.policy["spec"]
    assert len(spec["mutations"]) == 1
    assert "(0 in variables.chunks ? variables.groups0 : []) + " in spec["mutations"][0]["jsonPatch"]["expression"]
    [gates] = spec["matchConditions"]
    assert len(gates["expression"]) < 5000, "the groups' selectors as one set lookup, not one term each"
    assert {"groups0", "groups1", "candidates", "anns", "labels"} <= set(variables(first))
    assert len(variables(first)) <= 12 + len(first.groups), (
        "one variable per group: the API server builds one entry per variable per pod"
    )


def test_the_mutation_reads_only_the_variables_that_hold_a_candidate_group() -> None:
    sets = [ss(f"team-{k:03}", selector={"matchLabels": {"team": f"t{k}"}}) for k in range(40)]
    [g] = planned(*sets).policies
    found = variables(g)
    held = {k: found[f"groups{k}"] for k in range(len(found)) if f"groups{k}" in found}
    assert len(held) > 1, "several groups per variable, several variables"
    # `chunks` maps each candidate group index to the one variable holding that group's code.
    prefix, _, rest = found["chunks"].partition(".map(j, ")
    assert prefix == "variables.candidates"
    chunk_of = orjson.loads(rest.removesuffix("[j])"))
    assert len(chunk_of) == len(sets)
    for j, k in enumerate(chunk_of):
        assert f"({j} in variables.candidates ? (" in held[k], (j, k)
        assert all(f"({j} in variables.candidates ? (" not in v for o, v in held.items() if o != k), (j, k)
    mutation = g.policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
    assert "variables.groups" not in mutation.replace(
        " + ".join(f"({k} in variables.chunks ? variables.groups{k} : [])" for k in held), ""
    ), "every variable behind its guard, none read unguarded"


def test_one_variable_of_groups_needs_no_guard() -> None:
    [g] = planned(ss("mesh")).policies
    assert "chunks" not in variables(g)
    assert g.policy["spec"]["mutations"][0]["jsonPatch"]["expression"].startswith("(variables.groups0)")


def test_packing_keeps_groups_where_they_were() -> None:
    sets = [ss(f"team-{k:03}", selector={"matchLabels": {"team": f"t{k}"}}) for k in range(250)]
    p = planned(*sets)
    before = {m: g.name for g in p.policies for m in g.members}
    # The first policy's oldest member goes; the others stay where they were, and a new set
    # joins a policy with room: one or two policies change, not all of them.
    again = planned(*sets[1:], ss("team-new", selector={"matchLabels": {"team": "new"}}), previous=before)
    after = {m: g.name for g in again.policies for m in g.members}
    assert all(after[m] == before[m] for m in after if m in before)
    changed = [
        g.name for g in again.policies if g.policy != next((o.policy for o in p.policies if o.name == g.name), None)
    ]
    assert len(changed) <= 2, changed


@pytest.mark.parametrize(
    ("spec", "feature"),
    [
        ({"containers": [hot()]}, "HotUpgrade"),
        ({"injectionStrategy": {"revision": {"revisionName": "mesh-abc", "policy": "Always"}}}, "revision"),
        ({"metadata": {"annotations": {names.ANN_INJECTION_PATH: "webhook"}}}, "injection-path=webhook"),
    ],
)
def test_what_a_policy_cannot_express_stays_on_the_webhook_named(spec: dict[str, Any], feature: str) -> None:
    p = planned(ss("mesh", **spec), ss("other", app="other"))
    route = p.routes["mesh"]
    assert (route.path, route.why) == (Path.WEBHOOK, Why.NEEDS_WEBHOOK)
    assert feature in route.message
    assert route.condition()[0] == "False"
    assert [g.members for g in p.policies] == [["other"]]
    # The webhook takes the pods that set selects; the policy of `other` leaves them to it.
    selects_mesh = f'[{cel.LABELS}].exists(l, ("app" in l && l["app"] == "web"))'
    assert selecting.pods_selected([ss("mesh", **spec)]) == selects_mesh
    assert p.webhook_condition.startswith(f"({selects_mesh}) || (")
    # `other` cannot select mesh's pods: its policy need not exclude them.
    assert "// not-for-the-webhook" not in variables(p.policies[0])["groups0"]
    near = planned(ss("mesh", **spec), ss("other", selector={"matchLabels": {"tier": "x"}}))
    go = variables(near.policies[0])["groups0"]
    assert f"(!({plan.policy_excludes([ss('mesh', **spec)])})) // not-for-the-webhook" in go


def test_one_label_selectors_are_one_lookup_per_key_and_the_rest_stay_exact() -> None:
    sets = [
        ss("a", selector={"matchLabels": {"team": "t1"}}),
        ss("b", selector={"matchExpressions": [{"key": "team", "operator": "In", "values": ["t2", "t3"]}]}),
        ss("c", selector={"matchLabels": {"app": "web", "tier": "x"}}),
        ss("d", selector={"matchLabels": {"app": "api"}}, namespace="shop"),
    ]
    got = selecting.pods_selected(sets)
    assert '("team" in l && l["team"] in ["t1", "t2", "t3"])' in got
    assert '("app" in l && l["app"] == "web") && ("tier" in l && l["tier"] == "x")' in got
    assert 'request.namespace}["kubernetes.io/metadata.name"] == "shop"' in got, "namespace names decided here"
    approx = selecting.pods_selected(sets, approximate=True)
    assert '("app" in l && l["app"] in ["api", "web"])' in approx and "tier" not in approx, "one required label each"
    loose = ss("e", selector={"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["t1"]}]})
    assert selecting.pods_selected([*sets, loose], approximate=True) == "true", "no required label: every pod"


@pytest.mark.parametrize("count", [1000, 3000])
def test_the_narrowing_fits_the_api_servers_limit_at_any_number_of_sidecarsets(count: int) -> None:
    """One-label SidecarSets cost about nine characters each, whichever path serves them (about
    10,000 fit); past the limit the others fall back to one required label each."""
    hooks = [ss(f"w{k}", metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}},
                selector={"matchLabels": {"team": f"w{k}"}}) for k in range(count)]  # fmt: skip
    policies = [ss(f"p{k}", selector={"matchLabels": {"team": f"p{k}"}}) for k in range(count)]
    complex_ = [
        ss(
            f"c{k}",
            metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}},
            selector={"matchLabels": {"app": f"c{k}", "tier": "web"}},
        )
        for k in range(count)
    ]
    condition = plan.webhook_condition([*hooks, *complex_], policies, Mode.AUTO)
    assert len(condition) <= selecting.MAX_CONDITION_CHARS, len(condition)
    assert condition.count(" in l") <= 8, "a lookup per label key, not per SidecarSet"


def test_what_policies_decline_costs_a_policy_served_pod_one_lookup_not_a_term_per_sidecarset() -> None:
    """Every policy-served pod evaluates the decline test: read by anchors (`team`), not the exact
    two-label selector of each policy-served SidecarSet sharing that key."""
    policies = [ss(f"p{k}", selector={"matchLabels": {"team": f"p{k}", "kind": "p"}}) for k in range(60)]
    hooks = [
        ss(f"w{k}", metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}},
           selector={"matchLabels": {"team": f"w{k}", "kind": "p"}})
        for k in range(20)
    ]  # fmt: skip
    declines = plan.policies_decline(policies)
    assert '"kind"' not in declines and declines.count('("team" in l') == 1
    condition = plan.webhook_condition(hooks, policies, Mode.AUTO)
    assert condition.count('("kind" in l && l["kind"] == "p")') == 20, "the webhook's own sets stay exact"


def test_overlapping_sidecarsets_are_one_group_in_name_order() -> None:
    p = planned(ss("zeta"), ss("alpha"), ss("solo", app="other"))
    [policy] = p.policies
    assert sorted(policy.groups) == [["alpha", "zeta"], ["solo"]]
    assert p.routes["alpha"].policy == p.routes["zeta"].policy == p.routes["solo"].policy == P0


def test_groups_are_connected_components() -> None:
    a = ss("a", selector={"matchLabels": {"x": "1"}})
    b = ss("b", selector={"matchLabels": {"y": "1"}})  # may share pods with a and with c
    c = ss("c", selector={"matchLabels": {"x": "2"}})  # never with a
    d = ss(
        "d",
        selector={
            "matchExpressions": [
                {"key": "x", "operator": "DoesNotExist"},
                {"key": "y", "operator": "In", "values": ["2"]},
            ]
        },
    )
    groups = plan.overlap_groups([a, b, c, d])
    assert [[s.name for s in g] for g in groups] == [["a", "b", "c"], ["d"]]


def test_disjoint_namespace_selectors_split_groups() -> None:
    shop = ss("shop-mesh", namespace="shop")
    pay = ss("pay-mesh", namespace="payments")
    assert len(plan.overlap_groups([shop, pay])) == 2


def test_paused_and_selectorless_sets_inject_nothing() -> None:
    p = planned(ss("paused", injectionStrategy={"paused": True}))
    assert p.policies == ()
    assert p.routes["paused"].path is Path.NONE
    assert p.routes["paused"].condition() == (
        "False",
        "NotInjecting",
        "injection paused or no selector: nothing is injected",
    )


def test_webhook_mode_and_an_unsupported_server_leave_everything_to_the_webhook() -> None:
    for p, why in (
        (planned(ss("mesh"), mode=Mode.WEBHOOK), Why.WEBHOOK_MODE),
        (planned(ss("mesh"), unsupported="no MAP here"), Why.UNSUPPORTED),
    ):
        assert p.policies == ()
        assert p.webhook_condition == "true"
        assert (p.routes["mesh"].path, p.routes["mesh"].why) == (Path.WEBHOOK, why)
    assert planned(ss("mesh"), unsupported="no MAP here").routes["mesh"].message == "no MAP here"


def test_a_policy_the_api_server_refused_moves_its_sets_to_the_webhook() -> None:
    p = planned(ss("mesh"), refused={"mesh": "the API server refused its MutatingAdmissionPolicy: too big"})
    assert p.policies == ()
    assert p.routes["mesh"].path is Path.WEBHOOK and "too big" in p.routes["mesh"].message


def test_a_group_falling_back_excludes_its_pods_from_its_neighbours_policies() -> None:
    # Two MergePatchJson patches of one annotation: the pair needs the webhook; `solo` overlaps neither.
    merge = {"patchPolicy": "MergePatchJson", "annotations": {"a.example/x": '{"k":1}'}}
    p = planned(ss("m1", patchPodMetadata=[merge]), ss("m2", patchPodMetadata=[merge]), ss("solo", app="other"))
    assert p.routes["m1"].path is p.routes["m2"].path is Path.WEBHOOK
    assert "MergePatchJson" in p.routes["m1"].message
    assert p.routes["solo"].path is Path.POLICY


def test_policy_mode_keeps_only_what_policies_decline_on_the_webhook() -> None:
    p = planned(ss("mesh"), ss("hot", app="hot", containers=[hot()]), mode=Mode.POLICY)
    assert p.routes["hot"].path is Path.WEBHOOK  # refused by validation in this mode (injector.policy.servable)
    assert '"hot"' not in p.webhook_condition


def test_an_oversized_group_stays_on_the_webhook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "MAX_POLICY_BYTES", 2000)
    p = planned(ss("mesh"))
    assert p.routes["mesh"].path is Path.WEBHOOK and "bytes" in p.routes["mesh"].message


def test_policy_names_stay_valid_and_distinct_when_long() -> None:
    long_a = [ss(f"{'a' * 60}-{i}") for i in range(5)]
    long_b = [ss(f"{'a' * 60}-{i}") for i in range(4)] + [ss(f"{'a' * 60}-9")]
    name_a, name_b = generate.policy_name(long_a), generate.policy_name(long_b)
    assert len(name_a) <= 253 and len(name_b) <= 253
    assert name_a != name_b
    assert generate.policy_name([ss("b"), ss("a")]) == "sidecarctl-a-b"


def test_the_generated_policy_is_json_with_literal_values() -> None:
    s = ss("mesh", containers=[builders.container("proxy", "proxy:1", env=[{"name": "A", "value": 'é"\\'}])])
    g = bundle.policy("p", [generate.parts([s], timestamp=TS, manager_namespace=NS)], manager_namespace=NS)
    expressions = " ".join(v["expression"] for v in g.policy["spec"]["variables"])
    assert cel.literal([{"name": "A", "value": 'é"\\'}, {"name": "IS_INJECTED", "value": "true"}]) in expressions
    assert orjson.loads(orjson.dumps(g.policy)) == g.policy
    assert g.policy["metadata"]["annotations"][generate.ANN_MEMBERS] == "mesh"
    assert g.policy["metadata"]["labels"] == generate.MANAGED_BY


def test_each_bookkeeping_annotation_is_built_once_in_a_group_and_the_default_container_only_when_asked() -> None:
    """Both branches (a pod with annotations, one without) write the same values: a value built by
    CEL is written once, as a variable the API server type-checks once; the first app's name, which
    a pod may not have, is read only once its test has held."""
    g = bundle.policy("p", [generate.parts([ss("mesh")], timestamp=TS, manager_namespace=NS)], manager_namespace=NS)
    (code,) = [e for n, e in variables(g).items() if n.startswith("groups")]
    assert code.count(".sort().join") == 3, "the two hash annotations and the injected list, each once"
    assert code.count("g0_ann") >= 6, "each read in both branches"
    assert code.count("size(g0_firstApp) > 0") == 2 and code.count("dyn(g0_firstApp[0])") == 2, "read behind its test"


# -- CEL text -------------------------------------------------------------------------------------


def test_literals_are_typed_dyn_where_their_items_mix_types() -> None:
    assert cel.literal({"a": [1, "x", None, True]}) == '{"a": dyn([dyn(1), dyn("x"), dyn(null), dyn(true)])}'
    # The top stays list(dyn) / map(string, dyn) whatever its items: callers add pod fields to it.
    assert cel.literal(["a", "b"]) == '[dyn("a"), dyn("b")]'
    assert cel.literal({"cpu": "1"}) == '{"cpu": dyn("1")}'
    # Empty containers and null have no type of their own (a free type variable, null_type): dyn.
    assert cel.literal({"a": [[], []]}) == '{"a": dyn([dyn([]), dyn([])])}'
    assert cel.literal({"a": [None, None]}) == '{"a": dyn([dyn(null), dyn(null)])}'
    assert cel.literal(1.5) == "1.5"
    with pytest.raises(TypeError):
        cel.literal(object())


def test_nested_literals_of_one_type_are_written_without_dyn() -> None:
    """kube-apiserver type-checks in time that grows with the square of the calls, `dyn()` among
    them: a nested list or map whose items share one type needs none."""
    resources = {"requests": {"cpu": "50m", "memory": "64Mi"}}
    assert cel.literal({"resources": resources}) == '{"resources": dyn({"requests": {"cpu": "50m", "memory": "64Mi"}})}'
    env = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert cel.literal({"env": env}) == '{"env": dyn([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])}'
    # One entry of another shape: each entry is dyn again, and inside the odd one its mixed values.
    mixed = [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    assert cel.literal({"env": mixed}) == (
        '{"env": dyn([dyn({"name": "A", "value": "1"}), '
        'dyn({"name": dyn("B"), "valueFrom": dyn({"fieldRef": {"fieldPath": "x"}})})])}'
    )
    numbers = cel.literal({"ports": [1, 2], "ratio": [0.5, 1]})
    assert numbers == '{"ports": dyn([1, 2]), "ratio": dyn([dyn(0.5), dyn(1)])}'


def test_json_pointer_segments_are_escaped() -> None:
    assert cel.pointer("sidecarctl.io/injected") == "sidecarctl.io~1injected"
    assert cel.pointer("a~b/c") == "a~0b~1c"


def test_selectors_become_boolean_cel() -> None:
    labels = "L"
    assert cel.selector(None, labels) == "false"
    assert cel.selector({}, labels) == "true"
    text = cel.selector(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["db"]},
                {"key": "x", "operator": "Exists"},
                {"key": "y", "operator": "DoesNotExist"},
            ],
        },
        labels,
    )
    assert text == (
        '("app" in L && L["app"] == "web") && (!("tier" in L) || !(L["tier"] in ["db"])) && ("x" in L) && !("y" in L)'
    )
    assert cel.selector({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1"]}]}, labels) == "false"


def test_variables_are_inlined_for_match_conditions() -> None:
    out = cel.inline_variables("variables.ab && variables.a", [("a", "x > 1"), ("ab", "variables.a || y")])
    assert out == "((x > 1) || y) && (x > 1)"


# Selectors as people write them: every shape Kruise accepts, on 300 SidecarSets that differ by team.
SHAPES: dict[str, Any] = {
    "two labels": lambda k: {"matchLabels": {"team": f"t{k}", "kind": "p"}},
    "In of several values": lambda k: {
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["web", "api"]},
            {"key": "team", "operator": "In", "values": [f"t{k}", f"t{k}-canary"]},
        ]
    },
    "In of three values, Exists and NotIn": lambda k: {  # 60 groups: 180 values, past the budget
        "matchExpressions": [
            {"key": "team", "operator": "In", "values": [f"t{k}", f"t{k}-canary", f"t{k}-next"]},
            {"key": "tier", "operator": "Exists"},
            {"key": "track", "operator": "NotIn", "values": ["batch"]},
        ]
    },
    "Exists and a label": lambda k: {
        "matchLabels": {"team": f"t{k}"},
        "matchExpressions": [{"key": "app", "operator": "Exists"}],
    },
    "NotIn and a label": lambda k: {
        "matchLabels": {"team": f"t{k}"},
        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["batch"]}],
    },
    "mixed": lambda k: [
        {"matchLabels": {"team": f"t{k}", "kind": "p"}},
        {"matchExpressions": [{"key": "team", "operator": "In", "values": [f"t{k}"]}]},
        {"matchLabels": {"team": f"t{k}"}, "matchExpressions": [{"key": "app", "operator": "Exists"}]},
    ][k % 3],
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_policy_tells_its_groups_apart_whatever_the_selector_shape(shape: str) -> None:
    """The label every SidecarSet shares (`kind: p`, `tier`) must not be what the policy filters on:
    its object selector, its condition and its candidate map all use the team, so a pod reaches the
    CEL of its own group only (at 300 two-label SidecarSets, anchoring on `kind` made every pod
    evaluate every group of every policy: 537 ms of API server CPU per pod)."""
    sets = [ss(f"p{k:03}", selector=SHAPES[shape](k)) for k in range(300)]
    p = planned(*sets)
    assert sum(len(g.groups) for g in p.policies) == 300
    for g in p.policies:
        spec = g.policy["spec"]
        required = [
            e
            for e in spec["matchConstraints"]["objectSelector"]["matchExpressions"]
            if e["key"] != names.POD_INJECT_LABEL
        ]
        assert [e["key"] for e in required] == ["team"], required
        # The team's values while they are few (one a group), else its presence.
        values = required[0].get("values", [])
        assert len(g.groups) <= len(values) <= bundle.SELECTOR_VALUES or required[0]["operator"] == "Exists"
        if shape == "two labels":  # one value a group: the values
            assert len(values) == len(g.groups)
        if shape.startswith("In of three values"):
            assert required[0] == {"key": "team", "operator": "Exists"} and len(g.groups) == bundle.MAX_GROUPS
        candidates = variables(g)["candidates"]
        assert candidates.count('"team=') >= len(g.groups), "one entry per group, under its own team"
        assert '"kind=' not in candidates and '"tier=' not in candidates and '"app"' not in candidates
        [gates] = spec["matchConditions"]
        assert '"team" in l' in gates["expression"] and '"kind" in l' not in gates["expression"]


def test_a_policy_lists_its_keys_values_while_few_and_past_the_budget_selects_by_the_keys_presence() -> None:
    """kube-apiserver parses each policy's object selector again for every write in an enabled
    namespace (ConfigMaps and Events too), about 0.37 µs a value, while an `Exists` costs them nothing
    and a pod with the key one condition: values while a policy holds at most SELECTOR_VALUES."""

    def required(count: int, values: int = 1) -> list[Any]:
        sets = [
            ss(
                f"p{k:03}",
                selector={
                    "matchExpressions": [
                        {"key": "team", "operator": "In", "values": [f"t{k}-{v}" for v in range(values)]}
                    ]
                },
            )
            for k in range(count)
        ]
        [policy] = planned(*sets).policies
        found = policy.policy["spec"]["matchConstraints"]["objectSelector"]["matchExpressions"]
        return [e for e in found if e["key"] != names.POD_INJECT_LABEL]

    budget = bundle.SELECTOR_VALUES
    assert required(budget) == [{"key": "team", "operator": "In", "values": sorted(f"t{k}-0" for k in range(budget))}]
    # Values, not SidecarSets, are what the API server parses: three each, and a third as many fill the budget.
    assert required(budget // 3, values=3) == [
        {"key": "team", "operator": "In", "values": sorted(f"t{k}-{v}" for k in range(budget // 3) for v in range(3))}
    ]
    assert required(budget // 3 + 1, values=3) == [{"key": "team", "operator": "Exists"}]

    # Past the budget the groups still pack 60 to a policy, as the key's presence holds for them all.
    def three(k: int) -> dict[str, Any]:
        return {"matchExpressions": [{"key": "team", "operator": "In", "values": [f"t{k}-{v}" for v in "abc"]}]}

    many = [ss(f"q{k:03}", selector=three(k)) for k in range(120)]
    assert [len(g.groups) for g in planned(*many).policies] == [bundle.MAX_GROUPS, bundle.MAX_GROUPS]


def test_a_selector_no_pod_can_meet_gets_an_object_selector_the_api_server_accepts() -> None:
    """`team: a` and `team In [b]` leave no value of `team`: an `In` without values is refused by the
    API server, which would keep every other group of the policy from being written."""
    never = ss(
        "never",
        selector={
            "matchLabels": {"team": "a"},
            "matchExpressions": [{"key": "team", "operator": "In", "values": ["b"]}],
        },
    )
    [policy] = planned(never).policies
    found = policy.policy["spec"]["matchConstraints"]["objectSelector"]["matchExpressions"]
    assert [e for e in found if e["key"] != names.POD_INJECT_LABEL] == [{"key": "team", "operator": "Exists"}]
    assert all(e.get("values") for e in found if e["operator"] in ("In", "NotIn"))


def test_the_webhook_index_files_two_label_sidecarsets_under_the_label_that_tells_them_apart() -> None:
    from sidecarsets.spec.podindex import PodIndex

    sets = [ss(f"p{k:03}", selector=SHAPES["two labels"](k)) for k in range(300)]
    index = PodIndex(sets)
    assert [s.name for s in index.candidates("shop", {"team": "t7", "kind": "p", "app": "x"})] == ["p007"]
    assert index.candidates("shop", {"kind": "p"}) == ()


def test_webhook_served_selectors_of_several_labels_sit_behind_one_lookup() -> None:
    """20 webhook-served `{team, kind}` SidecarSets: the webhook's condition tests the team once
    (a pod of another team stops there) before it reads any of their exact selectors."""
    condition = plan.webhook_condition(_team_kind_hooks(20), [], Mode.AUTO)
    assert condition.count('("team" in l && l["team"] in [') == 1
    assert condition.count('l["kind"] == "p"') == 20, "still exact behind the lookup"


def test_past_the_compile_budget_the_webhooks_selectors_are_read_by_anchors() -> None:
    """300 of them exact would be 26 KB of CEL, which kube-apiserver took a second to type-check on
    each write of the configuration and again at the next pod (every pod in flight waiting): read by
    their anchor (`team`) instead, one lookup, and the webhook answers the few pods of those teams
    whose `kind` differs (it declines them)."""
    hooks = _team_kind_hooks(300)
    exact = selecting.pods_selected(hooks)
    assert len(exact) > selecting.MAX_EXACT_CHARS
    condition = plan.webhook_condition(hooks, [], Mode.AUTO)
    assert condition.count('("team" in l && l["team"] in [') == 1
    assert '"kind"' not in condition
    assert len(condition) < len(exact) / 5


def _team_kind_hooks(count: int) -> list[SidecarSet]:
    return [
        ss(f"w{k:03}", selector={"matchLabels": {"team": f"w{k}", "kind": "p"}},
           metadata={"annotations": {names.ANN_INJECTION_PATH: "webhook"}})
        for k in range(count)
    ]  # fmt: skip


def test_a_selector_without_a_required_label_is_left_to_the_webhook_in_auto_mode() -> None:
    """A selector made of NotIn alone would let every pod through its policy's condition, each paying
    its CEL: with a webhook to hand it to (auto), the webhook's condition tests it exactly and the
    PolicyInjection condition says why; the other policies keep rejecting pods of other teams."""
    anchored = [ss(f"p{k:02}", selector={"matchLabels": {"team": f"t{k}"}}) for k in range(5)]
    others = [f"t{k}" for k in range(5)]  # every other team's pods: no pod of the anchored sets
    loose = ss("loose", selector={"matchExpressions": [{"key": "team", "operator": "NotIn", "values": others}]})
    p = planned(*anchored, loose)
    route = p.routes["loose"]
    assert route.path is plan.Path.WEBHOOK and route.why is plan.Why.NEEDS_WEBHOOK
    assert "requires no pod label" in route.message
    assert all(p.routes[f"p{k:02}"].path is plan.Path.POLICY for k in range(5))
    assert f"({cel.selector(loose.selector, 'l')})" in p.webhook_condition, "tested exactly there"
    [gates] = p.policies[0].policy["spec"]["matchConditions"]
    assert gates["expression"] != "true" and '"team" in l' in gates["expression"]


def test_with_no_webhook_to_hand_it_to_a_selector_without_a_required_label_gets_a_policy_of_its_own() -> None:
    """--injection=policy: packed apart, so the other policies keep rejecting pods of other teams
    before any CEL."""
    anchored = [ss(f"p{k:02}", selector={"matchLabels": {"team": f"t{k}"}}) for k in range(5)]
    others = [f"t{k}" for k in range(5)]
    loose = ss("loose", selector={"matchExpressions": [{"key": "team", "operator": "NotIn", "values": others}]})
    p = planned(*anchored, loose, mode=Mode.POLICY)
    by_member = {m: g for g in p.policies for m in g.members}
    assert by_member["loose"].name != by_member["p00"].name
    assert set(by_member["loose"].members) == {"loose"}
    [gates] = by_member["p00"].policy["spec"]["matchConditions"]
    assert gates["expression"] != "true" and '"team" in l' in gates["expression"]


def test_a_namespaced_sidecarset_is_served_by_a_policy_after_the_cluster_sets_in_its_namespace_only() -> None:
    """Policy-served like a SidecarSet: in one group with the cluster set that may share its pods, the
    cluster's first (its sidecars first in the pod, its names win), scoped to its namespace unless
    that namespace turned the kind off, as the webhook decides."""
    tenant = SidecarSet.from_object(
        builders.namespaced_sidecarset(
            "logs", "shop", selector={"matchLabels": {"app": "web"}}, containers=[builders.container("log", "log:1")]
        )
    )
    p = planned(ss("mesh"), tenant)
    assert p.routes["shop/logs"].path is Path.POLICY and p.routes["mesh"].path is Path.POLICY
    (g,) = p.policies
    assert list(g.members) == ["mesh", "shop/logs"]
    text = str(g.policy["spec"])
    off = f"{cel.string(names.NS_NAMESPACED_SIDECARSETS_LABEL)} in {cel.NAMESPACE_LABELS}"
    assert off in text and cel.string(names.NS_NAMESPACED_SIDECARSETS_DISABLED) in text
    assert '"kubernetes.io/metadata.name"' in text and '"shop"' in text
    # A feature only the webhook has keeps it there: its pods go to the webhook, named by namespace.
    hot_tenant = SidecarSet.from_object(builders.namespaced_sidecarset("hot", "shop", app="web", containers=[hot()]))
    p = planned(ss("mesh"), hot_tenant)
    assert p.routes["shop/hot"].path is Path.WEBHOOK and "HotUpgrade" in p.routes["shop/hot"].message
    assert "shop" in p.webhook_condition


@pytest.mark.parametrize("mode", [Mode.AUTO, Mode.POLICY])
def test_pods_asking_for_overrides_are_declined_by_policies_and_taken_by_the_webhook(mode: Mode) -> None:
    """The overrides are read, checked and merged by the webhook only: the policy leaves such a pod
    (its shared gate) and the webhook's condition takes it, in either mode."""
    overrides = [{"containerName": "proxy", "env": ["LOG_LEVEL"]}]
    p = planned(ss("mesh", overrides=overrides), mode=mode)
    assert p.routes["mesh"].path is Path.POLICY, "a SidecarSet that allows overrides is still policy-served"
    gates = p.policies[0].policy["spec"]["matchConditions"][0]["expression"]
    asked = f"({cel.string(names.ANN_OVERRIDES)} in {cel.ANNOTATIONS})"
    record = f"({cel.string(names.ANN_OVERRIDES_ENV_APPLIED)} in {cel.ANNOTATIONS})"
    assert f"(!({asked} || {record})) // no-per-pod-overrides" in gates
    assert asked in p.webhook_condition and record in p.webhook_condition
    assert planned(ss("mesh"), mode=Mode.WEBHOOK).webhook_condition == "true"


def _selector_zoo() -> list[SidecarSet]:
    """Selectors of every shape over the same keys: labels, `In` lists, keys alone, none required."""
    shapes: list[dict[str, Any]] = [
        {"matchLabels": {"team": "t1", "kind": "p"}},
        {"matchLabels": {"team": "t2", "kind": "w"}},
        {"matchLabels": {"kind": "p"}},
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["t1", "t3"]}]},
        {
            "matchExpressions": [
                {"key": "team", "operator": "Exists"},
                {"key": "tier", "operator": "In", "values": ["web"]},
            ]
        },
        {"matchExpressions": [{"key": "kind", "operator": "NotIn", "values": ["p"]}]},
        {"matchLabels": {"tier": "db"}},
        {"matchLabels": {"team": "t3", "tier": "web"}},
    ]
    return [ss(f"s{i}", selector=s) for i, s in enumerate(shapes)]


def test_overlap_index_finds_exactly_the_pairs_that_may_share_pods() -> None:
    zoo = _selector_zoo()
    for population in (zoo, zoo[1::2], zoo[::2]):
        index = plan.OverlapIndex(population)
        for query in zoo:
            expected = [
                i for i, other in enumerate(population) if other is not query and plan.may_share_pods(query, other)
            ]
            assert index.sharing(query) == expected, query.name


def test_overlap_index_prunes_by_every_label_the_query_requires(monkeypatch: pytest.MonkeyPatch) -> None:
    """Policy-served `{team: pK, kind: p}` against webhook-served `{team: wK, kind: w}`: the query's
    own anchor among those is `kind` (no webhook set shares either label), yet `team` prunes too."""
    webhook = [ss(f"w{k}", selector={"matchLabels": {"team": f"w{k}", "kind": "w"}}) for k in range(200)]
    index = plan.OverlapIndex(webhook)
    compared = 0
    exact = plan.may_share_pods

    def counting(a: SidecarSet, b: SidecarSet) -> bool:
        nonlocal compared
        compared += 1
        return exact(a, b)

    monkeypatch.setattr(plan, "may_share_pods", counting)
    for k in range(200):
        assert index.sharing(ss(f"p{k}", selector={"matchLabels": {"team": f"p{k}", "kind": "p"}})) == []
    assert compared == 0
    assert index.sharing(ss("w7-canary", selector={"matchLabels": {"team": "w7", "kind": "w"}})) == [7]
    assert compared == 1


# -- the cache between passes ---------------------------------------------------------------------


def _with(obj: dict[str, Any], **changes: Any) -> SidecarSet:
    o = copy.deepcopy(obj)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        at = o
        for p in parents:
            at = at.setdefault(p, {})
        at[leaf] = value
    return SidecarSet.from_object(o)


def test_a_status_write_regenerates_nothing_and_a_spec_or_revision_change_its_group_and_policy() -> None:
    objs = {n: builders.sidecarset(n, selector={"matchLabels": {"app": n}}) for n in ("a", "b")}
    for o in objs.values():
        o["status"] = {"latestRevision": "r1"}
    cache = partscache.PartsCache()
    first = planned(*(SidecarSet.from_object(o) for o in objs.values()), cache=cache)
    (policy,) = first.policies
    counted = planned(_with(objs["a"], status__matchedPods=3), SidecarSet.from_object(objs["b"]), cache=cache)
    assert counted.policies[0] is policy, "a status write: the same policy object, nothing assembled again"
    for change in ({"status__latestRevision": "r2"}, {"spec__containers": [builders.container("proxy", "proxy:2")]}):
        again = planned(_with(objs["a"], **change), SidecarSet.from_object(objs["b"]), cache=cache)
        assert again.policies[0] is not policy and again.policies[0].params != policy.params  # image, revision
        fresh = planned(_with(objs["a"], **change), SidecarSet.from_object(objs["b"]))
        assert again.policies[0] == fresh.policies[0], "what a plan without a cache gives"
