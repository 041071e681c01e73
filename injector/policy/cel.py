"""CEL text built from JSON values and label selectors, for the generated policies.

Literals are typed `dyn` where their items mix types: CEL list and map literals must be
homogeneous, and a container's fields mix strings, numbers, lists and objects (`literal`).
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
    """A JSON value as a CEL literal (lists are list(dyn), maps map(string, dyn)).

    Inside it, a list or map whose items all have one type (say a container's `resources` or an env
    entry: strings only) is written without `dyn()` around them: kube-apiserver type-checks a policy
    in time that grows with the square of its function calls (its checker copies every type binding
    made so far at each overload it tries), and `dyn()` is a call. The value is the same either way.
    """
    return _literal(value, top=True)[0]


def _literal(value: Any, *, top: bool = False) -> tuple[str, str | None]:
    """The literal and its CEL type when the checker gives it exactly that (None: `dyn` it)."""
    if isinstance(value, bool):
        return ("true" if value else "false"), "bool"
    if value is None:
        return "null", None
    if isinstance(value, int):
        return str(value), "int"
    if isinstance(value, float):
        return repr(value), "double"
    if isinstance(value, str):
        return string(value), "string"
    if isinstance(value, list):
        items = [_literal(x) for x in value]
        kind = _one_type(items, top)
        texts = [t if kind else f"dyn({t})" for t, _ in items]
        return "[" + ", ".join(texts) + "]", f"list({kind or 'dyn'})" if items else None
    if isinstance(value, dict):
        entries = {string(str(k)): _literal(x) for k, x in value.items()}
        kind = _one_type(list(entries.values()), top)
        texts = [f"{k}: {t if kind else f'dyn({t})'}" for k, (t, _) in entries.items()]
        return "{" + ", ".join(texts) + "}", f"map(string, {kind or 'dyn'})" if entries else None
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _one_type(items: list[tuple[str, str | None]], top: bool) -> str | None:
    """The type all `items` share, if they share one and the container may be typed by it (not at
    the top, whose callers combine it with values of other types as list(dyn) or map(string, dyn))."""
    kinds = {kind for _, kind in items}
    if top or len(kinds) != 1:
        return None
    return next(iter(kinds))


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
