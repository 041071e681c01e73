"""Which MutatingAdmissionPolicy API this API server serves, and whether it enforces it, found by trying one.

Discovery answers whether the API exists (Kubernetes 1.36 and later serve
`admissionregistration.k8s.io/v1` policies; 1.34 and 1.35 only a beta, off unless turned on), but
not whether they are enforced: with the
MutatingAdmissionPolicy admission plugin disabled, discovery is unchanged and policies are stored
and silently ignored, so narrowing the webhook would admit pods without their sidecars. The
canary settles it: a policy that only mutates ConfigMaps labelled `sidecarctl.io/policy-probe` in
the manager's namespace, with a value read from a parameter object of the kind our policies read
theirs from (`canary_params`), and a dry-run create of one such ConfigMap that must come back mutated.
A new policy takes up to about a second to be enforced (the API server recompiles its policies on
a one-second tick), so the probe retries for a few seconds.

Every kube-apiserver must enforce them, not one: during an upgrade from 1.35 to 1.36 an HA control
plane runs both minors, discovery through the load balancer may list the API, and a pod the older
one admits would skip the webhook (narrowed for policy-served pods) and get no policy either. So once
the canary mutates, the probe wants `agreeing` more answers in a row that are mutated too, each on a
new connection (the `kubernetes` Service spreads connections over every kube-apiserver); a single
plain answer starts the count again, and a server that never mutates keeps it from ever completing.
With one old server of three, 20 answers in a row all miss it with probability (2/3)^20, 0.03 %.

The same canary is the sync's barrier before it narrows the webhook (`caught_up`). A kube-apiserver
enforces what it compiled at its last refresh, from its watches of policies, bindings and parameter
objects, each of which delivers one resource's changes in the order they were stored. The canary is
rewritten with a new token in all three (its parameter object's value, its policy's expression, its
binding's object selector), so a ConfigMap that comes back carrying the token twice was admitted by a
server whose policies include everything written before the canary: our policies are enforced there.
A fixed wait after the write was a guess, and under load the refresh came after it: pods created in
between got neither the webhook (narrowed) nor the policy (not compiled yet), and no sidecar.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol

from injector.policy import cel, params
from injector.policy.generate import MANAGED_BY, POLICY_API, covers
from kuberuntime import api
from kuberuntime.discovery import Served
from kuberuntime.jsontypes import JsonObj

log = logging.getLogger(__name__)

POLICY_RESOURCES = ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings")


@dataclass(frozen=True)
class PolicyApi:
    """One version of the MutatingAdmissionPolicy API, and where its objects live."""

    group_version: str

    @property
    def policies(self) -> str:
        return f"/apis/{self.group_version}/mutatingadmissionpolicies"

    @property
    def bindings(self) -> str:
        return f"/apis/{self.group_version}/mutatingadmissionpolicybindings"

    def served_by(self, served: Served) -> bool:
        return all(served.has(self.group_version, r) for r in POLICY_RESOURCES)


V1 = PolicyApi(POLICY_API)
# The versions discovery is asked about; only v1 is used (see `served_api`).
GROUP_VERSIONS = (V1.group_version, "admissionregistration.k8s.io/v1beta1")
GROUP_VERSION = f"/apis/{V1.group_version}"
POLICIES = V1.policies
BINDINGS = V1.bindings
CANARY = "sidecarctl-canary"
PROBE_LABEL = "sidecarctl.io/policy-probe"
TOKEN_LABEL = "sidecarctl.io/policy-probe-token"
NOT_ENFORCED = (
    "this API server stores MutatingAdmissionPolicies but not every kube-apiserver enforces them "
    "(one of an older minor during a control plane upgrade, or the MutatingAdmissionPolicy admission plugin "
    "disabled)"
)
# The policy and binding of the canary's token are enforced, but with an old copy of its parameter object,
# still after the probe's timeout. kube-apiserver stops the informer of a built-in paramKind (PodTemplate,
# here) for good, per process, once no binding names that kind for a second, and goes on reading the copy it
# held then: after every policy of the manager was deleted (an uninstall) and written again. Policies would
# inject from stale PodTemplates there, so the webhook serves every pod until that kube-apiserver restarts.
STALE_PARAMETERS = (
    "kube-apiserver enforces the canary policy with an old copy of its parameter object (a PodTemplate): "
    "its informer of PodTemplates has stopped, as one does once no policy binding names that kind "
    "(kubernetes/kubernetes#130887, after the manager's policies were all deleted); restart kube-apiserver"
)


def canary_params(namespace: str, token: str) -> JsonObj:
    """The canary's parameter object: the policies read their images from objects of this kind, so the
    canary reads one too, and policies are used only once the API server resolves the kind and reads it."""
    values = {"served": "true", "token": token}
    return params.parameter_object(CANARY, namespace, values, {**MANAGED_BY, PROBE_LABEL: "true"})


def canary_patch(token: str) -> str:
    """The canary's mutation: the parameter object's values, and the policy's own token after them."""
    value = f'{{"served": {cel.param("served")}, "token": {cel.param("token")} + "/" + {cel.string(token)}}}'
    return f'[JSONPatch{{op: "add", path: "/data", value: {value}}}]'


def _stale_parameters(data: Any, token: str) -> bool:
    """Whether a probe's answer came from the canary policy of `token` reading another token's parameters."""
    if not isinstance(data, dict) or data.get("served") != "true":
        return False
    read, _, own = str(data.get("token") or "").partition("/")
    return own == token and read != token


