"""An override checked against its SidecarSet's bounds and merged into a sidecar, field by field.

Checked like a LimitRange: every value the pod names must lie in the range its SidecarSet gives that
resource, every env name must be one the SidecarSet lists, and after merging no request may exceed
its limit. A refusal names the annotation, the SidecarSet, the container, the field, the value and
what is allowed; nothing is clamped. Merged field by field: the sidecar keeps the SidecarSet's value
(or the one its resourcesPolicy computed) of every field the pod does not name, so overriding the
CPU request keeps the CPU limit, the memory values and every other env var.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kuberuntime.jsontypes import JsonObj, mapping
from sidecarsets.overrides.annotation import (
    NOT_ALLOWED,
    OUT_OF_RANGE,
    REQUEST_ABOVE_LIMIT,
    ContainerOverride,
    OverrideError,
    field,
    parsed,
    shown,
)
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.sidecar import OverrideBounds
from sidecarsets.values import quantity

APPLIED, REFUSED, IGNORED = "applied", "refused", "ignored"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one container's override in one pod: applied (what), refused or ignored (why)."""

    container: str
    verdict: str  # APPLIED, REFUSED or IGNORED
    detail: str = ""  # why refused or ignored
    reason: str = ""  # a refusal's reason (annotation.REASONS)
    override: ContainerOverride | None = None  # applied: what, said only when asked (check-inject)
    sidecarset: str = ""  # who allowed it: "SidecarSet mesh", "NamespacedSidecarSet shop/logs"

    @property
    def message(self) -> str:
        if self.verdict != APPLIED or self.override is None:
            return self.detail
        o = self.override
        fields = [f"resources.{s}.{r}={v.text}" for s in ("requests", "limits") for r, v in o.section(s)]
        fields += [f"env {name}={shown(value)}" for name, value in o.env]
        what = ", ".join(fields) or "nothing (an empty override)"
        return f"{what} (allowed by {self.sidecarset})"


def applied(ss: SidecarSet, override: ContainerOverride) -> Outcome:
    return Outcome(override.container, APPLIED, override=override, sidecarset=f"{ss.kind} {ss.name}")


def ignored(override: ContainerOverride) -> Outcome:
    message = (
        f"{field(override.container)}: no SidecarSet injects a container {override.container} into this pod; "
        "its override is ignored"
    )
    return Outcome(override.container, IGNORED, message)


def bounds_of(ss: SidecarSet, container: str) -> OverrideBounds | None:
    return next((b for b in ss.overrides if b.container == container), None)


def allowed_text(bounds: OverrideBounds | None) -> str:
    """Everything a pod may override of a sidecar, as a refusal lists it."""
    if bounds is None:
        return "nothing"
    parts = [f"{r.resource} {r.text()}" for r in bounds.resources]
    if bounds.env:
        parts.append("env " + ", ".join(bounds.env))
    return "; ".join(parts) or "nothing"


def check(ss: SidecarSet, override: ContainerOverride) -> None:
    """OverrideError when `override` asks `ss` for more than its `spec.overrides` allows."""
    refused = _refusal(f"{ss.kind} {ss.name}", bounds_of(ss, override.container), override)
    if refused is not None:
        raise OverrideError(*refused)


@functools.lru_cache(maxsize=1024)
def _refusal(owner: str, bounds: OverrideBounds | None, override: ContainerOverride) -> tuple[str, str] | None:
    """(message, reason) of `check`, remembered: the replicas of a workload ask the same of one
    SidecarSet's bounds (both immutable values) for every pod."""
    name = override.container
    whose = f"{owner} allows"
    if bounds is None and (override.has_resources or override.env):
        return f"{field(name)}: Forbidden: {whose} no override of container {name} (allowed: nothing)", NOT_ALLOWED
    for section in ("requests", "limits"):
        for resource, value in override.section(section):
            where = field(name, "resources", section, resource)
            bound = bounds.range_of(resource) if bounds is not None else None
            if bound is None:
                detail = f"{shown(value.text)}: {whose} no {resource} override of container {name}"
                return f"{where}: Forbidden: {detail} (allowed: {allowed_text(bounds)})", NOT_ALLOWED
            side = (
                "below the minimum"
                if bound.min is not None and value.quantity.cmp(bound.min) < 0
                else "above the maximum"
                if bound.max is not None and value.quantity.cmp(bound.max) > 0
                else None
            )
            if side is not None:
                detail = f"{shown(value.text)} is {side} {whose} for container {name} (allowed: {bound.text()})"
                return f"{where}: Forbidden: {detail}", OUT_OF_RANGE
    for env_name, env_value in override.env:
        if bounds is None or env_name not in bounds.env:
            where = field(name, "env", f"[{env_name}]")
            detail = f"{shown(env_value)}: {whose} no override of env {env_name} in container {name}"
            return f"{where}: Forbidden: {detail} (allowed: {allowed_text(bounds)})", NOT_ALLOWED
    return None


def merged_resources(resources: Mapping[str, Any], override: ContainerOverride | None) -> JsonObj:
    """`resources` (the SidecarSet's, or computed) with the fields the override names replaced."""
    out: JsonObj = {k: v for k, v in resources.items() if k not in ("requests", "limits")}
    for section in ("requests", "limits"):
        values = dict(mapping(resources, section))
        if override is not None:
            values.update((resource, value.text) for resource, value in override.section(section))
        if values:
            out[section] = values
    return out


