"""Finding out whether policies are enforced, refusing what policy mode cannot serve, and the
PolicyInjection condition in the SidecarSet status."""

from __future__ import annotations

import asyncio
import copy
import re
from typing import Any

import orjson

from injector.http import admission, decisions
from injector.policy import params, servable
from injector.policysync.support import (
    BINDINGS,
    CANARY,
    NOT_ENFORCED,
    POLICIES,
    STALE_PARAMETERS,
    TOKEN_LABEL,
    V1,
    SupportProbe,
    not_served,
    served_api,
)
from kuberuntime import api
from kuberuntime.discovery import Served
from kuberuntime.jsontypes import JsonObj
from sidecarctl.manager import preflight
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.controller.controller import NSS_PATH, SS_PATH
from sidecarsets.rollout import status
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from sidecarsets.store import TemplateStore
from tests.kube import builders
from tests.kube.fakeapi import FakeApiServer

NS = "sidecarctl-system"


class Mutating(FakeApiServer):
    """A fake whose dry-run ConfigMap creates come back mutated once `enforced`, as the canary stored when
    `refreshed` makes them (its parameter object's values, its policy's token, its binding's selector),
    or as stored now while `refreshed` is None: a kube-apiserver whose last policy refresh was then;
    `behind` holds objects whose watch has not delivered their newest version."""

    def __init__(self, enforced: bool) -> None:
        super().__init__()
        self.enforced = enforced
        self.refreshed: dict[str, JsonObj] | None = None
        self.behind: dict[str, JsonObj] = {}  # objects this server still enforces an older version of

    def refresh(self) -> None:
        self.refreshed = copy.deepcopy(self.objects)

    def mutated(self, body: JsonObj) -> JsonObj:
        seen = {**(self.objects if self.refreshed is None else self.refreshed), **self.behind}
        policy, binding = seen.get(f"{POLICIES}/{CANARY}"), seen.get(f"{BINDINGS}/{CANARY}")
        param = seen.get(f"{params.path(NS)}/{CANARY}")
        if not self.enforced or policy is None or binding is None or param is None:
            return dict(body)
        wanted = binding["spec"]["matchResources"].get("objectSelector", {}).get("matchLabels", {})
        if any(body["metadata"]["labels"].get(k) != v for k, v in wanted.items()):
            return dict(body)
        expression = policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
        own = re.search(r'"/" \+ "([0-9a-f]+)"', expression)
        values = params.values(param)
        assert own is not None, expression
        return {**body, "data": {"served": values["served"], "token": f"{values['token']}/{own.group(1)}"}}

    async def get(self, path: str, *, params: Any = None) -> JsonObj:
        named = path.startswith((POLICIES + "/", BINDINGS + "/"))
        if named and path not in self.objects:
            raise api.NotFound(404, "NotFound", f"{path} not found")
        return await super().get(path, params=params)

    async def create(self, path: str, body: JsonObj, *, params: Any = None) -> JsonObj:
        if path.endswith("/configmaps") and (params or {}).get("dryRun") == "All":
            self.calls.append(("create", path))
            return self.mutated(body)
        return await super().create(path, body, params=params)


def probe(api: FakeApiServer) -> str | None:
    return asyncio.run(SupportProbe(api, namespace=NS, timeout=0.3, interval=0.05).check())


def test_an_enforcing_api_server_is_detected_by_the_canary() -> None:
    api = Mutating(enforced=True)
    ns = api.put(f"/api/v1/namespaces/{NS}", {"metadata": {"name": NS}})
    same = SupportProbe(api, namespace=NS, timeout=0.3, interval=0.05)
    assert asyncio.run(same.check()) is None
    assert f"{POLICIES}/{CANARY}" in api.objects and f"{BINDINGS}/{CANARY}" in api.objects
    # Owned by the manager's namespace: uninstalling removes the pair.
    owner = {"apiVersion": "v1", "kind": "Namespace", "name": NS, "uid": ns["metadata"]["uid"]}
    for path in (f"{POLICIES}/{CANARY}", f"{BINDINGS}/{CANARY}"):
        assert api.objects[path]["metadata"]["ownerReferences"] == [owner]
    binding = api.objects[f"{BINDINGS}/{CANARY}"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": NS}
    }
    # The next probe of the same process finds the canary in place and does not rewrite it.
    writes = len(api.writes())
    assert asyncio.run(same.check()) is None
    assert [w for w in api.writes()[writes:] if "admissionpolicies" in w or "policybindings" in w] == []


class OneOfThree(Mutating):
    """Three kube-apiservers behind a load balancer, one of which (an older minor) never mutates."""

    def __init__(self) -> None:
        super().__init__(enforced=True)
        self.answers = 0

    async def create(self, path: str, body: JsonObj, *, params: Any = None) -> JsonObj:
        if path.endswith("/configmaps") and (params or {}).get("dryRun") == "All":
            self.answers += 1
            self.enforced = self.answers % 3 != 0
        return await super().create(path, body, params=params)