def canary_answer(token: str) -> dict[str, str]:
    """What a dry-run probe ConfigMap carries once the canary of `token` is enforced, all three parts of it."""
    return {"served": "true", "token": f"{token}/{token}"}


def canary_policy(token: str) -> JsonObj:
    return {
        "apiVersion": POLICY_API,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": CANARY, "labels": {**MANAGED_BY, PROBE_LABEL: "true"}},
        "spec": {
            "paramKind": params.kind(),
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}
                ],
                "objectSelector": {"matchLabels": {PROBE_LABEL: "true"}},
            },
            "mutations": [
                {
                    "patchType": "JSONPatch",
                    "jsonPatch": {"expression": canary_patch(token)},
                }
            ],
        },
    }


def canary_binding(namespace: str, token: str) -> JsonObj:
    return {
        "apiVersion": POLICY_API,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": CANARY, "labels": {**MANAGED_BY, PROBE_LABEL: "true"}},
        "spec": {
            "policyName": CANARY,
            "paramRef": params.reference(CANARY, namespace),
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchLabels": {TOKEN_LABEL: token}},
            },
        },
    }


async def _put(client: api.Client, path: str, body: JsonObj) -> None:
    """Create `body`, or replace what is stored under its name."""
    name = body["metadata"]["name"]
    try:
        current = await client.get(f"{path}/{name}")
    except api.NotFound:
        await client.create(path, body)
        return
    owners = body["metadata"].get("ownerReferences")
    content = {k: v for k, v in body.items() if k != "metadata"}  # a PodTemplate's is `template`, not `spec`
    if not covers(content, current) or owners != current["metadata"].get("ownerReferences"):
        replacement = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
        }
        await client.update(f"{path}/{name}", replacement)


def served_api(served: Served) -> PolicyApi | None:
    """The policy API to use on this server: v1 where discovery lists it, else none.

    1.34 and 1.35 serve `v1beta1` when an administrator turns it on; it is not used (the
    supported-versions page in docs/ says why), so there the webhook serves every SidecarSet."""
    return V1 if V1.served_by(served) else None


def not_served(served: Served) -> str:
    """The PolicyInjection condition's message on a server without the policy API used."""
    version = served.git_version or "of unknown version"
    beta = GROUP_VERSIONS[1]
    also = f"; its {beta} beta is not used" if all(served.has(beta, r) for r in POLICY_RESOURCES) else ""
    return (
        f"this API server (Kubernetes {version}) does not serve MutatingAdmissionPolicy "
        f"{V1.group_version} (GA from Kubernetes 1.36){also}"
    )


NOT_LISTED = (
    "discovery lists the MutatingAdmissionPolicy API but its objects cannot be listed yet (a kube-apiserver of "
    "an older minor answers 404 during a control plane upgrade)"
)


class Probe(Protocol):
    async def check(self) -> str | None:
        """None when the policies discovery lists are enforced, else the reason they cannot be used."""

    async def caught_up(self) -> bool:
        """True once every kube-apiserver enforces whatever was written before this call."""


class SupportProbe:
    """`await probe.check()`: None when the served policies are enforced, else the reason they cannot be used.

    Asked only once discovery lists the API (`served_api`)."""

    def __init__(
        self,
        client: api.Client,
        *,
        namespace: str,
        timeout: float = 15.0,
        interval: float = 0.25,
        agreeing: int = 20,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.timeout = timeout
        self.interval = interval
        self.agreeing = agreeing
        self.token = secrets.token_hex(4)  # the canary's, kept until `caught_up` needs a new one

    async def _owner(self) -> list[JsonObj]:
        """The manager's Namespace owns the canary: uninstalling (deleting it) removes the pair."""
        listing = await self.client.get(
            "/api/v1/namespaces", params={"fieldSelector": f"metadata.name={self.namespace}"}
        )
        return [
            {"apiVersion": "v1", "kind": "Namespace", "name": self.namespace, "uid": ns["metadata"]["uid"]}
            for ns in listing.get("items") or []
        ]

    async def refusal(self) -> str | None:
        """None once every kube-apiserver enforces the canary of the current token (written if not
        stored), else why not, from the last answer before the timeout."""
        token = self.token
        owners = await self._owner()
        canary = (
            (params.path(self.namespace), canary_params(self.namespace, token)),
            (POLICIES, canary_policy(token)),
            (BINDINGS, canary_binding(self.namespace, token)),
        )
        for path, body in canary:
            if owners:
                body["metadata"]["ownerReferences"] = owners
            await _put(self.client, path, body)
        probe = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "generateName": "sidecarctl-policy-probe-",
                "labels": {PROBE_LABEL: "true", TOKEN_LABEL: token},
            },
        }
        path = f"/api/v1/namespaces/{self.namespace}/configmaps"
        deadline = time.monotonic() + self.timeout
        in_a_row = 0
        answer = canary_answer(token)
        while True:
            got = await self.client.create(path, probe, params={"dryRun": "All"})
            if got.get("data") == answer:
                in_a_row += 1
                if in_a_row > self.agreeing:
                    return None
                continue
            in_a_row = 0
            if time.monotonic() >= deadline:
                return STALE_PARAMETERS if _stale_parameters(got.get("data"), token) else NOT_ENFORCED
            await asyncio.sleep(self.interval)

    async def check(self) -> str | None:
        return await self.refusal()

    async def caught_up(self) -> bool:
        self.token = secrets.token_hex(4)
        return await self.refusal() is None
