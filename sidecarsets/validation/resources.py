"""Validation of a sidecar's resourcesPolicy, including the syntax of its resource expressions.

The expressions (`max(cpu*50%, 50m)`) are evaluated at pod creation, inside the admission
webhook; a typo found there fails every matching pod's creation. Checking the grammar when the
SidecarSet is written moves that failure to the one edit that caused it.

Grammar (Kruise's calculator): numbers with an optional `%` or Quantity suffix, the variable
(`cpu` or `memory`, matching the field), `+ - * /`, parentheses, and `max(...)`/`min(...)`
with one or more comma-separated arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sidecarsets.validation.base import Errors, FieldError, obj_field, str_field

TARGET_MODES = ("sum", "max")
_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:%|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>[-+*/(),]))"
)
_FUNCTIONS = ("max", "min")
MAX_EXPRESSION_LENGTH = 1024


class ExpressionError(ValueError):
    """A resource expression that does not parse; the message says where."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise ExpressionError(f"unexpected character {text[pos:].lstrip()[:1]!r} at offset {pos}")
        kind = m.lastgroup or "op"
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str, variable: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.variable = variable

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] == value:
            self.pos += 1
            return True
        return False

    def parse(self) -> None:
        if not self.tokens:
            raise ExpressionError("empty expression")
        self.expr()
        tok = self.peek()
        if tok is not None:
            raise ExpressionError(f"unexpected {tok[1]!r}")

    def expr(self) -> None:
        self.term()
        while self.take("+") or self.take("-"):
            self.term()

    def term(self) -> None:
        self.factor()
        while self.take("*") or self.take("/"):
            self.factor()

    def factor(self) -> None:
        if self.take("-") or self.take("+"):
            self.factor()
            return
        if self.take("("):
            self.expr()
            if not self.take(")"):
                raise ExpressionError("missing ')'")
            return
        tok = self.peek()
        if tok is None:
            raise ExpressionError("expression ends too early")
        kind, value = tok
        self.pos += 1
        if kind == "num":
            return
        if kind == "name" and value in _FUNCTIONS:
            if not self.take("("):
                raise ExpressionError(f"{value} needs '(' and arguments")
            self.expr()
            while self.take(","):
                self.expr()
            if not self.take(")"):
                raise ExpressionError(f"missing ')' after the arguments of {value}")
            return
        if kind == "name":
            if value != self.variable:
                raise ExpressionError(f"unknown name {value!r}: only {self.variable!r}, max() and min() are allowed")
            return
        raise ExpressionError(f"unexpected {value!r}")


def check_expression(text: str, *, variable: str) -> None:
    """Raise ExpressionError when `text` is not a valid resource expression over `variable`."""
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(f"longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        _Parser(text, variable).parse()
    except RecursionError:
        raise ExpressionError("nested too deeply") from None


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
        errs.append(FieldError(ppath, "resourcesPolicy is only supported for containers with RestartPolicy Always"))
    resources = container.get("resources")
    if isinstance(resources, Mapping) and (resources.get("limits") or resources.get("requests")):
        errs.append(FieldError(ppath, "resourcesPolicy and resources cannot be configured together"))
        return
    mode = policy.get("targetContainersMode")
    if mode not in TARGET_MODES:
        errs.append(
            FieldError(
                f"{ppath}.targetContainersMode",
                f"unsupported targetContainersMode {mode!r}: use {' or '.join(TARGET_MODES)}",
            )
        )
    regex = str_field(policy, "targetContainersNameRegex", f"{ppath}.targetContainersNameRegex", errs)
    if regex == "":
        errs.append(FieldError(f"{ppath}.targetContainersNameRegex", "invalid empty regex"))
    elif regex is not None:
        try:
            re.compile(regex)
        except (re.error, RecursionError, OverflowError) as err:
            errs.append(FieldError(f"{ppath}.targetContainersNameRegex", f"invalid regex pattern: {err}"))
    expr = obj_field(policy, "resourcesExpr", f"{ppath}.resourcesExpr", errs)
    parts = (
        {key: obj_field(expr, key, f"{ppath}.resourcesExpr.{key}", errs) for key in ("limits", "requests")}
        if expr
        else {}
    )
    if not any(part is not None for part in parts.values()):
        errs.append(FieldError(f"{ppath}.resourcesExpr", "at least one of limits or requests must be configured"))
        return
    for key, part in parts.items():
        if part is None:
            continue
        for variable in ("cpu", "memory"):
            fpath = f"{ppath}.resourcesExpr.{key}.{variable}"
            text = str_field(part, variable, fpath, errs)
            if not text:
                continue
            try:
                check_expression(text, variable=variable)
            except ExpressionError as err:
                errs.append(FieldError(fpath, f"invalid expression: {err}"))
