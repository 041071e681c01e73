"""Overlap groups packed into few MutatingAdmissionPolicies, so the API server's cost per pod stays flat.

kube-apiserver matches every policy against every namespaced write, linearly, parsing each
policy's and binding's label selectors again per request (its profile at 30 policies: 5 % of its CPU
in LabelSelectorAsSelector for pods no policy touches), and each invocation that mutates re-encodes
and re-decodes the pod. One policy per overlap group made every pod of the cluster pay for every
SidecarSet. Here a policy carries up to MAX_GROUPS groups (MAX_BYTES of JSON):

- its matchCondition: the gates all groups share, then "one of my groups could select the pod" as
  constant-set lookups (injector.policy.selecting): a pod none of them selects costs a few map
  lookups, and no mutation;
- per group j, one variable `gJ`: its exact selector first, then its own gates and namespace
  guards, and if they hold its JSON Patch operations as maps (the JSONPatch type exists only in a
  mutation), with the group's own variables bound inside it (`fold`): the CEL as generated for the
  group alone, so the output is the same;
- one mutation: the operations of the (at most one) group whose gates hold, as JSONPatch objects.
  Groups are overlap groups, so no pod is selected by two of them; the others stop at their selector.

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
from sidecarsets.spec import names, podindex

NAME_PREFIX = "sidecarctl-injection-"
MAX_GROUPS = 100  # groups per policy: each costs a pod of a labelled namespace one selector check
MAX_BYTES = 1024 * 1024  # a policy's JSON: under etcd's 1.5 MiB request limit, and compiled in a few seconds
# Variables every group defines the same way (the pod's annotations, labels, names, bookkeeping
# entries, app containers, shared mounts): defined once per policy.
SHARED = frozenset(
    {"anns", "labels", "cnames", "inames", "hashEntries", "hashWIEntries", "apps", "sharedMounts", "sharedEnv",
     "sharedDevices"}
)  # fmt: skip


def fold(local: Sequence[tuple[str, str]], body: str, *, prefix: str) -> str:
    """`body` with the group's own variables bound inside it instead of being policy variables.

    The API server builds a lazy entry for every variable of a policy on each evaluation (its
    profile: 8 % of its CPU at 30 groups of 15 variables), so a policy of many groups keeps one
    variable per group. A variable used once is written where it is used; one used more often is
    bound once, `[definition].map(name, ...)[0]`, around everything after it.
    """
    for name, expr in reversed(local):
        ref = re.compile(rf"{re.escape(V + name)}\b")
        uses = len(ref.findall(body))
        if uses == 0:
            continue
        if uses == 1:
            at = ref.search(body)
            assert at is not None
            body = f"{body[: at.start()]}({expr}){body[at.end() :]}"
        else:
            body = f"[{expr}].map({prefix}{name}, {ref.sub(prefix + name, body)})[0]"
    return body


def candidates(groups: Sequence[GroupParts]) -> str:
    """CEL: the indices of the groups that may select the pod, from constant maps keyed by a label
    (or key) each group's selectors require (sidecarsets.spec.podindex): the mutation evaluates the
    variable of those groups only, not one per group of the policy."""
    by_label: dict[str, list[int]] = {}
    by_key: dict[str, list[int]] = {}
    loose: list[int] = []
    for j, g in enumerate(groups):
        entries = []
        for ss in g.sidecarsets:
            found = podindex.label_anchors(ss.selector)
            if found is None:
                loose.append(j)
                break
            entries += found
        else:
            for kind, key, value in entries:
                into = by_label.setdefault(f"{key}={value}", []) if kind == "label" else by_key.setdefault(key, [])
                if not into or into[-1] != j:
                    into.append(j)

    def literal(m: dict[str, list[int]]) -> str:
        return "{" + ", ".join(f"{cel.string(k)}: {v}" for k, v in sorted(m.items())) + "}"

    labels = f"{V}labels"
    lookup = f'{labels}.map(k, {literal(by_label)}[?(k + "=" + {labels}[k])].orValue([]))'
    if by_key:
        lookup += f" + {labels}.map(k, {literal(by_key)}[?k].orValue([]))"
    return f"{loose} + ({lookup}).flatten()"


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
    for j, g in enumerate(groups):
        local: list[tuple[str, str]] = []
        for n, expr in g.variables:
            if n not in SHARED:
                local.append((n, expr))
            elif shared.setdefault(n, expr) != expr:
                raise ValueError(f"variable {n} is not the same in every group")
        go = "&& ".join((*g.gates, *g.guards))
        own.append((f"g{j}", f"({go}) ?\n({fold(local, g.patch, prefix=f'g{j}_')}) : []"))
    own.append(("candidates", candidates(groups)))
    dispatch = [f"({j} in {V}candidates ? {V}g{j} : [])" for j in range(len(groups))]
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