def test_the_barrier_holds_until_the_server_enforces_what_was_written_before_it() -> None:
    """`caught_up` rewrites the canary with a new token: a server whose last refresh predates that
    rewrite answers with the old token (or none), which is not enough; once it refreshes, it is."""
    api = Mutating(enforced=True)
    api.put(f"/api/v1/namespaces/{NS}", {"metadata": {"name": NS}})
    p = SupportProbe(api, namespace=NS, timeout=0.3, interval=0.05)
    assert asyncio.run(p.check()) is None
    first = p.token
    api.refresh()  # the server compiled the canary of the first token, and has not refreshed since
    assert asyncio.run(p.caught_up()) is False, "an answer from before the rewrite was taken as enforced"
    assert p.token != first
    stored = api.objects[f"{BINDINGS}/{CANARY}"]["spec"]["matchResources"]["objectSelector"]
    assert stored == {"matchLabels": {TOKEN_LABEL: p.token}}
    # Each part of the canary proves its own watch caught up: a server that has two of them at the new
    # token and one at the old does not count.
    for part in (f"{POLICIES}/{CANARY}", f"{BINDINGS}/{CANARY}", f"{params.path(NS)}/{CANARY}"):

        def one_part_behind(path: str, old: JsonObj | None, new: JsonObj | None, part: str = part) -> None:
            if path == part and old is not None:
                api.behind[part] = old

        api.listeners.append(one_part_behind)
        assert asyncio.run(p.caught_up()) is False, f"{part} of the old token was taken as enforced"
        api.listeners.remove(one_part_behind)
        api.behind.clear()
    api.refreshed = None
    assert asyncio.run(p.caught_up()) is True


def test_one_kube_apiserver_that_does_not_enforce_keeps_policies_off() -> None:
    """An HA control plane part way through an upgrade to the first minor with the API: answers from
    the new servers mutate, the old one's do not; the probe never gets its run of agreeing answers."""
    api = OneOfThree()
    api.put(f"/api/v1/namespaces/{NS}", {"metadata": {"name": NS}})
    assert probe(api) == NOT_ENFORCED
    assert api.answers > 6, "a plain answer starts the count again: it kept asking until its time was up"


def test_a_server_that_reads_an_old_copy_of_the_parameter_object_is_named_for_it() -> None:
    """A kube-apiserver whose informer of the canary's parameter kind stopped (once no binding named it,
    kubernetes/kubernetes#130887) enforces a new manager's canary policy and binding with the parameter
    object as it was: not trusted, and said so, not taken for an old minor."""
    api = Mutating(enforced=True)
    api.put(f"/api/v1/namespaces/{NS}", {"metadata": {"name": NS}})
    assert probe(api) is None
    param = f"{params.path(NS)}/{CANARY}"
    api.behind[param] = copy.deepcopy(api.objects[param])  # frozen at the first manager's token
    assert probe(api) == STALE_PARAMETERS
    api.behind = {f"{POLICIES}/{CANARY}": copy.deepcopy(api.objects[f"{POLICIES}/{CANARY}"])}
    assert probe(api) == NOT_ENFORCED, "an old policy with the new parameters is not the stopped informer"
    api.behind.clear()
    assert probe(api) is None


def test_a_server_that_stores_but_ignores_policies_is_not_trusted() -> None:
    api = Mutating(enforced=False)
    api.put(f"/api/v1/namespaces/{NS}", {"metadata": {"name": NS}})
    assert probe(api) == NOT_ENFORCED


def _served(version: str, *group_versions: str) -> Served:
    resources = ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings")
    return Served(version, frozenset((gv, r) for gv in group_versions for r in resources))


def test_only_the_v1_api_is_used_and_a_server_without_it_is_named_with_its_version() -> None:
    assert served_api(_served("v1.36.3", "admissionregistration.k8s.io/v1")) == V1
    assert served_api(_served("v1.34.4")) is None
    beta = _served("v1.35.4", "admissionregistration.k8s.io/v1beta1")
    assert served_api(beta) is None
    assert "Kubernetes v1.34.4" in not_served(_served("v1.34.4")) and "beta" not in not_served(_served("v1.34.4"))
    assert "v1beta1 beta is not used" in not_served(beta)
    half = Served("v1.36.3", frozenset({("admissionregistration.k8s.io/v1", "mutatingadmissionpolicies")}))
    assert served_api(half) is None, "policies without bindings cannot inject"


