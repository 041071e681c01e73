"""`sidecarctl check-inject`: each reason a SidecarSet gives for not selecting a pod, the path, the
state of a present sidecar, the JSON and text, exit statuses and bad command lines; and that the
explanations agree with the product's own yes/no (selectors.matches, the injection engine) on the
golden corpus and on generated cases."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from injector.engine import engine
from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import clusterread
from sidecarctl.cli import main as cli
from sidecarctl.cli.checkinject import verdicts
from sidecarctl.cli.checkinject.paths import policy_members, route_of
from sidecarctl.cli.checkinject.render import render
from sidecarctl.cli.checkinject.report import pod_report
from sidecarctl.cli.checkinject.rules import selector_failures
from sidecarctl.cli.checkinject.state import outdated, why_outdated
from sidecarctl.cli.checkinject.target import Target, parse_target
from sidecarsets.pods.projection import project
from sidecarsets.rollout import glance
from sidecarsets.rollout.planner import plan_upgrade
from sidecarsets.spec import names, selectors
from tests import golden_cases
from tests.kube.builders import (
    apply_patch,
    container,
    injected_pod,
    model,
    namespaced_sidecarset,
    pod,
    shop_sidecarset,
    with_images,
)
from tests.unit.rollout.test_preview import StubApi, kubeconfig_for

MANAGER = names.DEFAULT_MANAGER_NAMESPACE
ENABLED = {names.NS_INJECTION_LABEL: "enabled"}
NOW = "2024-06-01T12:00:00Z"


def ns(name: str, labels: dict[str, str] | None = None) -> JsonObj:
    return {"metadata": {"name": name, "labels": labels if labels is not None else ENABLED}}


def cluster(*sets: JsonObj, namespaces: list[JsonObj] | None = None, **kw: Any) -> verdicts.Cluster:
    models = sorted((model(s) for s in sets), key=lambda s: s.name)
    c = verdicts.Cluster(models, namespaces if namespaces is not None else [ns("shop")], MANAGER, **kw)
    members = policy_members([])
    c.routes.update({m.name: route_of(m, members) for m in models})
    return c


def shop_pod(**labels: str) -> JsonObj:
    return pod("p", namespace="shop", labels={"app": "shop", **labels}, status={"phase": "Pending"})


def verdict(report: verdicts.PodReport, name: str) -> verdicts.Verdict:
    return next(v for v in report.verdicts if v.sidecarset == name)


def codes(report: verdicts.PodReport, name: str) -> list[str]:
    return [r.code for r in verdict(report, name).reasons]


# ---------------------------------------------------------------------------------------------
# Reasons


class TestReasons:
    def test_selected(self) -> None:
        r = pod_report(shop_pod(), cluster(shop_sidecarset()))
        assert verdict(r, "mesh").selects and r.gate is None

    @pytest.mark.parametrize(
        ("namespace", "message"),
        [
            ("kube-system", "namespace kube-system is never injected (a system namespace)"),
            (MANAGER, f"namespace {MANAGER} is never injected (the manager's namespace)"),
        ],
    )
    def test_system_namespaces(self, namespace: str, message: str) -> None:
        p = shop_pod()
        p["metadata"]["namespace"] = namespace
        r = pod_report(p, cluster(shop_sidecarset(), namespaces=[ns(namespace)]))
        assert r.gate == verdicts.Reason(verdicts.SYSTEM_NAMESPACE, message)
        assert verdict(r, "mesh").reasons == (r.gate,) and verdict(r, "mesh").state == verdicts.ABSENT

    @pytest.mark.parametrize(
        ("labels", "has"),
        [
            ({}, "it has no sidecar-injection label"),
            ({"sidecar-injection": "Enabled"}, "it has sidecar-injection=Enabled"),
        ],
    )
    def test_namespace_not_labelled_names_the_value_it_has(self, labels: dict[str, str], has: str) -> None:
        r = pod_report(shop_pod(), cluster(shop_sidecarset(), namespaces=[ns("shop", labels)]))
        assert r.gate == verdicts.Reason(
            verdicts.NAMESPACE_NOT_LABELLED, f"namespace shop is not labelled sidecar-injection=enabled ({has})"
        )

    def test_opted_out_and_inactive(self) -> None:
        r = pod_report(shop_pod(**{names.POD_INJECT_LABEL: "false"}), cluster(shop_sidecarset()))
        assert codes(r, "mesh") == [verdicts.OPTED_OUT]
        done = shop_pod()
        done["status"] = {"phase": "Succeeded"}
        assert codes(pod_report(done, cluster(shop_sidecarset())), "mesh") == [verdicts.POD_INACTIVE]

    def test_a_pod_wide_reason_comes_first_and_the_own_ones_follow(self) -> None:
        ss = shop_sidecarset(selector={"matchLabels": {"app": "web"}})
        r = pod_report(shop_pod(), cluster(ss, namespaces=[ns("shop", {})]))
        assert codes(r, "mesh") == [verdicts.NAMESPACE_NOT_LABELLED, verdicts.SELECTOR_MISMATCH]

    def test_paused_injection(self) -> None:
        r = pod_report(shop_pod(), cluster(shop_sidecarset(injectionStrategy={"paused": True})))
        assert verdict(r, "mesh").reasons == (
            verdicts.Reason(verdicts.INJECTION_PAUSED, "injection is paused (spec.injectionStrategy.paused: true)"),
        )

    def test_namespace_scope(self) -> None:
        pinned = shop_sidecarset(namespace="other")
        r = pod_report(shop_pod(), cluster(pinned))
        assert verdict(r, "mesh").reasons == (
            verdicts.Reason(verdicts.NAMESPACE_EXCLUDED, "it is for namespace other only (spec.namespace), not shop"),
        )
        by_label = shop_sidecarset(namespaceSelector={"matchLabels": {"team": "a"}})
        r = pod_report(shop_pod(), cluster(by_label, namespaces=[ns("shop", {**ENABLED, "team": "b"})]))
        assert [m.message for m in verdict(r, "mesh").reasons] == [
            "spec.namespaceSelector matchLabels team=a: the namespace shop has team=b"
        ]

    @pytest.mark.parametrize(
        ("selector", "message"),
        [
            ({"matchLabels": {"app": "web"}}, "spec.selector matchLabels app=web: the pod has app=shop"),
            ({"matchLabels": {"tier": "x"}}, "spec.selector matchLabels tier=x: the pod has no label tier"),
            (
                {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]},
                "spec.selector matchExpressions app In (a, b): the pod has app=shop",
            ),
            (
                {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["shop"]}]},
                "spec.selector matchExpressions app NotIn (shop): the pod has app=shop",
            ),
            (
                {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
                "spec.selector matchExpressions zone Exists: the pod has no label zone",
            ),
            (
                {"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]},
                "spec.selector matchExpressions app DoesNotExist: the pod has app=shop",
            ),
            ({}, "spec.selector is empty: it selects no pod"),
        ],
    )
    def test_the_failing_selector_term(self, selector: JsonObj, message: str) -> None:
        r = pod_report(shop_pod(), cluster(shop_sidecarset(selector=selector)))
        assert verdict(r, "mesh").reasons == (verdicts.Reason(verdicts.SELECTOR_MISMATCH, message),)

    def test_only_the_failing_terms_are_named(self) -> None:
        sel = {
            "matchLabels": {"app": "shop", "tier": "gold"},
            "matchExpressions": [{"key": "app", "operator": "Exists"}],
        }
        assert selector_failures(sel, {"app": "shop"}, where="s") == [
            "s matchLabels tier=gold: the pod has no label tier"
        ]
        assert selector_failures(None, {}, where="s") == ["s is not set: it selects nothing"]
        bad = selector_failures({"matchExpressions": [{"key": "a", "operator": "Near"}]}, {}, where="s")
        assert bad[0].startswith("s is invalid (matchExpressions[0].operator 'Near' is not one of")

    def test_a_canary_replaces_its_base(self) -> None:
        base = shop_sidecarset("mesh")
        canary = shop_sidecarset(
            "mesh-canary",
            selector={"matchLabels": {"app": "shop", "track": "canary"}},
            metadata={"annotations": {names.ANN_CANARY: "true", names.ANN_BASE: "mesh"}},
        )
        r = pod_report(shop_pod(track="canary"), cluster(base, canary))
        assert verdict(r, "mesh").reasons == (
            verdicts.Reason(
                verdicts.REPLACED_BY_CANARY, "canary SidecarSet mesh-canary selects the pod and replaces it"
            ),
        )
        assert verdict(r, "mesh-canary").selects
        assert verdict(pod_report(shop_pod(), cluster(base, canary)), "mesh").selects

    def test_a_conflict_names_the_winner_in_the_engines_words(self) -> None:
        old = shop_sidecarset("a-old", metadata={"creationTimestamp": "2024-01-01T00:00:00Z"})
        new = shop_sidecarset("b-new", metadata={"creationTimestamp": "2024-02-01T00:00:00Z"})
        r = pod_report(shop_pod(), cluster(old, new))
        assert verdict(r, "a-old").selects
        assert verdict(r, "b-new").reasons == (
            verdicts.Reason(
                verdicts.CONFLICT,
                "SidecarSet b-new is not injected: container envoy is also defined by SidecarSet a-old, "
                "which takes precedence (older, or first by name)",
            ),
        )


# ---------------------------------------------------------------------------------------------
# Agreement with the product's yes/no

LABEL_KEYS = ("app", "tier", "zone")
VALUES = ("a", "b", "c")
labels_st = st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(VALUES), max_size=3)
expr_st = st.one_of(
    st.fixed_dictionaries(
        {
            "key": st.sampled_from(LABEL_KEYS),
            "operator": st.sampled_from(("In", "NotIn")),
            "values": st.lists(st.sampled_from(VALUES), min_size=1, max_size=2),
        }
    ),
    st.fixed_dictionaries(
        {"key": st.sampled_from(LABEL_KEYS), "operator": st.sampled_from(("Exists", "DoesNotExist"))}
    ),
)
selector_st = st.fixed_dictionaries(
    {}, optional={"matchLabels": labels_st, "matchExpressions": st.lists(expr_st, max_size=3)}
)


@settings(max_examples=400, deadline=None)
@given(selector_st, labels_st)
def test_selector_failures_are_empty_exactly_when_the_selector_matches(
    selector: JsonObj, labels: dict[str, str]
) -> None:
    failures = selector_failures(selector, labels, where="s")
    assert (failures == []) == selectors.matches(selector, labels)


def _engine_injects(raw: JsonObj, c: verdicts.Cluster, labels: dict[str, str] | None) -> set[str]:
    namespace = raw["metadata"].get("namespace") or "default"
    result = engine.inject(
        copy.deepcopy(raw), namespace=namespace, namespace_labels=labels, sidecarsets=c.sidecarsets, now=NOW
    )
    return set(result.injected)


def _checked(raw: JsonObj, c: verdicts.Cluster) -> set[str]:
    return {v.sidecarset for v in pod_report(raw, c).verdicts if v.selects}


GOLDEN_PODS = [
    (case.name, i, doc)
    for case in golden_cases.cases()
    for i, doc in enumerate(case.input_docs)
    if isinstance(doc, dict) and doc.get("kind") == "Pod"
]


@pytest.mark.parametrize(("case", "index", "doc"), GOLDEN_PODS, ids=[f"{c}-{i}" for c, i, _ in GOLDEN_PODS])
def test_the_golden_pods_are_selected_as_the_engine_injects_them(case: str, index: int, doc: JsonObj) -> None:
    """For a new pod (hash annotations dropped: "already injected" is a state, not a selection), the
    SidecarSets the check says select it are exactly those the webhook's engine injects."""
    g = next(x for x in golden_cases.cases() if x.name == case)
    raw = copy.deepcopy(doc)
    for key in (names.ANN_HASH, names.ANN_HASH_WITHOUT_IMAGE):
        (raw["metadata"].get("annotations") or {}).pop(key, None)
    namespace = raw["metadata"].get("namespace") or "default"
    raw["metadata"]["namespace"] = namespace
    labels = {**g.namespace_labels.get(namespace, {}), **ENABLED}
    sets = [s for s in g.sidecarsets if s.get("kind") == "SidecarSet"]
    c = verdicts.Cluster(sorted((model(s) for s in sets), key=lambda s: s.name), [ns(namespace, labels)], MANAGER)
    assert _checked(raw, c) == _engine_injects(raw, c, {**labels, names.NS_NAME_LABEL: namespace})