def _value(raw: Any) -> quantity.Quantity | None:
    try:
        return _parsed(quantity.json_text(raw))
    except quantity.QuantityError:
        return None


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> quantity.Quantity | None:
    """A quantity of a SidecarSet or an override (few distinct texts, read for every pod), or None."""
    try:
        return quantity.parse(text)
    except quantity.QuantityError:
        return None


def check_request_limits(ss: SidecarSet, override: ContainerOverride, resources: Mapping[str, Any]) -> None:
    """OverrideError when, after merging, a request the pod names exceeds its limit or a limit the pod
    names is below its request (the API server would refuse the pod with a less helpful message)."""
    requests, limits = mapping(resources, "requests"), mapping(resources, "limits")
    named = {(s, r) for s in ("requests", "limits") for r, _ in override.section(s)}
    for resource in sorted({r for _, r in named}):
        request, limit = _value(requests.get(resource)), _value(limits.get(resource))
        if request is None or limit is None or request.cmp(limit) <= 0:
            continue
        section = "requests" if ("requests", resource) in named else "limits"
        other = "limits" if section == "requests" else "requests"
        origin = "the pod's" if (other, resource) in named else f"{ss.kind} {ss.name}'s"
        req, lim = shown(str(requests.get(resource))), shown(str(limits.get(resource)))
        detail = (
            f"{req} is above the {resource} limit {lim}"
            if section == "requests"
            else f"{lim} is below the {resource} request {req}"
        )
        where = field(override.container, "resources", section, resource)
        message = f"{where}: Forbidden: {detail} after merging with {origin} {other}"
        message += " (a request may not exceed its limit)"
        raise OverrideError(message, REQUEST_ABOVE_LIMIT)


def merged_env(env: Iterable[Any], override: ContainerOverride | None) -> list[Any]:
    """The env list with each var the override names set to its value (in place; appended when new)."""
    if override is None or not override.env:
        return list(env)
    wanted = dict(override.env)
    out: list[Any] = []
    for entry in env:
        name = entry.get("name") if type(entry) is dict or isinstance(entry, Mapping) else None
        if name in wanted:
            out.append({"name": name, "value": wanted.pop(name)})
        else:
            out.append(entry)
    out += [{"name": name, "value": value} for name, value in wanted.items()]
    return out


def apply(
    container: JsonObj, ss: SidecarSet, override: ContainerOverride, *, own: Mapping[str, Any] | None = None
) -> None:
    """Check `override` and merge it into `container` (the sidecar as it enters the pod, owned by the
    caller); OverrideError, with `container` untouched, when it is refused.

    `own`: the SidecarSet's own `resources` of this sidecar, when they are the container's (no
    resourcesPolicy computed them): the judgement is then remembered for that object and this
    override (the replicas of a workload all ask the same of one SidecarSet)."""
    bounds = bounds_of(ss, override.container)
    if own is None:
        judged = _judged(ss, override, mapping(container, "resources"))
    else:
        key = (id(own), id(override), id(bounds))
        hit = _JUDGED.get(key)
        if hit is None or hit[0] is not own or hit[1] is not override or hit[2] is not bounds:
            if len(_JUDGED) >= 1024:
                _JUDGED.clear()
            hit = _JUDGED[key] = (own, override, bounds, _judged(ss, override, own))
        judged = hit[3]
    if isinstance(judged, tuple):
        raise OverrideError(*judged)
    if override.has_resources:
        container["resources"] = {k: dict(v) if isinstance(v, dict) else v for k, v in judged.items()}
    if override.env:
        container["env"] = merged_env(container.get("env") or [], override)


# (resources, override, bounds, judged) by their ids; the objects are kept, so an id is never reused
_JUDGED: dict[tuple[int, int, int], tuple[object, object, object, JsonObj | tuple[str, str]]] = {}


def _judged(ss: SidecarSet, override: ContainerOverride, resources: Mapping[str, Any]) -> JsonObj | tuple[str, str]:
    """The merged `resources`, or a refusal's (message, reason)."""
    try:
        check(ss, override)
        merged = merged_resources(resources, override)
        check_request_limits(ss, override, merged)
    except OverrideError as e:
        return str(e), e.reason
    return merged


def outside(ss: SidecarSet, text: str | None) -> str | None:
    """Why a pod whose annotation is `text` asks `ss` for more than its bounds allow now (None: it
    does not, or asks nothing of `ss`): a running pod's overrides after the bounds changed."""
    if text is None:
        return None
    found = parsed(text)
    if isinstance(found, OverrideError):
        return str(found)
    for sc in (*ss.containers, *ss.init_containers):
        override = found.get(sc.name)
        if override is None:
            continue
        try:
            check(ss, override)
        except OverrideError as e:
            return str(e)
    return None


def tightened(old: SidecarSet, new: SidecarSet) -> bool:
    """Whether `new` allows less than `old` somewhere: an entry, a resource or an env name dropped, a
    minimum raised or a maximum lowered. Only then can running pods fall outside the bounds."""
    for before in old.overrides:
        after = bounds_of(new, before.container)
        if after is None or set(before.env) - set(after.env):
            return True
        for was in before.resources:
            now = after.range_of(was.resource)
            if now is None or _narrower(was.min, now.min, -1) or _narrower(was.max, now.max, 1):
                return True
    return False


def _narrower(was: quantity.Quantity | None, now: quantity.Quantity | None, side: int) -> bool:
    """A bound that now excludes values it allowed (side -1: a minimum, 1: a maximum)."""
    if now is None:
        return False
    return was is None or now.cmp(was) == -side
