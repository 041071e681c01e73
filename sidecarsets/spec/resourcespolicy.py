"""A sidecar's resourcesPolicy (Kruise 1.9), read once: resources derived from the pod's containers.

`targetContainersMode` (sum or max) aggregates the limits and requests of the pod's containers
whose names match `targetContainersNameRegex`; `resourcesExpr` computes the sidecar's cpu and
memory from the aggregate (sidecarsets.values.calculator). The injection engine applies it
(injector.engine.resources); validation checks it (sidecarsets.validation.resources).

The name regex is Kruise's Go RE2 pattern, run here by Python's `re`. The two agree on the
patterns container names are matched with; the Perl constructs RE2 refuses (lookarounds,
backreferences) are refused here too, with RE2's wording, so that a SidecarSet Kruise would
reject is not accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as _derived
from typing import Any

from sidecarsets.spec.reading import Reader

MODES = ("sum", "max")
DEFAULT_NAME_REGEX = ".*"
MAX_REGEX_LENGTH = 1024
_PERL_ONLY = re.compile(r"\(\?(?:=|!|<=|<!|>|P=)|\\[1-9]")


class RegexError(ValueError):
    """A name regex that does not compile; the message follows Go's regexp where it can."""


def compile_name_regex(pattern: str) -> re.Pattern[str]:
    if len(pattern) > MAX_REGEX_LENGTH:
        raise RegexError(f"error parsing regexp: expression too large: more than {MAX_REGEX_LENGTH} characters")
    perl = _PERL_ONLY.search(pattern)
    if perl is not None:
        what = perl.group(0)
        if what.startswith("\\"):
            raise RegexError(f"error parsing regexp: invalid escape sequence: `{what}`")
        raise RegexError(f"error parsing regexp: invalid or unsupported Perl syntax: `{what}`")
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as err:
        raise RegexError(f"error parsing regexp: {err}: `{pattern}`") from None


@dataclass(frozen=True, slots=True)
class ResourcesPolicy:
    """`limits` and `requests` are (cpu, memory) expressions, "" where unset; None when the
    section itself is absent (an absent `limits` leaves the sidecar without limits)."""

    mode: str
    name_regex: str
    limits: tuple[str, str] | None
    requests: tuple[str, str] | None
    pattern: re.Pattern[str] | None = _derived(init=False, repr=False, compare=False)
    regex_error: str | None = _derived(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            pattern, error = compile_name_regex(self.name_regex), None
        except RegexError as e:
            pattern, error = None, str(e)
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "regex_error", error)


def read_resources_policy(reader: Reader, value: Any, where: str) -> ResourcesPolicy | None:
    """The policy at `where` (a container's `resourcesPolicy`), or None when it has none."""
    policy = reader.optional_object(value, where)
    if policy is None:
        return None
    mode = policy.get("targetContainersMode")
    if mode not in MODES:
        reader.fail(f"{where}.targetContainersMode", f"{where}.targetContainersMode must be sum or max, not {mode!r}")
    regex = reader.string(policy.get("targetContainersNameRegex"), f"{where}.targetContainersNameRegex")
    expr = reader.object(policy.get("resourcesExpr"), f"{where}.resourcesExpr")
    return ResourcesPolicy(
        mode=mode if isinstance(mode, str) else "",
        name_regex=DEFAULT_NAME_REGEX if regex is None else regex,
        limits=_pair(reader, expr.get("limits"), f"{where}.resourcesExpr.limits"),
        requests=_pair(reader, expr.get("requests"), f"{where}.resourcesExpr.requests"),
    )


def _pair(reader: Reader, value: Any, where: str) -> tuple[str, str] | None:
    section = reader.optional_object(value, where)
    if section is None:
        return None
    cpu = reader.string(section.get("cpu"), f"{where}.cpu")
    memory = reader.string(section.get("memory"), f"{where}.memory")
    return cpu or "", memory or ""
