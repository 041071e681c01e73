"""Overlap groups packed into few MutatingAdmissionPolicies, so the API server's cost per pod stays flat.

kube-apiserver matches every policy against every namespaced write, linearly, parsing each
policy's and binding's label selectors again per request (its profile at 30 policies: 5 % of its CPU
in LabelSelectorAsSelector for pods no policy touches), and each invocation that mutates re-encodes
and re-decodes the pod. One policy per overlap group made every pod of the cluster pay for every
SidecarSet. Here a policy carries up to MAX_GROUPS groups (MAX_BYTES of JSON):

- its matchCondition: the gates all groups share, then "one of my groups could select the pod" as
  constant-set lookups (injector.policy.selecting): a pod none of them selects costs a few map
  lookups, and no mutation;
- per group j, its CEL as generated for it alone (so the output is the same), with its own
  variables bound inside it (`fold`): its exact selector first, then its own gates, and if they
  hold its JSON Patch operations as maps (the JSONPatch type exists only in a mutation); the
  groups share a few variables `groupsK`, each as many groups as one CEL expression holds, and
  only the groups whose required labels the pod carries (`candidates`, a constant map) evaluate
  more than a membership test;
- one mutation: the operations of the (at most one) group whose gates hold, as JSONPatch objects.
  Groups are overlap groups, so no pod is selected by two of them; the others stop at their selector.
  It reads only the `groupsK` holding a candidate (`chunks`, from a constant list): variables are
  lazy, so the others are never built (at 60 groups in 30 variables, the API server spent 0.4 ms of
  a pod's admission resolving them all).

Packing is sticky: a group stays in the policy that held it (`previous`) while it fits, so adding
or removing a SidecarSet rewrites one policy, not all of them; new groups fill the first policy
with room, in the order of their oldest member.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from injector.policy import cel, hoisting, params, selecting
from injector.policy.build import V
from injector.policy.generate import ANN_MEMBERS, MANAGED_BY, POLICY_API, Generated, GroupParts
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names, podindex

NAME_PREFIX = "sidecarctl-injection-"
OPT_OUT: JsonObj = {"matchExpressions": [{"key": names.POD_INJECT_LABEL, "operator": "NotIn", "values": ["false"]}]}
# Groups per policy, and their CEL: kube-apiserver compiles a policy when it is written and again to
# enforce it (60 two-sidecar groups: 1.7 s for a dryRun create here, 5-7 s during a burst), and a client
# waits 30 s for a write.
MAX_GROUPS = 60
MAX_BYTES = 768 * 1024
# A policy's object selector names a label key all its groups require, with their values while they
# are at most this many, and by the key's presence (`Exists`) past that. Both costs are
# kube-apiserver's, measured at 1,000 policy-served SidecarSets (bench_scale.py, 2026-12-06): it
# parses every policy's selectors again for each namespaced write in an injection-enabled namespace,
# before it looks at the resource, about 0.37 µs a value, so values tax every ConfigMap, Event and
# status update there (with expressions, 3,000 values: an unlabelled ConfigMap 2.2 against 1.1 ms of
# CPU beside one SidecarSet; with `Exists`, 1.0 against 1.0 ms); `Exists` instead sends every pod
# that has the key through every such policy's matching and condition (about 0.1 ms each). At one
# value per group (two-label selectors, 60 values a policy) the values cost pods less (a policy-served
# pod 5.5 against 10.7 ms at 1,000, a ConfigMap 1.9 against 1.2 ms); at three (`In` of three values,
# 180 a policy) presence costs less for every kind of write (a policy-served pod 1.96x what it costs
# beside one SidecarSet against 2.21x, a ConfigMap 1.1 against 2.2 ms). docs/benchmarks.md has the runs.
SELECTOR_VALUES = 60
# The API server builds an entry for every variable of a policy on each evaluation, its condition's
# too (1.3 µs each in its profile at 4 policies of 90), so groups could share variables; but it
# type-checks an expression in time that grows with the square of its length, when the policy is
# written and again to enforce it (40 groups: 27.5 s in 90,000-character variables, 5.7 s in 20,000,
# 3.5 s in one variable each; 60 two-sidecar groups: 10.0 s in 40,000, 4.3 s in 20,000, 2.75 s in one
# each). Compiling is what a burst of SidecarSets and every rewrite cost the whole API server, while
# 30 more variables cost a pod its policy serves some 40 µs of 4-8 ms: every group in a variable of
# its own.
CHUNK_CHARS = 0
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
    (or key) each group's selectors require (sidecarsets.spec.podindex), chosen among the policy's
    groups so that it tells them apart: the mutation evaluates the variable of those groups only,
    not one per group of the policy."""
    by_label: dict[str, list[int]] = {}
    by_key: dict[str, list[int]] = {}
    loose: list[int] = []
    chosen = podindex.Anchors(ss.selector for g in groups for ss in g.sidecarsets)
    for j, g in enumerate(groups):
        entries = []
        for ss in g.sidecarsets:
            found = chosen.of(ss.selector)
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


