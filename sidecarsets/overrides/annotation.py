"""The pod annotation `sidecarctl.io/overrides`, read into typed values or refused with a message.

The annotation is user data that reaches the webhook with every pod: it is bounded (size, number of
containers and env vars), typed (a JSON object keyed by container name, each value holding only
`resources` (`requests`/`limits` of `cpu`/`memory`, quantities) and `env` (`{name, value}` entries,
no `valueFrom`)) and refused whole at the first thing that is not of that shape, with a message
naming the field and the value. Nothing is guessed: a half-read override would give a sidecar
values nobody asked for.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as _derived
from typing import Any

import orjson

from kuberuntime.jsontypes import parse_object
from sidecarsets.spec.names import ANN_OVERRIDES
from sidecarsets.spec.sidecar import OVERRIDABLE_RESOURCES
from sidecarsets.values import quantity
from sidecarsets.values.gofmt import quote

MAX_BYTES = 16 * 1024
MAX_CONTAINERS = 64
MAX_ENV = 128
SECTIONS = ("requests", "limits")
_CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[\x20-\x3c\x3e-\x7e]{1,256}$")  # printable ASCII but '=', as the API server's
_SHOWN = 64  # characters of a bad value a message quotes

# Why an override is refused (the metric's label): the annotation is not of the shape; it asks for
# something no SidecarSet of the pod lists; a value is outside its range; a request would exceed its limit.
INVALID, NOT_ALLOWED, OUT_OF_RANGE, REQUEST_ABOVE_LIMIT = (
    "invalid",
    "not_allowed",
    "out_of_range",
    "request_above_limit",
)
REASONS = (INVALID, NOT_ALLOWED, OUT_OF_RANGE, REQUEST_ABOVE_LIMIT)


class OverrideError(ValueError):
    """A refused override; `reason` is one of REASONS, the message names the annotation and the field."""

    def __init__(self, message: str, reason: str = INVALID) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Value:
    """A quantity as the pod wrote it (`text`, what the sidecar gets) and its value."""

    text: str
    quantity: quantity.Quantity


@dataclass(frozen=True, slots=True)
class ContainerOverride:
    """What a pod asks of one sidecar; each section in the annotation's order."""

    container: str
    requests: tuple[tuple[str, Value], ...] = ()
    limits: tuple[tuple[str, Value], ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def section(self, name: str) -> tuple[tuple[str, Value], ...]:
        return self.requests if name == "requests" else self.limits

    @property
    def has_resources(self) -> bool:
        return bool(self.requests or self.limits)


@dataclass(frozen=True, slots=True)
class PodOverrides:
    containers: tuple[ContainerOverride, ...] = ()
    # Derived once: injection asks for every sidecar of every pod, and records the env of all.
    _by_name: dict[str, ContainerOverride] = _derived(init=False, repr=False, compare=False)
    _env_text: str | None = _derived(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.container: c for c in self.containers})
        record = {c.container: dict(c.env) for c in self.containers if c.env}
        text = orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode() if record else None
        object.__setattr__(self, "_env_text", text)

    def get(self, container: str) -> ContainerOverride | None:
        return self._by_name.get(container)


NONE = PodOverrides()


def field(container: str | None = None, *path: str) -> str:
    """How a message names a part of the annotation: `sidecarctl.io/overrides[proxy].env[LOG_LEVEL]`."""
    out = ANN_OVERRIDES if container is None else f"{ANN_OVERRIDES}[{container}]"
    return out + "".join(p if p.startswith("[") else f".{p}" for p in path)