def _generated_set(i: int, sel: JsonObj, paused: bool, ns_sel: JsonObj | None, canary: bool, shared: bool) -> JsonObj:
    meta: JsonObj = {"creationTimestamp": f"2024-01-0{i + 1}T00:00:00Z"}
    if canary and i > 0:
        meta["annotations"] = {names.ANN_CANARY: "true", names.ANN_BASE: "ss0"}
    spec: JsonObj = {"injectionStrategy": {"paused": paused}}
    if ns_sel is not None:
        spec["namespaceSelector"] = ns_sel
    name = "proxy" if shared else f"c{i}"
    return shop_sidecarset(f"ss{i}", selector=sel, metadata=meta, containers=[container(name, "img:1")], **spec)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(selector_st, st.booleans(), st.one_of(st.none(), selector_st), st.booleans(), st.booleans()),
        min_size=1,
        max_size=4,
    ),
    labels_st,
    labels_st,
    st.sampled_from(("shop", "kube-system", MANAGER)),
    st.booleans(),
)
def test_generated_cases_agree_with_the_engine(
    sets: list[tuple[JsonObj, bool, JsonObj | None, bool, bool]],
    pod_labels: dict[str, str],
    ns_labels: dict[str, str],
    namespace: str,
    enabled: bool,
) -> None:
    """Selectors, paused injection, namespace selectors, canaries and shared container names drawn at
    random: the check selects exactly what the engine injects, and gives a reason for every other one."""
    objs = [_generated_set(i, *args) for i, args in enumerate(sets)]
    labels = {**ns_labels, **(ENABLED if enabled else {})}
    raw = pod("p", namespace=namespace, labels=pod_labels)
    c = verdicts.Cluster(sorted((model(o) for o in objs), key=lambda s: s.name), [ns(namespace, labels)], MANAGER)
    report = pod_report(raw, c)
    assert _checked(raw, c) == _engine_injects(raw, c, {**labels, names.NS_NAME_LABEL: namespace})
    assert all(v.selects or v.reasons for v in report.verdicts)
    for v in report.verdicts:  # a conflict is only ever the engine's own warning, never a guess
        said = [r.message for r in v.reasons if r.code == verdicts.CONFLICT]
        assert all(m.startswith(f"SidecarSet {v.sidecarset} is not injected: ") for m in said), said


