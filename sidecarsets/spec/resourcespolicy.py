"""A sidecar's resourcesPolicy (Kruise 1.9), read once: resources derived from the pod's containers.

`targetContainersMode` (sum or max) aggregates the limits and requests of the pod's containers
whose names match `targetContainersNameRegex`; `resourcesExpr` computes the sidecar's cpu and
memory from the aggregate (sidecarsets.values.calculator). The injection engine applies it
(`computed_resources`, below); validation checks it (sidecarsets.validation.resources).

The name regex is Kruise's Go RE2 pattern, run here by Python's `re`. The two agree on the
patterns container names are matched with; the Perl constructs RE2 refuses (lookarounds,
backreferences) are refused here too, with RE2's wording, so that a SidecarSet Kruise would
reject is not accepted.

Computing it, at injection and again when a running pod's sidecars are resized in place
(sidecarsets.rollout.resize), follows Kruise's rules (pkg/webhook/pod/mutating/sidecarset_resources.go),
on the pod as submitted:

* targets: the native-sidecar init containers (`restartPolicy: Always`), then the containers,
  whose names the regex finds (unanchored), minus every name a SidecarSet being injected into
  the pod defines; plain init containers never count;
* `sum`: a limit is the sum over the targets only if every target sets it (one unbounded target
  makes the sum unbounded); requests add up with a missing one as 0, and a zero total counts as
  absent; `max`: the largest value, a limit again only if every target sets it;
* a limit expression runs only when its aggregate exists (even a constant such as `200Mi` is
  skipped otherwise); a request expression always runs, an absent aggregate reading as 0;
* the expression binds `memory` when it mentions the word `memory`, else `cpu`; a plain-number
  result is milli-units for `cpu` and whole units for `memory`;
* the sidecar's resources are replaced by exactly the computed keys.

Any failure refuses the pod with Kruise's message: a pod injected without the resources its
SidecarSet asked for could be starved, or evicted, with nothing saying why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as _derived
from typing import Any

from kuberuntime.jsontypes import JsonObj, resolve
from sidecarsets.spec.reading import Reader
from sidecarsets.values import calculator, quantity
from sidecarsets.values.gofmt import float_to_int64, quote
from sidecarsets.values.quantity import Quantity, QuantityError

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


# ---------------------------------------------------------------------------------------------
# Computing a policy for a pod

RESOURCES = ("cpu", "memory")
_MEMORY_WORD = re.compile(r"\bmemory\b", re.ASCII)


class ResourcesPolicyError(ValueError):
    """The policy cannot be applied to this pod; the message is Kruise's (or names the pod's field)."""


_Target = tuple[str, Mapping[str, Any]]  # (field path, container)


def computed_resources(policy: ResourcesPolicy, pod_spec: Mapping[str, Any], excluded: frozenset[str]) -> JsonObj:
    """The sidecar's `resources` under `policy` for a pod with `pod_spec`.

    `excluded` holds the container names of the SidecarSets being injected into the pod.
    """
    targets = _targets(policy, pod_spec, excluded)
    limits, requests = _aggregate(targets, policy.mode)
    out: JsonObj = {}
    if policy.limits is not None:
        computed = {
            resource: _evaluate(expr, limits[resource], resource, "limits")
            for resource, expr in zip(RESOURCES, policy.limits, strict=True)
            if expr and resource in limits
        }
        if computed:
            out["limits"] = computed
    if policy.requests is not None:
        computed = {
            resource: _evaluate(expr, requests.get(resource, Quantity()), resource, "requests")
            for resource, expr in zip(RESOURCES, policy.requests, strict=True)
            if expr
        }
        if computed:
            out["requests"] = computed
    return out


def _targets(policy: ResourcesPolicy, pod_spec: Mapping[str, Any], excluded: frozenset[str]) -> list[_Target]:
    if policy.pattern is None:
        raise ResourcesPolicyError(
            f"failed to get target containers: invalid regex pattern {quote(policy.name_regex)}: {policy.regex_error}"
        )
    found: list[_Target] = []
    for key in ("initContainers", "containers"):
        items = pod_spec.get(key)
        for i, container in enumerate(items if isinstance(items, list) else ()):
            if not isinstance(container, Mapping):
                continue
            name = container.get("name")
            if not isinstance(name, str) or name in excluded:
                continue
            if key == "initContainers" and container.get("restartPolicy") != "Always":
                continue
            if policy.pattern.search(name):
                found.append((f"spec.{key}[{i}]", container))
    if not found:
        raise ResourcesPolicyError(f"no containers match the regex pattern {quote(policy.name_regex)}")
    return found


def _quantities(path: str, container: Mapping[str, Any], section: str) -> dict[str, Quantity]:
    values = resolve(container, "resources", section)
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ResourcesPolicyError(f"{path}.resources.{section} must be an object")
    out: dict[str, Quantity] = {}
    for resource in RESOURCES:
        raw = values.get(resource)
        if raw is None:
            continue
        try:
            out[resource] = quantity.parse(quantity.json_text(raw))
        except QuantityError as e:
            where = f"{path}.resources.{section}[{resource}]"
            raise ResourcesPolicyError(f"{where}: Invalid value: {quote(str(raw))}: {e}") from None
    return out


def _aggregate(targets: Sequence[_Target], mode: str) -> tuple[dict[str, Quantity], dict[str, Quantity]]:
    """(limits, requests) over the targets; a key is absent where the aggregate does not exist."""
    parsed = [(_quantities(p, c, "limits"), _quantities(p, c, "requests")) for p, c in targets]
    limits: dict[str, Quantity] = {}
    requests: dict[str, Quantity] = {}
    if mode not in ("sum", "max"):
        return limits, requests
    for resource in RESOURCES:
        own_limits = [lim[resource] for lim, _ in parsed if resource in lim]
        own_requests = [req[resource] for _, req in parsed if resource in req]
        if mode == "sum":
            total = _sum(own_requests)
            if not total.is_zero():
                requests[resource] = total
            if len(own_limits) == len(parsed):
                limits[resource] = _sum(own_limits)
        else:
            if own_requests:
                requests[resource] = _largest(own_requests)
            if own_limits and len(own_limits) == len(parsed):
                limits[resource] = _largest(own_limits)
    return limits, requests


def _sum(values: Sequence[Quantity]) -> Quantity:
    total = quantity.new_quantity(0, quantity.DECIMAL_SI)
    for value in values:
        total = total.add(value)
    return total


def _largest(values: Sequence[Quantity]) -> Quantity:
    best = values[0]
    for value in values[1:]:
        if value.cmp(best) > 0:
            best = value
    return best


def _evaluate(expr: str, aggregate: Quantity, resource: str, section: str) -> str:
    name = "memory" if _MEMORY_WORD.search(expr) else "cpu"
    try:
        result = calculator.evaluate(expr, {name: calculator.of(aggregate)})
    except calculator.CalcError as e:
        what = "CPU" if resource == "cpu" else "memory"
        raise ResourcesPolicyError(
            f"failed to evaluate {what} {section} expression: failed to parse expression {quote(expr)}: {e}"
        ) from None
    if result.quantity is not None:
        return str(result.quantity)
    if name == "cpu":
        return str(quantity.new_milli_quantity(float_to_int64(result.number * 1000), quantity.DECIMAL_SI))
    return str(quantity.new_quantity(float_to_int64(result.number), quantity.DECIMAL_SI))
