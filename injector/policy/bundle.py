"""Overlap groups packed into few MutatingAdmissionPolicies, so the API server's cost per pod stays flat.

kube-apiserver matches every policy against every namespaced write, linearly, parsing each
policy's and binding's label selectors again per request (its profile at 30 policies: 5 % of its CPU
in LabelSelectorAsSelector for pods no policy touches), and each invocation that mutates re-encodes
and re-decodes the pod. One policy per overlap group made every pod of the cluster pay for every
SidecarSet. Here a policy carries up to MAX_GROUPS groups (MAX_BYTES of JSON):

- its matchCondition: the gates all groups share, then "one of my groups could select the pod" as
  constant-set lookups (injector.policy.selecting): a pod none of them selects costs a few map
  lookups, and no mutation;
- per group j, variables prefixed `gJ_` (the group's CEL as generated for it alone, so the output
  is the same), `gJ_go`: its exact selector first, then its own gates and namespace guards, and
  `gJ_ops`: its JSON Patch operations as maps (the JSONPatch type exists only in a mutation);
- one mutation: the operations of the (at most one) group whose `go` holds, as JSONPatch objects. Groups are overlap groups,
  so no pod is selected by two of them; the `go` of the others stops at their selector.

Packing is sticky: a group stays in the policy that held it (`previous`) while it fits, so adding
or removing a SidecarSet rewrites one policy, not all of them; new groups fill the first policy
with room, in the order of their oldest member.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import orjson

from injector.policy import cel, selecting
from injector.policy.build import V
from injector.policy.generate import ANN_MEMBERS, MANAGED_BY, POLICY_API, Generated, GroupParts
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names

NAME_PREFIX = "sidecarctl-injection-"
MAX_GROUPS = 100  # groups per policy: each costs a pod of a labelled namespace one selector check
MAX_BYTES = 768 * 1024  # a policy's JSON: under etcd's 1.5 MiB, and compiled in a few seconds
# Variables every group defines the same way (the pod's annotations, labels, names, bookkeeping
# entries, app containers, shared mounts): defined once per policy.
SHARED = frozenset(
    {"anns", "labels", "cnames", "inames", "hashEntries", "hashWIEntries", "apps", "sharedMounts", "sharedEnv",
     "sharedDevices"}
)  # fmt: skip
_VAR = re.compile(r"variables\.([A-Za-z_][A-Za-z0-9_]*)")


def size(parts: GroupParts) -> int:
    """The bytes the group adds to a policy (its variables, gates and patch), near enough to pack by."""
    return len(orjson.dumps([parts.variables, parts.gates, parts.guards, parts.patch]))


def pack(groups: Sequence[GroupParts], previous: Mapping[str, str]) -> list[tuple[str, list[GroupParts]]]:
    """(policy name, its groups) for `groups`, keeping each where `previous` (SidecarSet -> the policy
    that injects it now) had most of its members, while it fits."""
    bins: dict[str, list[GroupParts]] = {}
    used: dict[str, int] = {}
    placed: set[str] = set()

    def fits(name: str, g: GroupParts) -> bool:
        return len(bins.get(name, ())) < MAX_GROUPS and used.get(name, 0) + size(g) <= MAX_BYTES

    def put(name: str, g: GroupParts) -> None:
        bins.setdefault(name, []).append(g)
        used[name] = used.get(name, 0) + size(g)
        placed.add(g.key)

    for g in groups:
        votes = [previous[m] for m in g.members if m in previous]
        if votes:
            home = max(sorted(set(votes)), key=votes.count)
            if home.startswith(NAME_PREFIX) and fits(home, g):
                put(home, g)
    index = 0
    for g in groups:
        if g.key in placed:
            continue
        while True:
            name = f"{NAME_PREFIX}{index}"
            if fits(name, g) or not bins.get(name):
                break
            index += 1
        put(name, g)
    return sorted(bins.items(), key=lambda item: int(item[0][len(NAME_PREFIX) :]))


def policy(name: str, groups: Sequence[GroupParts], *, manager_namespace: str) -> Generated:
    """The policy and binding that inject `groups`."""
    shared: dict[str, str] = {}
    own: list[tuple[str, str]] = []
    dispatch: list[str] = []
    for j, g in enumerate(groups):
        local = {n for n, _ in g.variables if n not in SHARED}

        def rename(expr: str, j: int = j, local: set[str] = local) -> str:
            return _VAR.sub(lambda m: f"{V}g{j}_{m[1]}" if m[1] in local else m[0], expr)

        for n, expr in g.variables:
            if n in SHARED:
                if shared.setdefault(n, expr) != expr:
                    raise ValueError(f"variable {n} is not the same in every group")
            else:
                own.append((f"g{j}_{n}", rename(expr)))
        own.append((f"g{j}_go", "&& ".join(rename(x) for x in (*g.gates, *g.guards))))
        own.append((f"g{j}_ops", rename(g.patch)))
        dispatch.append(f"({V}g{j}_go ? {V}g{j}_ops : [])")
    common = groups[0].common if groups else ()
    could = selecting.pods_selected([ss for g in groups for ss in g.sidecarsets], approximate=True)
    gates = "&& ".join((*common, f"({could}) // one-of-its-groups-could-select-the-pod\n"))
    chosen = dispatch[0] if len(dispatch) == 1 else "[" + ",\n".join(dispatch) + "].flatten()"
    patch = f"({chosen}){cel.AS_JSON_PATCH}"
    spec: JsonObj = {
        "failurePolicy": "Fail",
        "reinvocationPolicy": "Never",
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ],
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": names.NS_INJECTION_LABEL, "operator": "In", "values": [names.NS_INJECTION_ENABLED]},
                    {
                        "key": names.NS_NAME_LABEL,
                        "operator": "NotIn",
                        "values": sorted([*names.SYSTEM_NAMESPACES, manager_namespace]),
                    },
                ]
            },
            "objectSelector": {
                "matchExpressions": [{"key": names.POD_INJECT_LABEL, "operator": "NotIn", "values": ["false"]}]
            },
        },
        # One expression, not one per gate: each matchCondition is a program evaluation of its own.
        "matchConditions": [{"name": "sidecarctl-gates", "expression": gates}],
        "variables": [{"name": n, "expression": e} for n, e in (*shared.items(), *own)],
        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
    }
    members = ";".join(g.key for g in groups)
    return Generated(
        {
            "apiVersion": POLICY_API,
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name, "labels": dict(MANAGED_BY), "annotations": {ANN_MEMBERS: members}},
            "spec": spec,
        },
        {
            "apiVersion": POLICY_API,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": dict(MANAGED_BY)},
            # The policy's own constraint again: a binding with something to compare shows a hand edit.
            "spec": {
                "policyName": name,
                "matchResources": {"objectSelector": spec["matchConstraints"]["objectSelector"]},
            },
        },
        {g.key: g.digest for g in groups},
    )