# ---------------------------------------------------------------------------------------------
# Paths


class TestPaths:
    def test_from_the_condition_and_the_policy_that_holds_it(self) -> None:
        cond = {"type": names.CONDITION_POLICY_INJECTION, "status": "True", "reason": "PolicyServed",
                "message": "MutatingAdmissionPolicy sidecarctl-injection-3"}  # fmt: skip
        ss = model(shop_sidecarset(status={"conditions": [cond]}))
        assert route_of(ss, {}) == verdicts.Route(
            "policy", "sidecarctl-injection-3", "MutatingAdmissionPolicy sidecarctl-injection-3"
        )
        policy = {
            "metadata": {"name": "sidecarctl-injection-0", "annotations": {"sidecarctl.io/sidecarsets": "x;mesh,y"}}
        }
        members = policy_members([policy])
        assert members == {
            "x": "sidecarctl-injection-0",
            "mesh": "sidecarctl-injection-0",
            "y": "sidecarctl-injection-0",
        }
        assert route_of(model(shop_sidecarset()), members).policy == "sidecarctl-injection-0"

    def test_the_webhook_and_why(self) -> None:
        cond = {"type": names.CONDITION_POLICY_INJECTION, "status": "False", "reason": "NeedsWebhook",
                "message": f"annotation {names.ANN_INJECTION_PATH}=webhook"}  # fmt: skip
        ss = model(shop_sidecarset(status={"conditions": [cond]}))
        assert route_of(ss, {}) == verdicts.Route(
            "webhook", None, f"NeedsWebhook: annotation {names.ANN_INJECTION_PATH}=webhook"
        )
        hot = shop_sidecarset(
            containers=[
                container("envoy", "e:1", upgradeStrategy={"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "e:0"})
            ]
        )
        assert route_of(model(hot), {}).reason.startswith("NeedsWebhook: container envoy: upgradeStrategy HotUpgrade")
        assert route_of(model(shop_sidecarset()), {}).path == "unknown"
        assert route_of(model(shop_sidecarset(injectionStrategy={"paused": True})), {}).path == "none"

    def test_a_pod_that_a_webhook_served_sidecarset_selects_goes_to_the_webhook_whole(self) -> None:
        a, b = shop_sidecarset("a"), shop_sidecarset("b", containers=[container("log", "l:1")])
        c = cluster(a, b)
        c.routes = {
            "a": verdicts.Route("policy", "sidecarctl-injection-0", ""),
            "b": verdicts.Route("webhook", None, "NeedsWebhook: x"),
        }
        r = pod_report(shop_pod(), c)
        assert r.route == verdicts.Route("webhook", None, "SidecarSet b needs the webhook (NeedsWebhook: x)")
        c.routes["b"] = verdicts.Route("policy", "sidecarctl-injection-1", "")
        assert pod_report(shop_pod(), c).route.policy == "sidecarctl-injection-0, sidecarctl-injection-1"


# ---------------------------------------------------------------------------------------------
# States


class TestStates:
    def test_current_running_and_not_running(self) -> None:
        ss = shop_sidecarset()
        v = verdict(pod_report(injected_pod("p", ss), cluster(ss)), "mesh")
        assert (v.state, v.detail) == (verdicts.CURRENT, "")
        pending = verdict(pod_report(injected_pod("p", ss, phase="Pending", with_statuses=False), cluster(ss)), "mesh")
        assert pending.state == verdicts.CURRENT and pending.detail.startswith("not running (phase Pending)")

    def test_upgrading_until_the_kubelet_reports_the_new_image(self) -> None:
        v1, v2 = shop_sidecarset(), with_images(shop_sidecarset(), envoy="envoy:v2")
        plan = plan_upgrade(model(v2), [project(injected_pod("p", v1))], revision="mesh-2", now=NOW)
        patched = apply_patch(injected_pod("p", v1), plan.upgrades[0].patch)
        v = verdict(pod_report(patched, cluster(v2)), "mesh")
        assert (
            v.state == verdicts.UPGRADING
            and v.revision == "mesh-2"
            and not verdicts.PodReport(
                "shop", "p", None, "Running", None, None, verdicts.Route("none", None, ""), (v,)
            ).ok
        )

    def test_outdated_says_where_the_rollout_holds_it(self) -> None:
        v1 = shop_sidecarset()
        paused = with_images(shop_sidecarset(updateStrategy={"paused": True}), envoy="envoy:v2")
        p = injected_pod("p", v1)
        at = glance.of(model(paused), [project(p)], {"shop/p": p}, {"shop": ENABLED},
                       stored_revisions=[], missing=[], now=NOW)  # fmt: skip
        assert why_outdated("shop/p", at) == "updates are paused (spec.updateStrategy.paused: true)"
        env = with_images(v1, envoy="envoy:v2")
        env["spec"]["containers"][0]["env"] = [{"name": "MODE", "value": "x"}]
        at = glance.of(model(env), [project(p)], {"shop/p": p}, {"shop": ENABLED},
                       stored_revisions=[], missing=[], now=NOW)  # fmt: skip
        assert why_outdated("shop/p", at).startswith("not upgradable in place: envoy: env")
        c = cluster(env, held={("mesh", "shop/p"): "why"})
        assert (verdict(pod_report(p, c), "mesh").state, verdict(pod_report(p, c), "mesh").detail) == (
            verdicts.OUTDATED,
            "why",
        )

    def test_missing_present_and_templates(self) -> None:
        ss = shop_sidecarset(metadata={"creationTimestamp": "2024-01-01T00:00:00Z"})
        bare = shop_pod()
        bare["metadata"]["creationTimestamp"] = "2023-12-31T00:00:00Z"
        v = verdict(pod_report(bare, cluster(ss)), "mesh")
        assert (v.state, v.detail) == (verdicts.MISSING, "created before the SidecarSet")
        half = injected_pod("p", ss)
        half["spec"]["containers"] = [c for c in half["spec"]["containers"] if c["name"] != "envoy"]
        assert verdict(pod_report(half, cluster(ss)), "mesh").detail.startswith(
            "listed in sidecarctl.io/sidecarset-inj"
        )
        opted = injected_pod("p", ss, labels={names.POD_INJECT_LABEL: "false"})
        assert verdict(pod_report(opted, cluster(ss)), "mesh").state == verdicts.CURRENT  # the controller counts it
        moved = injected_pod("p", ss, labels={"app": "web"})
        assert verdict(pod_report(moved, cluster(ss)), "mesh").state == verdicts.PRESENT
        r = pod_report(shop_pod(), cluster(ss), template_of="deployment/web")
        assert verdict(r, "mesh").state == verdicts.WOULD_INJECT and r.ok and r.injected_by is None


class TestTheControllersView:
    """A pod that carries a SidecarSet is judged as the controller counts and upgrades it
    (status.matched_pods), not by the injection rules that keep the SidecarSet from new pods."""

    V1 = shop_sidecarset()

    def check(self, raw: JsonObj, v2: JsonObj, **kw: Any) -> tuple[verdicts.Verdict, bool]:
        r = pod_report(raw, cluster(v2, **kw))
        return verdict(r, "mesh"), r.ok

    def test_paused_injection_still_upgrades_the_pods_that_have_it(self) -> None:
        v2 = with_images(shop_sidecarset(injectionStrategy={"paused": True}), envoy="envoy:v2")
        v, ok = self.check(injected_pod("p", self.V1), v2)
        assert (v.state, ok, [r.code for r in v.reasons]) == (verdicts.OUTDATED, False, [verdicts.INJECTION_PAUSED])
        current, ok = self.check(injected_pod("p", v2), v2)
        assert (current.state, ok) == (verdicts.CURRENT, True)

    @pytest.mark.parametrize(
        ("labels", "namespace_labels", "code"),
        [
            ({}, {}, verdicts.NAMESPACE_NOT_LABELLED),
            ({names.POD_INJECT_LABEL: "false"}, ENABLED, verdicts.OPTED_OUT),
        ],
    )
    def test_the_namespace_label_and_opting_out_do_not_stop_upgrades(
        self, labels: dict[str, str], namespace_labels: dict[str, str], code: str
    ) -> None:
        v2 = with_images(self.V1, envoy="envoy:v2")
        raw = injected_pod("p", self.V1, labels=labels)
        v, ok = self.check(raw, v2, namespaces=[ns("shop", namespace_labels)])
        assert (v.state, ok, [r.code for r in v.reasons]) == (verdicts.OUTDATED, False, [code])
        assert outdated(model(v2), project(raw), namespace_labels)

    def test_a_pod_the_controller_no_longer_matches_is_only_present(self) -> None:
        v2 = with_images(self.V1, envoy="envoy:v2")
        raw = injected_pod("p", self.V1, labels={"app": "web"})
        v, ok = self.check(raw, v2)
        assert (v.state, ok, [r.code for r in v.reasons]) == (verdicts.PRESENT, True, [verdicts.SELECTOR_MISMATCH])
        pinned = with_images(shop_sidecarset(namespace="other"), envoy="envoy:v2")
        assert self.check(injected_pod("p", self.V1), pinned)[0].state == verdicts.PRESENT
        assert not outdated(model(v2), project(raw), ENABLED)

    def test_a_base_its_canary_replaced_is_absent_and_one_injected_before_the_canary_is_counted(self) -> None:
        v2 = with_images(self.V1, envoy="envoy:v2")
        canary = shop_sidecarset(
            "mesh-canary",
            image="envoy:canary",
            selector={"matchLabels": {"app": "shop", "track": "canary"}},
            metadata={"annotations": {names.ANN_CANARY: "true", names.ANN_BASE: "mesh"}},
        )
        # Injected by the canary: the base is not in the injected list, so the controller leaves it.
        by_canary = injected_pod("p", canary, labels={"track": "canary"})
        r = pod_report(by_canary, cluster(v2, canary))
        assert (verdict(r, "mesh").state, verdict(r, "mesh-canary").state, r.ok) == (
            verdicts.ABSENT,
            verdicts.CURRENT,
            True,
        )
        # Injected by the base before the canary: the controller counts and upgrades it as the base's.
        r = pod_report(injected_pod("p", self.V1, labels={"track": "canary"}), cluster(v2, canary))
        assert (verdict(r, "mesh").state, codes(r, "mesh")) == (verdicts.OUTDATED, [verdicts.REPLACED_BY_CANARY])

    def test_the_text_keeps_the_reasons(self) -> None:
        v2 = with_images(shop_sidecarset(injectionStrategy={"paused": True}), envoy="envoy:v2")
        text = render([pod_report(injected_pod("p", self.V1), cluster(v2, held={("mesh", "shop/p"): "x"}))])
        assert "  mesh  OUT OF DATE at revision an unrecorded revision (current ?): x; not injected into new pods: " \
            "injection is paused (spec.injectionStrategy.paused: true)\n" in text  # fmt: skip
        assert text.endswith("Not present or not current (1): shop/p: mesh outdated\n")


# ---------------------------------------------------------------------------------------------
# The command


@pytest.fixture
def api() -> Iterator[StubApi]:
    with StubApi() as server:
        ss = shop_sidecarset()
        server.put(f"{clusterread.SS_PATH}/mesh", ss)
        server.put("/api/v1/namespaces/shop", ns("shop"))
        server.pod(injected_pod("good", ss))
        late = shop_pod()
        late["metadata"].update(name="late", creationTimestamp="2025-01-01T00:00:00Z")
        server.pod(late)
        web = {"metadata": {"name": "web", "namespace": "shop"},
               "spec": {"selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "shop"}}, "spec": {"containers": []}}}}  # fmt: skip
        server.put("/apis/apps/v1/namespaces/shop/deployments/web", web)
        yield server


def run(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_shape_and_exit_0(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    code, out, err = run(
        ["check-inject", "shop/good", "--kubeconfig", str(kubeconfig_for(api, tmp_path)), "-o", "json"], capsys
    )
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert set(doc) == {"pods", "ok"} and doc["ok"] is True
    (p,) = doc["pods"]
    keys = {"namespace", "name", "template", "phase", "injectedBy", "gate", "path", "sidecarSets", "overrides", "ok"}
    assert set(p) == keys and p["overrides"] == []
    (v,) = p["sidecarSets"]
    assert set(v) == {"name", "selects", "reasons", "path", "state", "revision", "currentRevision", "detail"}
    assert v["path"] == {
        "path": "unknown",
        "policy": None,
        "reason": "no PolicyInjection condition yet (is the manager running?)",
    }
    assert (v["state"], p["gate"], p["template"]) == ("current", None, None)
    assert all(method == "GET" for method, _, _ in api.requests)
    assert {agent for _, _, agent in api.requests} == {"sidecarctl-check-inject"}


def test_missing_is_exit_1_and_text(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    code, out, err = run(
        ["check-inject", "-l", "app=shop", "-n", "shop", "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys
    )
    assert (code, err) == (1, "")
    assert "Pod shop/good (Running)\n" in out and "Pod shop/late (Pending)\n" in out
    assert "  mesh  MISSING: selects the pod, its sidecars are not in it: admitted without injection" in out
    assert out.endswith("Not present or not current (1): shop/late: mesh missing\n")


def test_a_pod_outdated_under_paused_injection_in_an_unlabelled_namespace_is_exit_1(
    api: StubApi, tmp_path: Path, capsys: Any
) -> None:
    paused = with_images(shop_sidecarset(injectionStrategy={"paused": True}), envoy="envoy:v2")
    api.put(f"{clusterread.SS_PATH}/mesh", paused)
    api.put("/api/v1/namespaces/shop", ns("shop", {}))
    code, out, err = run(
        ["check-inject", "shop/good", "--kubeconfig", str(kubeconfig_for(api, tmp_path)), "-o", "json"], capsys
    )
    (v,) = json.loads(out)["pods"][0]["sidecarSets"]
    assert (code, err, v["state"], v["selects"]) == (1, "", "outdated", False)
    assert [r["code"] for r in v["reasons"]] == [verdicts.NAMESPACE_NOT_LABELLED, verdicts.INJECTION_PAUSED]
    assert v["detail"] and v["detail"] != "its rollout could not be placed (pods not listed)", v


def test_a_workload_without_pods_is_its_template(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    code, out, _ = run(
        ["check-inject", "-n", "shop", "deploy/web", "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys
    )
    assert code == 0
    assert out.startswith("Pod template of deployment/web in namespace shop (no pods: checked as a new pod)\n")
    assert "  mesh  would be injected, path unknown" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["shop/nope"], "pod shop/nope not found"),
        (["-n", "shop", "job/nope"], "job shop/nope not found"),
        (["-n", "shop", "-l", "app=none"], "no pod in namespace shop matches -l app=none"),
    ],
)
def test_not_found_is_one_line_and_exit_1(
    api: StubApi, tmp_path: Path, capsys: Any, argv: list[str], message: str
) -> None:
    code, out, err = run(["check-inject", *argv, "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys)
    assert (code, out, err) == (1, "", f"sidecarctl check-inject: error: {message}\n")


def test_unreachable_and_refused(api: StubApi, tmp_path: Path, capsys: Any) -> None:
    code, _, err = run(["check-inject", "shop/good", "--kubeconfig", str(kubeconfig_for(None, tmp_path))], capsys)
    assert code == 1 and err.startswith(
        "sidecarctl check-inject: error: cannot reach the API server at http://127.0.0.1:"
    )
    api.deny("/api/v1/namespaces/shop/pods")
    code, _, err = run(["check-inject", "shop/good", "--kubeconfig", str(kubeconfig_for(api, tmp_path))], capsys)
    assert code == 1 and "refused a request: 403 Forbidden" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give a pod (NAME or NAMESPACE/NAME), a workload (KIND/NAME) or -l SELECTOR"),
        (["web", "-l", "app=x"], "give a pod, a workload or -l SELECTOR, not both"),
        (["a/b/c"], "'a/b/c': use NAME, NAMESPACE/NAME or KIND/NAME"),
        (["shop/web", "-n", "other"], "'shop/web' names namespace shop, but -n says other"),
        (["Web"], "'Web' is not a valid object name"),
        (["-n", "Shop", "web"], "-n 'Shop' is not a namespace name"),
        (["-l", " "], "-l needs a label selector such as app=web"),
        (["Foo.Bar/web"], "'Foo.Bar' is neither a namespace nor one of pod, deployment, statefulset"),
    ],
)
def test_bad_command_lines_are_status_2(argv: list[str], message: str, capsys: Any) -> None:
    code, out, err = run(["check-inject", *argv], capsys)
    assert (code, out) == (2, "") and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("target", "namespace", "expected"),
    [
        ("web", None, Target("pod", "default", "web")),
        ("shop/web", None, Target("pod", "shop", "web")),
        ("pod/web", "shop", Target("pod", "shop", "web")),
        ("deployments/web", "shop", Target("deployment", "shop", "web")),
        ("sts/db", "shop", Target("statefulset", "shop", "db")),
        ("ds/agent", "shop", Target("daemonset", "shop", "agent")),
        ("rs/web-1", "shop", Target("replicaset", "shop", "web-1")),
        ("job/x", "shop", Target("job", "shop", "x")),
    ],
)
def test_targets(target: str, namespace: str | None, expected: Target) -> None:
    assert parse_target(target, namespace, None) == expected


# ---------------------------------------------------------------------------------------------
# Per-pod overrides


def test_each_override_is_shown_applied_refused_or_ignored_with_why_and_the_pod_is_the_webhooks() -> None:
    bounds = [{"containerName": "envoy", "resources": {"cpu": {"max": "2"}}}]
    ss = shop_sidecarset(overrides=bounds, containers=[container("envoy", "envoy:v1")])
    raw = shop_pod()
    asked: dict[str, Any] = {
        "envoy": {"resources": {"limits": {"cpu": "1"}}},
        "gone": {"env": [{"name": "A", "value": "1"}]},
    }
    raw["metadata"]["annotations"] = {names.ANN_OVERRIDES: json.dumps(asked)}
    r = pod_report(raw, cluster(ss))
    assert [(o.container, o.verdict) for o in r.overrides] == [("envoy", "applied"), ("gone", "ignored")]
    assert r.overrides[0].message == "resources.limits.cpu=1 (allowed by SidecarSet mesh)"
    assert r.route.path == "webhook" and names.ANN_OVERRIDES in r.route.reason
    text = render([r])
    assert "overrides (sidecarctl.io/overrides), as the webhook judges them now:" in text
    assert "    gone: ignored: sidecarctl.io/overrides[gone]: no SidecarSet injects a container gone" in text

    asked["envoy"]["resources"]["limits"]["cpu"] = "3"
    raw["metadata"]["annotations"] = {names.ANN_OVERRIDES: json.dumps(asked)}
    (refused, _) = pod_report(raw, cluster(ss)).overrides
    assert (refused.verdict, refused.reason) == ("refused", "out_of_range")
    assert refused.message.endswith("(allowed: at most 2)")

    raw["metadata"]["annotations"] = {names.ANN_OVERRIDES: "{"}
    (bad,) = pod_report(raw, cluster(ss)).overrides
    assert (bad.container, bad.verdict, bad.reason) == ("*", "refused", "invalid")
    raw["metadata"]["labels"] = {"app": "other"}
    (alone,) = pod_report(raw, cluster(ss)).overrides
    assert alone.verdict == "ignored" and "no SidecarSet injects this pod now" in alone.message


def test_the_namespaced_sidecarsets_of_the_pods_namespace_are_checked_too(
    api: StubApi, tmp_path: Path, capsys: Any
) -> None:
    agent = namespaced_sidecarset(
        "mesh", "shop", containers=[{"name": "agent", "image": "agent:v1"}], selector={"matchLabels": {"app": "shop"}}
    )
    api.put(f"{clusterread.tenant_path('shop')}/mesh", agent)
    elsewhere = namespaced_sidecarset("logs", "other", selector={"matchLabels": {"app": "shop"}})
    api.put(f"{clusterread.tenant_path('other')}/logs", elsewhere)
    config = str(kubeconfig_for(api, tmp_path))
    code, out, err = run(["check-inject", "shop/good", "--kubeconfig", config, "-o", "json"], capsys)
    assert err == ""
    (p,) = json.loads(out)["pods"]
    found = {v["name"]: v for v in p["sidecarSets"]}
    # The cluster set `mesh` and the namespace's own `shop/mesh` are two SidecarSets; `other/logs` is
    # not read (nor listed across namespaces).
    assert set(found) == {"mesh", "shop/mesh"}
    tenant = found["shop/mesh"]
    assert (tenant["selects"], tenant["state"], tenant["path"]["path"]) == (True, "missing", "unknown")
    assert code == 1
    assert not any("/namespaces/other/" in path or path == clusterread.NSS_PATH for _, path, _ in api.requests)
    # Turned off in the namespace: not selected, and why.
    api.put("/api/v1/namespaces/shop", ns("shop", {**ENABLED, names.NS_NAMESPACED_SIDECARSETS_LABEL: "disabled"}))
    code, out, _ = run(["check-inject", "shop/good", "--kubeconfig", config, "-o", "json"], capsys)
    (p,) = json.loads(out)["pods"]
    (tenant,) = [v for v in p["sidecarSets"] if v["name"] == "shop/mesh"]
    assert tenant["selects"] is False and code == 0
    assert [r["message"] for r in tenant["reasons"]] == [
        f"namespace shop is labelled {names.NS_NAMESPACED_SIDECARSETS_LABEL}=disabled"
    ]
