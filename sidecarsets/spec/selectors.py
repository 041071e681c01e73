"""Kubernetes label selectors: matching and overlap.

Matching follows apimachinery's LabelSelectorAsSelector; overlap follows Kruise's
IsSelectorOverlapping, which the conflict check between SidecarSets depends on: two selectors
are disjoint only when some key is pinned to values that cannot both hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SelectorError(ValueError):
    """A selector that the API server would reject; the message names what is wrong."""


def _requirements(selector: Mapping[str, Any]) -> list[tuple[str, str, frozenset[str]]]:
    reqs: list[tuple[str, str, frozenset[str]]] = []
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise SelectorError("matchLabels must be a map of strings")
    for key, value in labels.items():
        if not isinstance(value, str):
            raise SelectorError(f"matchLabels[{key}] must be a string")
        reqs.append((str(key), "In", frozenset((value,))))
    exprs = selector.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise SelectorError("matchExpressions must be a list")
    for i, expr in enumerate(exprs):
        if not isinstance(expr, Mapping):
            raise SelectorError(f"matchExpressions[{i}] must be an object")
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str) or not key:
            raise SelectorError(f"matchExpressions[{i}].key must be a non-empty string")
        if op not in OPERATORS:
            raise SelectorError(f"matchExpressions[{i}].operator {op!r} is not one of {', '.join(OPERATORS)}")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"matchExpressions[{i}].values must be a list of strings")
        if op in ("In", "NotIn") and not values:
            raise SelectorError(f"matchExpressions[{i}].values must be non-empty for operator {op}")
        if op in ("Exists", "DoesNotExist") and values:
            raise SelectorError(f"matchExpressions[{i}].values must be empty for operator {op}")
        reqs.append((key, str(op), frozenset(values)))
    return reqs


def validate(selector: Any) -> None:
    """Raise SelectorError when `selector` is not a well-formed LabelSelector."""
    if not isinstance(selector, Mapping):
        raise SelectorError("selector must be an object")
    _requirements(selector)


def is_empty(selector: Mapping[str, Any] | None) -> bool:
    """An empty selector (no labels, no expressions) matches everything."""
    return not selector or (not selector.get("matchLabels") and not selector.get("matchExpressions"))


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """True when `labels` satisfy `selector`. A nil selector matches nothing, an empty one all.

    An ill-formed selector matches nothing: it must never widen injection.
    """
    return matcher(selector)(labels)


def _never(labels: Mapping[str, str]) -> bool:
    return False


def matcher(selector: Mapping[str, Any] | None) -> Callable[[Mapping[str, str]], bool]:
    """`matches` with the selector parsed once, for testing many label sets against one selector.

    Same answers as `matches(selector, labels)`: a nil or ill-formed selector matches nothing,
    an empty one matches everything.
    """
    if selector is None:
        return _never
    try:
        reqs = tuple(_requirements(selector))
    except SelectorError:
        return _never

    def match(labels: Mapping[str, str]) -> bool:
        for key, op, values in reqs:
            value = labels.get(key)
            present = value is not None or key in labels
            if op == "In":
                if not present or value not in values:
                    return False
            elif op == "NotIn":
                if present and value in values:
                    return False
            elif op == "Exists":
                if not present:
                    return False
            elif present:  # DoesNotExist
                return False
        return True

    return match


def overlap(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether some label set could match both selectors (conservative: unsure means yes).

    Disjoint only when a key is required on one side with values the other side excludes:
    In vs In with no common value, In vs NotIn covering all of them, Exists vs DoesNotExist.
    """
    if a is None or b is None:
        return False
    try:
        ra, rb = _requirements(a), _requirements(b)
    except SelectorError:
        return True
    for ka, opa, va in ra:
        for kb, opb, vb in rb:
            if ka != kb:
                continue
            if _disjoint(opa, va, opb, vb) or _disjoint(opb, vb, opa, va):
                return False
    return True


def _disjoint(opa: str, va: frozenset[str], opb: str, vb: frozenset[str]) -> bool:
    if opa == "In" and opb == "In":
        return not (va & vb)
    if opa == "In" and opb == "NotIn":
        return va <= vb
    return opa in ("In", "Exists") and opb == "DoesNotExist"


def names_namespaces(selector: Mapping[str, Any] | None, name_label: str) -> bool:
    """Whether Kruise's SidecarSet namespace index files a namespace selector under namespace names
    (`IndexSidecarSetV1Beta1`): `name_label` in matchLabels, else an `In` expression on it. Kruise's
    pod webhook injects the SidecarSets it finds so before the cluster-wide ones, so that decides
    the order of sidecars from different SidecarSets (sidecarsets.spec.model: `injection_order`)."""
    if not isinstance(selector, Mapping):
        return False
    labels = selector.get("matchLabels")
    if isinstance(labels, Mapping) and name_label in labels:
        return True
    expressions = selector.get("matchExpressions")
    return any(
        isinstance(e, Mapping) and e.get("key") == name_label and e.get("operator") == "In"
        for e in (expressions if isinstance(expressions, list) else [])
    )
