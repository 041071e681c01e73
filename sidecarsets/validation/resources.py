"""Validation of a sidecar's resourcesPolicy, with Kruise's rules and messages.

The expressions (`max(cpu*50%, 50m)`) are evaluated at pod creation, inside the admission
webhook; a typo found there fails every matching pod's creation. Checking them when the
SidecarSet is written moves that failure to the one edit that caused it. As Kruise does, each
expression is evaluated with its variable (`cpu` in a cpu field, `memory` in a memory field) set
to the plain number 1: that catches every syntax error and unknown name, and also refuses an
expression that is negative at 1 (`cpu - 2`), while `cpu * 2m` passes and fails only at pod
creation ("multiplication of two quantities"), exactly as in Kruise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarsets.spec.resourcespolicy import MODES, RegexError, compile_name_regex
from sidecarsets.validation.base import Errors, invalid, obj_field, required, str_field, unsupported
from sidecarsets.values import calculator

MAX_EXPRESSION_LENGTH = 1024
_VARIABLES = ("cpu", "memory")


def expression_problem(text: str, *, variable: str) -> str | None:
    """Why `text` is not a valid expression over `variable` (Kruise's wording), or None."""
    if len(text) > MAX_EXPRESSION_LENGTH:
        return f"invalid expression: longer than {MAX_EXPRESSION_LENGTH} characters"
    try:
        calculator.evaluate(text, {variable: calculator.number(1.0)})
    except calculator.CalcError as e:
        return f"invalid expression: {e}"
    return None


def validate_resources_policy(container: Mapping[str, Any], path: str, errs: Errors, *, native_or_main: bool) -> None:
    """Kruise's resourcesPolicy rules (v1.9).

    `native_or_main` is False for a plain init container, which runs before the app
    containers and so has nothing to size itself from.
    """
    ppath = f"{path}.resourcesPolicy"
    policy = obj_field(container, "resourcesPolicy", ppath, errs)
    if policy is None:
        return
    if not native_or_main:
        detail = "resourcesPolicy is only supported for containers with RestartPolicy Always"
        errs.append(invalid(ppath, policy, detail))
    resources = container.get("resources")
    if isinstance(resources, Mapping) and (resources.get("limits") or resources.get("requests")):
        errs.append(invalid(ppath, policy, "resourcesPolicy and resources cannot be configured together"))
        return
    mode = policy.get("targetContainersMode")
    if mode is None:
        errs.append(required(f"{ppath}.targetContainersMode"))
    elif mode not in MODES:
        errs.append(unsupported(f"{ppath}.targetContainersMode", mode, MODES))
    _regex(policy, f"{ppath}.targetContainersNameRegex", errs)
    _expressions(policy, f"{ppath}.resourcesExpr", errs)


def _regex(policy: Mapping[str, Any], path: str, errs: Errors) -> None:
    regex = str_field(policy, "targetContainersNameRegex", path, errs)
    if regex == "":
        errs.append(required(path, "invalid empty regex"))
    elif regex is not None:
        try:
            compile_name_regex(regex)
        except RegexError as err:
            errs.append(invalid(path, regex, f"invalid regex pattern: {err}"))


def _expressions(policy: Mapping[str, Any], path: str, errs: Errors) -> None:
    expr = obj_field(policy, "resourcesExpr", path, errs)
    parts = {key: obj_field(expr, key, f"{path}.{key}", errs) for key in ("limits", "requests")} if expr else {}
    if not any(part is not None for part in parts.values()):
        errs.append(invalid(path, expr or {}, "at least one of limits or requests must be configured"))
        return
    for key, part in parts.items():
        if part is None:
            continue
        for variable in _VARIABLES:
            fpath = f"{path}.{key}.{variable}"
            text = str_field(part, variable, fpath, errs)
            problem = expression_problem(text, variable=variable) if text else None
            if problem is not None:
                errs.append(invalid(fpath, text, problem))