def _label_values(selector: Mapping[str, object] | None) -> dict[str, set[str]]:
    """key -> the values a pod matching `selector` may have for it, for every key it requires a value of."""
    found: dict[str, set[str]] = {}
    for alternative in podindex.requirements(selector) or ():
        if all(kind == "label" for kind, _, _ in alternative):
            key = alternative[0][1]
            values = {str(v) for _, _, v in alternative}
            found[key] = found[key] & values if key in found else values
    return found


def _required_key(groups: Sequence[GroupParts]) -> list[JsonObj]:
    """A label key every SidecarSet of the policy requires a value of, as an object selector: with the
    values they allow while there are at most SELECTOR_VALUES, else the key's presence. The API server
    then skips the policy before any CEL for pods without it (and, with values, for pods of other
    teams). Of several such keys (`team` and `tier` in `{team: t7, tier: web}`), the one with the most
    values tells the groups apart."""
    found: Values | None = None
    for g in groups:
        found = _merged(found, _values_of(g))
    common = found or {}
    if not common:
        return []
    key = max(common, key=lambda k: (len(common[k]), k))
    # No values at all: selectors no pod can meet (`team: a` and `team In [b]`); the API server refuses
    # an `In` without values, and the policy's condition turns such pods away anyway.
    if not common[key] or len(common[key]) > SELECTOR_VALUES:
        return [{"key": key, "operator": "Exists"}]
    return [{"key": key, "operator": "In", "values": sorted(common[key])}]


Values = dict[str, set[str]]  # label key -> the values a pod must have one of


def _values_of(g: GroupParts) -> Values:
    """The label keys every SidecarSet of the group requires a value of, with the values they allow."""
    common: Values | None = None
    for ss in g.sidecarsets:
        common = _merged(common, _label_values(ss.selector))
    return common or {}


def _merged(a: Values | None, b: Values) -> Values:
    """The keys both require, with the values either allows (a policy holding both groups)."""
    return dict(b) if a is None else {k: a[k] | b[k] for k in a.keys() & b.keys()}


def anchored(g: GroupParts) -> bool:
    """Whether every SidecarSet of the group requires some pod label: one that does not makes its
    policy's condition true for every pod, so such groups are kept in policies of their own."""
    return all(podindex.label_anchors(ss.selector) is not None for ss in g.sidecarsets)


def pack(groups: Sequence[GroupParts], previous: Mapping[str, str]) -> list[tuple[str, list[GroupParts]]]:
    """(policy name, its groups) for `groups`, keeping each where `previous` (SidecarSet -> the policy
    that injects it now) had most of its members, while it fits."""
    bins: dict[str, list[GroupParts]] = {}
    used: dict[str, int] = {}
    placed: set[str] = set()

    values: dict[str, Values] = {}  # policy -> its groups' required values (its object selector)

    def fits(name: str, g: GroupParts) -> bool:
        held = bins.get(name, ())
        if not held:
            return True
        if anchored(held[0]) != anchored(g) or len(held) >= MAX_GROUPS or used[name] + g.size > MAX_BYTES:
            return False
        # A group that would leave the policy without an object selector (no key they all require)
        # goes elsewhere: every pod would then reach the policy's condition.
        return not values[name] or bool(_merged(values[name], _values_of(g)))

    def put(name: str, g: GroupParts) -> None:
        bins.setdefault(name, []).append(g)
        used[name] = used.get(name, 0) + g.size
        values[name] = _merged(values.get(name), _values_of(g))
        placed.add(g.key)

    for g in groups:
        votes = [previous[m] for m in g.members if m in previous]
        if votes:
            home = max(sorted(set(votes)), key=votes.count)
            if home.startswith(NAME_PREFIX) and fits(home, g):
                put(home, g)
    for g in groups:
        if g.key in placed:
            continue
        index = 0  # from the first: a policy of the other kind (anchored or not) may have been skipped
        while True:
            name = f"{NAME_PREFIX}{index}"
            if fits(name, g) or not bins.get(name):
                break
            index += 1
        put(name, g)
    # Within a policy, groups keep the order given: a group joining one lands where the next pass
    # would put it, so the policy is written once, not once appended and again in order.
    order = {g.key: i for i, g in enumerate(groups)}
    for held in bins.values():
        held.sort(key=lambda g: order[g.key])
    return sorted(bins.items(), key=lambda item: int(item[0][len(NAME_PREFIX) :]))


