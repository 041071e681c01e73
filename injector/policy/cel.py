"""CEL text built from JSON values and label selectors, for the generated policies.

Literals are typed `dyn` throughout: CEL list and map literals must be homogeneous, and a
container's fields mix strings, numbers, lists and objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sidecarsets.spec import names

if TYPE_CHECKING:
    from sidecarsets.spec.model import SidecarSet

VARIABLES = "variables."
# A read of a policy variable, `variables.NAME`; the match's first group is NAME.
VARIABLE_READ = re.compile(re.escape(VARIABLES) + r"([A-Za-z_][A-Za-z0-9_]*)\b")
# A pod's labels and annotations, present or not (outside `variables`: matchConditions cannot read them).
LABELS = "(has(object.metadata.labels) ? object.metadata.labels : {})"
ANNOTATIONS = "(has(object.metadata.annotations) ? object.metadata.annotations : {})"
# The namespace's labels, inside a mutation only (a policy's matchConditions see `namespaceObject` empty).
NAMESPACE_LABELS = "(namespaceObject.metadata.labels)"
# The values a change of image moves (images, the SidecarSet's hash, its bookkeeping entry), read
# from the policy's parameter object instead of written into its CEL (injector.policy.params).
# A PodTemplate's template annotations: a map of strings in every kube-apiserver's schema of the kind.
PARAMS = "params.template.metadata.annotations"


def in_scope(ss: SidecarSet, labels: str = NAMESPACE_LABELS) -> str | None:
    """CEL over a namespace's `labels`: `ss` selects pods there; None when it selects every namespace.
    A NamespacedSidecarSet's scope is its own namespace, unless that namespace turned the kind off
    (sidecarsets.spec.reading.own_namespace: the webhook's test, written out)."""
    if ss.namespace_selector is None:
        return None
    term = selector(ss.namespace_selector, labels)
    if ss.namespaced:
        key, off = string(names.NS_NAMESPACED_SIDECARSETS_LABEL), string(names.NS_NAMESPACED_SIDECARSETS_DISABLED)
        term += f" && !({key} in {labels} && {labels}[{key}] == {off})"
    return term


# How every read of the parameter object opens: the generator prefixes each key with its CEL's version.
PARAM_KEY = f'{PARAMS}["'


def param(key: str) -> str:
    """CEL: the string under `key` in the policy's parameter object (injector.policy.params)."""
    return f"string({PARAM_KEY}{string(key)[1:]}])"


def string(value: str) -> str:
    """A CEL string literal."""
    return json.dumps(value, ensure_ascii=False)


def strings(values: Iterable[str]) -> str:
    return "[" + ", ".join(string(v) for v in values) + "]"


def literal(value: Any) -> str:
    """A JSON value as a CEL literal (lists are list(dyn), maps map(string, dyn))."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return string(value)
    if isinstance(value, list):
        return "[" + ", ".join(f"dyn({literal(x)})" for x in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{string(str(k))}: dyn({literal(x)})" for k, x in value.items()) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def patch_op(op: str, path: str, value: str) -> str:
    """One JSON Patch operation as a CEL map (`op` a literal; `path`, `value` CEL expressions).

    Maps, not `JSONPatch{...}` objects: that type exists only inside a mutation's expression, and a
    policy keeps each group's operations in a variable (injector.policy.bundle) which the mutation
    turns into JSONPatch objects (`AS_JSON_PATCH`).
    """
    return f'{{"op": dyn({string(op)}), "path": dyn({path}), "value": dyn({value})}}'


# Applied to a list of `patch_op` maps inside a mutation.
AS_JSON_PATCH = ".map(o, JSONPatch{op: o.op, path: o.path, value: o.value})"


def pointer(key: str) -> str:
    """One JSON Pointer segment (RFC 6901): `~` and `/` escaped."""
    return key.replace("~", "~0").replace("/", "~1")


def selector(sel: Mapping[str, Any] | None, labels: str) -> str:
    """A LabelSelector as a CEL boolean over the label-map expression `labels`; None matches nothing."""
    if sel is None:
        return "false"
    terms = []
    for key, value in (sel.get("matchLabels") or {}).items():
        terms.append(f"({string(key)} in {labels} && {labels}[{string(key)}] == {string(value)})")
    for expr in sel.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            terms.append(f"({string(key)} in {labels} && {labels}[{string(key)}] in {strings(values)})")
        elif op == "NotIn":
            terms.append(f"(!({string(key)} in {labels}) || !({labels}[{string(key)}] in {strings(values)}))")
        elif op == "Exists":
            terms.append(f"({string(key)} in {labels})")
        elif op == "DoesNotExist":
            terms.append(f"!({string(key)} in {labels})")
        else:
            return "false"
    return " && ".join(terms) or "true"


def as_expressions(sel: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A LabelSelector as matchExpressions only (a binding's selectors accept both; one form is simpler)."""
    sel = sel or {}
    out: list[dict[str, Any]] = [
        {"key": k, "operator": "In", "values": [v]} for k, v in (sel.get("matchLabels") or {}).items()
    ]
    return out + [dict(e) for e in sel.get("matchExpressions") or []]


def renamed_variables(expr: str, names: Mapping[str, str]) -> str:
    """`expr` reading, for each variable in `names`, the variable it maps to instead."""
    return VARIABLE_READ.sub(lambda m: VARIABLES + names.get(m.group(1), m.group(1)), expr) if names else expr


def inline_variables(expr: str, variables: Iterable[tuple[str, str]]) -> str:
    """`expr` with every `variables.NAME` replaced by its definition (matchConditions cannot read them)."""
    defined = dict(variables)
    changed = True
    while changed:
        changed = False
        for name in sorted(defined, key=len, reverse=True):
            if VARIABLES + name in expr:
                expr = expr.replace(VARIABLES + name, "(" + defined[name] + ")")
                changed = True
    return expr