def shown(value: Any) -> str:
    """A value as a message quotes it: JSON, cut to a few dozen characters."""
    try:
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return quote(text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...")


def _type(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def _invalid(where: str, value: Any, detail: str) -> OverrideError:
    return OverrideError(f"{where}: Invalid value: {shown(value)}: {detail}")


def parse(text: object) -> PodOverrides:
    """The annotation's overrides; OverrideError at the first thing that is not of the shape."""
    if text is None:
        return NONE
    if not isinstance(text, str):
        raise _invalid(field(), text, "must be a string holding a JSON object")
    if len(text) > MAX_BYTES:
        raise OverrideError(f"{field()}: Too long: {len(text)} bytes, at most {MAX_BYTES}")
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise _invalid(field(), text, f"not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise _invalid(field(), text, f"must be a JSON object keyed by container name, not {_type(raw)}")
    if len(raw) > MAX_CONTAINERS:
        raise OverrideError(f"{field()}: Too many: {len(raw)} containers, at most {MAX_CONTAINERS}")
    return PodOverrides(tuple(_container(name, value) for name, value in raw.items()))


def parsed(text: str | None) -> PodOverrides | OverrideError:
    """`parse`, remembered for short texts (the usual ones): the replicas of a workload carry one
    text, and the controller reads every pod's on every pass. A refusal is returned, not raised."""
    if text is None:
        return NONE
    return _remembered(text) if len(text) <= _REMEMBERED_BYTES else _parse_or_error(text)


def parse_error(value: object) -> OverrideError:
    """The refusal of an annotation value that is not text (a pod's annotations are strings; a CLI
    manifest's YAML may hold anything)."""
    try:
        parse(value)
    except OverrideError as e:
        return e
    raise AssertionError("only text is an annotation")  # parse refuses every non-string


def _parse_or_error(text: str) -> PodOverrides | OverrideError:
    try:
        return parse(text)
    except OverrideError as e:
        return e


_REMEMBERED_BYTES = 1024
_remembered = functools.lru_cache(maxsize=4096)(_parse_or_error)  # at most 4 MiB of texts


def _container(name: str, value: Any) -> ContainerOverride:
    if not _CONTAINER_NAME.match(name):
        raise _invalid(field(), name, "a key must be a container name (a DNS-1123 label)")
    if not isinstance(value, dict):
        raise _invalid(field(name), value, f"must be an object with resources and env, not {_type(value)}")
    unknown = sorted(set(value) - {"resources", "env"})
    if unknown:
        raise OverrideError(f"{field(name, unknown[0])}: Forbidden: only resources and env may be overridden")
    resources = value.get("resources", {})
    if not isinstance(resources, dict):
        raise _invalid(field(name, "resources"), resources, f"must be an object, not {_type(resources)}")
    unknown = sorted(set(resources) - set(SECTIONS))
    if unknown:
        where = field(name, "resources", unknown[0])
        raise OverrideError(f"{where}: Forbidden: only requests and limits may be overridden")
    requests, limits = (_section(name, key, resources.get(key, {})) for key in SECTIONS)
    return ContainerOverride(name, requests, limits, _env(name, value.get("env", [])))


def _section(container: str, key: str, values: Any) -> tuple[tuple[str, Value], ...]:
    where = field(container, "resources", key)
    if not isinstance(values, dict):
        raise _invalid(where, values, f"must be an object, not {_type(values)}")
    out: list[tuple[str, Value]] = []
    for resource, raw in values.items():
        if resource not in OVERRIDABLE_RESOURCES:
            raise OverrideError(f"{where}.{resource}: Forbidden: only cpu and memory may be overridden")
        try:
            text = quantity.json_text(raw)
            value = quantity.parse(text)
        except quantity.QuantityError as e:
            raise _invalid(f"{where}.{resource}", raw, f"not a quantity ({e})") from None
        if value.sign() < 0:
            raise _invalid(f"{where}.{resource}", raw, "must not be negative")
        out.append((resource, Value(text, value)))
    return tuple(out)


def _env(container: str, items: Any) -> tuple[tuple[str, str], ...]:
    where = field(container, "env")
    if not isinstance(items, list):
        raise _invalid(where, items, f"must be a list of {{name, value}}, not {_type(items)}")
    if len(items) > MAX_ENV:
        raise OverrideError(f"{where}: Too many: {len(items)} entries, at most {MAX_ENV}")
    out: dict[str, str] = {}
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise _invalid(at, item, f"must be an object with name and value, not {_type(item)}")
        if "valueFrom" in item:
            raise OverrideError(f"{at}.valueFrom: Forbidden: only a value may be set, not valueFrom")
        unknown = sorted(set(item) - {"name", "value"})
        if unknown:
            raise OverrideError(f"{at}.{unknown[0]}: Forbidden: an entry holds only name and value")
        name, value = item.get("name"), item.get("value")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise _invalid(f"{at}.name", name, "must be an env var name (printable ASCII but '=')")
        if not isinstance(value, str):
            raise _invalid(f"{at}.value", value, f"must be a string, not {_type(value)}")
        if name in out:
            raise OverrideError(f"{at}.name: Duplicate value: {shown(name)}")
        out[name] = value
    return tuple(out.items())


# ---------------------------------------------------------------------------------------------
# What injection applied of the env overrides (names.ANN_OVERRIDES_ENV_APPLIED): a running
# container cannot take a changed env var, so the controller compares the pod's annotation with it.


def env_record(overrides: PodOverrides, applied: Iterable[str]) -> str | None:
    """The record of the env overrides of the `applied` containers, or None when there are none."""
    chosen = set(applied)
    with_env = [c for c in overrides.containers if c.env]
    if all(c.container in chosen for c in with_env):
        return overrides._env_text  # the usual case: every override applied
    record = {c.container: dict(c.env) for c in with_env if c.container in chosen}
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode() if record else None


def read_env_record(text: object) -> dict[str, dict[str, str]]:
    """The record as injection wrote it ({} when absent or not of its shape)."""
    out: dict[str, dict[str, str]] = {}
    for container, env in parse_object(text).items():
        if isinstance(container, str) and isinstance(env, Mapping):
            out[container] = {str(k): v for k, v in env.items() if isinstance(v, str)}
    return out