def policy(name: str, groups: Sequence[GroupParts], *, manager_namespace: str) -> Generated:
    """The policy, binding and parameter object that inject `groups`."""
    shared: dict[str, str] = {}
    alike, replaced = hoisting.common([[(n, e) for n, e in g.variables if n not in SHARED] for g in groups])
    codes = [_group_code(index, g, shared, replaced[index]) for index, g in enumerate(groups)]
    chunk_variables, chosen = _chunked(codes)
    own = [("candidates", candidates(groups)), *chunk_variables]
    gates = _gates(groups, manager_namespace)
    patch = f"({chosen}){cel.AS_JSON_PATCH}"
    spec: JsonObj = {
        "paramKind": params.kind(),
        "failurePolicy": "Fail",
        "reinvocationPolicy": "Never",
        "matchConstraints": {
            "resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
            ],
            # The system namespaces are left out by the matchCondition, not here: kube-apiserver parses
            # every policy's namespace selector again for each namespaced write of any kind, before it
            # looks at the resource, while the condition runs only for pods the selectors let through.
            "namespaceSelector": {"matchLabels": {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}},
            "objectSelector": {
                "matchExpressions": [
                    *OPT_OUT["matchExpressions"],
                    *_required_key(groups),
                ]
            },
        },
        # One expression, not one per gate: each matchCondition is a program evaluation of its own.
        "matchConditions": [{"name": "sidecarctl-gates", "expression": gates}],
        "variables": [{"name": n, "expression": e} for n, e in (*shared.items(), *alike, *own)],
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
            # The pod opt-out again (the policy has it already): a binding with something to compare
            # shows a hand edit, and a short selector costs the API server little per pod.
            "spec": {
                "policyName": name,
                "paramRef": params.reference(name, manager_namespace),
                "matchResources": {"objectSelector": OPT_OUT},
            },
        },
        {g.key: g.digest for g in groups},
        params.parameter_object(name, manager_namespace, {k: v for g in groups for k, v in g.params}, MANAGED_BY),
    )


def _group_code(index: int, g: GroupParts, shared: dict[str, str], alike: dict[str, str]) -> str:
    """Group `index`'s CEL in the policy: its operations when it is a candidate and its gates hold,
    else none. Its own variables are folded into it, but those it writes as other groups do, which
    read the policy's (`alike`, injector.policy.hoisting); those every group defines alike go to
    `shared`."""
    local: list[tuple[str, str]] = []
    for variable, expression in g.variables:
        if variable in alike:
            continue
        if variable not in SHARED:
            local.append((variable, cel.renamed_variables(expression, alike)))
        elif shared.setdefault(variable, expression) != expression:
            raise ValueError(f"variable {variable} is not the same in every group")
    gates = "&& ".join(g.gates)
    code = cel.renamed_variables(f"({gates}) ?\n({g.patch}) : []", alike)
    body = fold(local, code, prefix=f"g{index}_")
    return f"({index} in {V}candidates ? ({body}) : [])"


def _chunked(codes: Sequence[str]) -> tuple[list[tuple[str, str]], str]:
    """The `groupsK` variables holding the groups' code, at most CHUNK_CHARS each, and the expression
    the mutation reads: only the chunks holding a candidate (variables are lazy)."""
    chunks: list[list[str]] = [[]]
    chunk_of: list[int] = []  # group index -> the chunk that holds it
    for code in codes:
        if chunks[-1] and sum(map(len, chunks[-1])) + len(code) > CHUNK_CHARS:
            chunks.append([])
        chunks[-1].append(code)
        chunk_of.append(len(chunks) - 1)
    variables = [(f"groups{k}", "[" + ",\n".join(chunk) + "].flatten()") for k, chunk in enumerate(chunks)]
    if len(chunks) == 1:
        return variables, f"{V}groups0"
    variables.append(("chunks", f"{V}candidates.map(j, {chunk_of}[j])"))
    return variables, " + ".join(f"({k} in {V}chunks ? {V}groups{k} : [])" for k in range(len(chunks)))


def _gates(groups: Sequence[GroupParts], manager_namespace: str) -> str:
    """The policy's one matchCondition: not a system namespace, the gates every group shares, and
    "one of its groups could select the pod" read by anchors (a lookup for a pod of another team)."""
    common = groups[0].common if groups else ()
    could = selecting.pods_selected([ss for g in groups for ss in g.sidecarsets], approximate=True)
    system = cel.strings(sorted([*names.SYSTEM_NAMESPACES, manager_namespace]))
    return "&& ".join(
        (
            # First: past an `Exists` object selector, pods of every team reach it, and most stop here.
            f"({could}) // one-of-its-groups-could-select-the-pod\n",
            f"!(request.namespace in {system}) // not-a-system-namespace\n",
            *common,
        )
    )
