"""The error type and the small checks every part of SidecarSet validation shares.

Validation reads untrusted JSON: any field may be missing, null or of the wrong type. The
helpers here turn "wrong type" into a FieldError instead of an exception, so that the rule
modules can stay readable and the validator as a whole never raises.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from sidecarsets.spec import selectors
from sidecarsets.values.gofmt import format_g, quote


@dataclass(frozen=True)
class FieldError:
    """One problem, named by a JSON-path-like field such as `spec.containers[0].image`."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


Errors = list[FieldError]


# Constructors in the API server's wording (apimachinery's field.Error): `<Type>[: <value>][: <detail>]`,
# so that a SidecarSet refused here reads like the pod the API server would refuse later.
def go_value(value: Any) -> str:
    """A bad value as apimachinery prints it: strings quoted, numbers and booleans bare, the rest JSON."""
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_g(value)
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return "null"


def _body(kind: str, value: Any, detail: str, *, show_value: bool = True) -> str:
    out = f"{kind}: {go_value(value)}" if show_value else kind
    return f"{out}: {detail}" if detail else out


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(field, _body("Invalid value", value, detail))


def not_found(field: str, value: Any) -> FieldError:
    return FieldError(field, _body("Not found", value, ""))


def duplicate(field: str, value: Any) -> FieldError:
    return FieldError(field, _body("Duplicate value", value, ""))


def required(field: str, detail: str = "") -> FieldError:
    return FieldError(field, _body("Required value", None, detail, show_value=False))


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError(field, _body("Forbidden", None, detail, show_value=False))


def unsupported(field: str, value: Any, supported: Iterable[str]) -> FieldError:
    listed = ", ".join(quote(v) for v in supported)
    return FieldError(field, _body("Unsupported value", value, f"supported values: {listed}" if listed else ""))


DNS1123_LABEL_MAX = 63
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def type_name(value: Any) -> str:
    """JSON type name of `value`, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def obj_field(parent: Mapping[str, Any], key: str, path: str, errs: Errors) -> Mapping[str, Any] | None:
    """The object at `key`; None (and an error when present with another type) otherwise."""
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        errs.append(FieldError(path, f"must be an object, not {type_name(value)}"))
        return None
    return value


def list_field(parent: Mapping[str, Any], key: str, path: str, errs: Errors) -> list[Any]:
    """The array at `key`; empty (and an error when present with another type) otherwise."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        errs.append(FieldError(path, f"must be an array, not {type_name(value)}"))
        return []
    return value


def objects(items: list[Any], path: str, errs: Errors) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    """(index, path, item) for each object item of an array; other items are reported."""
    for i, item in enumerate(items):
        item_path = f"{path}[{i}]"
        if isinstance(item, Mapping):
            yield i, item_path, item
        else:
            errs.append(FieldError(item_path, f"must be an object, not {type_name(item)}"))


def str_field(parent: Mapping[str, Any], key: str, path: str, errs: Errors) -> str | None:
    """The string at `key`; None (and an error when present with another type) otherwise."""
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        errs.append(FieldError(path, f"must be a string, not {type_name(value)}"))
        return None
    return value


def bool_field(parent: Mapping[str, Any], key: str, path: str, errs: Errors) -> None:
    value = parent.get(key)
    if value is not None and not isinstance(value, bool):
        errs.append(FieldError(path, f"must be a boolean, not {type_name(value)}"))


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def dns1123_label_problem(value: str) -> str | None:
    """Why `value` is not a DNS-1123 label (container, volume, namespace names), or None."""
    if len(value) > DNS1123_LABEL_MAX:
        return f"must be no more than {DNS1123_LABEL_MAX} characters"
    if not _DNS1123_LABEL.match(value):
        return (
            f"{value!r} is not a DNS-1123 label: use lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return None


def qualified_name_problem(value: str) -> str | None:
    """Why `value` is not a label/annotation key (`[prefix/]name`), or None."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return f"key {value!r} has an invalid prefix: it must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _QUALIFIED_NAME_PART.match(name):
        return (
            f"key {value!r} is not a qualified name: at most 63 alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric, with an optional DNS subdomain prefix and '/'"
        )
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            f"label value {value!r} is invalid: at most 63 alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric"
        )
    return None


def validate_selector(selector: Any, path: str, errs: Errors, *, required: bool, what: str = "selector") -> None:
    """A LabelSelector that is set must be well formed and not empty (it would match everything).

    `required` reports a missing selector with Kruise's "no selector defined" message.
    """
    if selector is None:
        if required:
            errs.append(FieldError(path, f"no {what} defined for SidecarSet"))
        return
    try:
        selectors.validate(selector)
    except selectors.SelectorError as err:
        errs.append(FieldError(path, str(err)))
        return
    if selectors.is_empty(selector):
        errs.append(FieldError(path, "empty selector is not valid for sidecarset: it would match everything"))
        return
    for key, value in (selector.get("matchLabels") or {}).items():
        problem = qualified_name_problem(str(key)) or label_value_problem(value)
        if problem:
            errs.append(FieldError(f"{path}.matchLabels", problem))
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        problem = qualified_name_problem(expr["key"])
        for value in expr.get("values") or []:
            problem = problem or label_value_problem(value)
        if problem:
            errs.append(FieldError(f"{path}.matchExpressions[{i}]", problem))