def hot_object(name: str = "hot") -> JsonObj:
    hot = builders.container(
        "proxy", "p:1", upgradeStrategy={"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "e:1"}
    )
    return builders.sidecarset(name, containers=[hot])


def test_servable_names_the_feature() -> None:
    assert servable.why_not(builders.sidecarset("plain"), [], manager_namespace=NS) is None
    assert "HotUpgrade" in (servable.why_not(hot_object(), [], manager_namespace=NS) or "")


def _review(obj: JsonObj) -> admission.Review:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "sidecarctl.io", "version": "v1alpha1", "kind": "SidecarSet"},
            "operation": "CREATE",
            "object": obj,
        },
    }
    return admission.parse(orjson.dumps(body))


def _verdict(obj: JsonObj, policy_only: bool) -> JsonObj:
    settings = decisions.WebhookSettings(policy_only=policy_only)
    decision = asyncio.run(decisions.validate(_review(obj), TemplateStore(), settings))
    response: JsonObj = orjson.loads(decision.body)["response"]
    return response


def test_policy_mode_validation_refuses_what_only_the_webhook_serves() -> None:
    refused = _verdict(hot_object(), policy_only=True)
    assert refused["allowed"] is False
    assert "--injection=policy" in refused["status"]["message"] and "HotUpgrade" in refused["status"]["message"]
    assert _verdict(hot_object(), policy_only=False)["allowed"] is True
    assert _verdict(builders.sidecarset("plain"), policy_only=True)["allowed"] is True


def _discovery(api: FakeApiServer, version: str, *group_versions: str) -> None:
    api.put("/version", {"gitVersion": version})
    for gv in group_versions:
        resources = [{"name": "mutatingadmissionpolicies"}, {"name": "mutatingadmissionpolicybindings"}]
        api.put(f"/apis/{gv}", {"resources": resources})


def test_policy_mode_does_not_start_while_an_unservable_sidecarset_exists() -> None:
    api = FakeApiServer()
    _discovery(api, "v1.37.2", "admissionregistration.k8s.io/v1")
    api.put(f"{SS_PATH}/plain", builders.sidecarset("plain"))
    opts = ManagerOptions.build(injection="policy", namespace=NS)
    assert asyncio.run(preflight.policy_mode_problem(opts, api)) is None
    api.put(f"{SS_PATH}/hot", hot_object())
    problem = asyncio.run(preflight.policy_mode_problem(opts, api))
    assert problem is not None and "hot:" in problem and "HotUpgrade" in problem and "--injection=auto" in problem
    auto = ManagerOptions.build(injection="auto", namespace=NS)
    assert asyncio.run(preflight.policy_mode_problem(auto, api)) is None
    # A NamespacedSidecarSet counts too.
    api.objects.pop(f"{SS_PATH}/hot")
    tenant = builders.namespaced_sidecarset("hot", "team-a", containers=hot_object()["spec"]["containers"])
    api.put(f"{NSS_PATH.rsplit('/', 1)[0]}/namespaces/team-a/{names.NAMESPACED_PLURAL}/hot", tenant)
    problem = asyncio.run(preflight.policy_mode_problem(opts, api))
    assert problem is not None and "team-a/hot:" in problem and "HotUpgrade" in problem


def test_policy_mode_does_not_start_on_a_server_without_the_policy_api() -> None:
    """Kubernetes 1.34 with the beta turned on: still refused, in one line that names the version
    and the modes that work there."""
    api = FakeApiServer()
    _discovery(api, "v1.34.4", "admissionregistration.k8s.io/v1beta1")
    api.put(f"{SS_PATH}/plain", builders.sidecarset("plain"))
    problem = asyncio.run(preflight.policy_mode_problem(ManagerOptions.build(injection="policy", namespace=NS), api))
    assert problem is not None and "\n" not in problem
    assert "Kubernetes v1.34.4" in problem and "--injection=auto or --injection=webhook" in problem
    assert asyncio.run(preflight.policy_mode_problem(ManagerOptions.build(injection="auto", namespace=NS), api)) is None


def test_the_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    cond = {"type": "PolicyInjection", "status": "True", "reason": "PolicyServed", "message": "m"}
    first: JsonObj = {}
    status.set_condition(first, None, cond, now="T1")
    assert first["conditions"] == [{**cond, "lastTransitionTime": "T1"}]
    again: JsonObj = {}
    status.set_condition(again, first, {**cond, "message": "other"}, now="T2")
    assert again["conditions"][0]["lastTransitionTime"] == "T1"
    flipped: JsonObj = {}
    status.set_condition(flipped, first, {**cond, "status": "False"}, now="T3")
    assert flipped["conditions"][0]["lastTransitionTime"] == "T3"
    assert not status.status_changed({**first}, {**first})


def test_sidecarset_model_reads_the_condition_back_tolerantly() -> None:
    obj = builders.sidecarset("plain", status={"conditions": [{"type": "PolicyInjection", "status": "True"}]})
    assert SidecarSet.from_object(obj, tolerant=True).status["conditions"][0]["status"] == "True"
