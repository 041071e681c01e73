"""Reading untrusted SidecarSet JSON in one of two modes: strict or tolerant.

Strict (manifests, admission, injection): the first structural problem raises ModelError naming
the field, because injecting from a half-understood SidecarSet could give pods the wrong sidecars.
Tolerant (objects read back from the cluster, for status and rollouts): nothing raises; every
problem is recorded with its field and the field reads as its empty value, so a SidecarSet written
before validation existed, or edited past it, is still counted and reported instead of crashing the
controller. Consumers that depend on a field ask `problem(...)` for it and decide.

Some problems are never fatal, even in strict mode (`advisory`): fields injection does not read
(the update strategy) must not make a SidecarSet unusable for injection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from kuberuntime.jsontypes import JsonObj, mapping
from sidecarsets.spec import names

E = TypeVar("E", bound=StrEnum)


class ModelError(ValueError):
    """A SidecarSet object too malformed to inject from; the message names the field."""


@dataclass(frozen=True, slots=True)
class Problem:
    field: str
    message: str  # the whole sentence, starting with the field

    def __str__(self) -> str:
        return self.message


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


class Reader:
    """Collects problems (tolerant) or raises the first one (strict)."""

    def __init__(self, *, tolerant: bool) -> None:
        self.tolerant = tolerant
        self.problems: list[Problem] = []

    def fail(self, field: str, message: str, *, advisory: bool = False) -> None:
        if not (self.tolerant or advisory):
            raise ModelError(message)
        self.problems.append(Problem(field, message))

    def object(self, value: Any, field: str, *, required: bool = False, advisory: bool = False) -> JsonObj:
        """The object `value`; `{}` when absent (and not required) or reported."""
        if value is None and not required:
            return {}
        if not isinstance(value, dict):
            self.fail(field, f"{field} must be an object, not {type_name(value)}", advisory=advisory)
            return {}
        return value

    def optional_object(self, value: Any, field: str, *, advisory: bool = False) -> JsonObj | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.fail(field, f"{field} must be an object, not {type_name(value)}", advisory=advisory)
            return None
        return value

    def list(self, value: Any, field: str, *, advisory: bool = False) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(field, f"{field} must be a list, not {type_name(value)}", advisory=advisory)
            return []
        return value

    def string(self, value: Any, field: str, *, advisory: bool = False) -> str | None:
        if value is None or isinstance(value, str):
            return value
        self.fail(field, f"{field} must be a string", advisory=advisory)
        return None

    def boolean(self, value: Any, field: str, *, advisory: bool = False) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            self.fail(field, f"{field} must be a boolean", advisory=advisory)
            return False
        return value

    def enum(self, value: Any, field: str, enum: type[E], default: E, *, advisory: bool = False) -> E:
        """`value` as a member of `enum`; an empty string counts as unset, as in Kruise."""
        if value is None or value == "":
            return default
        for member in enum:
            if value == member.value:
                return member
        allowed = ", ".join(m.value for m in enum)
        self.fail(field, f"{field}: unsupported value {value!r} (one of {allowed})", advisory=advisory)
        return default

    def named_objects(self, value: Any, field: str) -> tuple[JsonObj, ...]:
        """A list of objects with non-empty string names (volumes, pull secrets); bad items are dropped."""
        out: list[JsonObj] = []
        for i, item in enumerate(self.list(value, field)):
            if not isinstance(item, dict):
                self.fail(f"{field}[{i}]", f"{field}[{i}] must be an object, not {type_name(item)}")
                continue
            name = item.get("name")
            if not isinstance(name, str) or not name:
                self.fail(f"{field}[{i}].name", f"{field}[{i}].name must be a non-empty string")
                continue
            out.append(item)
        return tuple(out)


def first_problem(problems: tuple[Problem, ...], *prefixes: str, exact: bool = False) -> Problem | None:
    """The first problem on a field at or under any of `prefixes` (only at them with `exact`)."""
    for problem in problems:
        for prefix in prefixes:
            f = problem.field
            if f == prefix or (not exact and f.startswith((prefix + ".", prefix + "["))):
                return problem
    return None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- the fields SidecarSet.from_object reads with these helpers ---------------------------------
def namespace_scope(reader: Reader, spec: Mapping[str, Any], *, beta: bool) -> JsonObj | None:
    """The selector of the namespaces in scope; one namespace (which wins) is its name label.

    v1alpha1: `namespace` and `namespaceSelector`; v1beta1: Kruise 1.9's top-level
    `namespaceSelector`, or the legacy `specificNamespace` (sidecarsets.spec.conversion).
    """
    where = "spec"
    scope: Mapping[str, Any] = spec
    if beta:
        specific = reader.optional_object(spec.get("specificNamespace"), "spec.specificNamespace")
        if specific is not None:
            if spec.get("namespaceSelector") is not None:
                reader.fail(
                    "spec.namespaceSelector", "spec.namespaceSelector and spec.specificNamespace are mutually exclusive"
                )
            where, scope = "spec.specificNamespace", specific
    namespace = None if beta and scope is spec else reader.string(scope.get("namespace"), f"{where}.namespace")
    if namespace:
        return {"matchLabels": {names.NS_NAME_LABEL: namespace}}
    return reader.optional_object(scope.get("namespaceSelector"), f"{where}.namespaceSelector")


def own_scope(reader: Reader, spec: Mapping[str, Any], namespace: str) -> JsonObj:
    """A NamespacedSidecarSet selects pods of its own namespace only: it has no namespace fields."""
    for field in ("namespaceSelector", "namespace", "specificNamespace"):
        if spec.get(field) is not None:
            reader.fail(
                f"spec.{field}",
                f"spec.{field}: a {names.NAMESPACED_KIND} selects pods of its own namespace only and has no such field",
            )
    return {"matchLabels": {names.NS_NAME_LABEL: namespace}}


def own_namespace(namespace: str) -> Callable[[Mapping[str, str]], bool]:
    """Its namespace, unless that namespace turned NamespacedSidecarSets off."""

    def matches(labels: Mapping[str, str]) -> bool:
        return labels.get(names.NS_NAME_LABEL) == namespace and not names.namespaced_sidecarsets_disabled(labels)

    return matches


def only_name_label(selector: Mapping[str, Any]) -> bool:
    """Whether the selector constrains nothing but the namespace name label (so a name decides it)."""
    try:
        keys = set(mapping(selector, "matchLabels").keys())
        for expr in selector.get("matchExpressions") or []:
            if isinstance(expr, Mapping):
                keys.add(str(expr.get("key")))
    except (AttributeError, TypeError):  # ill-formed: such a selector matches nothing anyway
        return False
    return keys <= {names.NS_NAME_LABEL}


def history_limit(reader: Reader, value: Any) -> int:
    """Kruise keeps at least one revision; the default is 10."""
    if value is None:
        return 10
    if not is_int(value):
        reader.fail(
            "spec.revisionHistoryLimit", f"spec.revisionHistoryLimit must be an integer, got {value!r}", advisory=True
        )
        return 10
    return int(max(1, value))


def collision_count(reader: Reader, value: Any) -> int:
    if value is None:
        return 0
    if not is_int(value) or value < 0:
        reader.fail(
            "status.collisionCount",
            f"status.collisionCount must be a non-negative integer, got {value!r}",
            advisory=True,
        )
        return 0
    return int(value)
