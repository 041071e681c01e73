"""A SidecarSet's updateStrategy and injectionStrategy.revision, read into typed values.

Neither is needed to inject the current spec, so their problems are advisory: recorded on the
model in every mode, never making a SidecarSet unusable for injection. The controller refuses to
roll out under a strategy it cannot read (`SidecarSet.rollout_problem`), and a pin it cannot read
fails the pods it would apply to (`revisions`), each naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import selectors
from sidecarsets.spec.enums import RevisionPolicy, UpdateType
from sidecarsets.spec.reading import Reader
from sidecarsets.values import intorpercent

IntOrPercent = int | str


@dataclass(frozen=True, slots=True)
class UpdateStrategy:
    """`spec.updateStrategy`; values that did not parse read as their defaults (see the problems)."""

    type: UpdateType = UpdateType.ROLLING_UPDATE
    paused: bool = False
    partition: IntOrPercent | None = None
    max_unavailable: IntOrPercent | None = None
    selector: JsonObj | None = None
    priority: JsonObj | None = None
    scatter: tuple[JsonObj, ...] = ()
    # Our extension (sidecarsets.rollout.deadline): seconds an upgraded pod may take to be ready again
    # before the rollout stops itself; None: no deadline.
    progress_deadline_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class RevisionPin:
    """`spec.injectionStrategy.revision`: new pods get a stored revision instead of the current spec."""

    revision_name: str
    custom_version: str
    policy: RevisionPolicy


def read_update_strategy(reader: Reader, value: Any) -> UpdateStrategy:
    field = "spec.updateStrategy"
    raw = reader.object(value, field, advisory=True)
    kind = reader.enum(raw.get("type"), f"{field}.type", UpdateType, UpdateType.ROLLING_UPDATE, advisory=True)
    paused = reader.boolean(raw.get("paused"), f"{field}.paused", advisory=True)
    numbers = {key: _checked(reader, raw, key, intorpercent.parse) for key in ("partition", "maxUnavailable")}
    selector = _checked(reader, raw, "selector", selectors.validate)
    priority = reader.optional_object(raw.get("priorityStrategy"), f"{field}.priorityStrategy", advisory=True)
    scatter = tuple(
        term
        for term in reader.list(raw.get("scatterStrategy"), f"{field}.scatterStrategy", advisory=True)
        if isinstance(term, dict)
    )
    return UpdateStrategy(
        type=kind,
        paused=paused,
        partition=numbers["partition"],
        max_unavailable=numbers["maxUnavailable"],
        selector=selector,
        priority=priority,
        scatter=scatter,
        progress_deadline_seconds=_checked(reader, raw, "progressDeadlineSeconds", _deadline),
    )


def _deadline(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise ValueError(f"must be a whole number of seconds from 1 to 2147483647, got {value!r}")
    return value


def _checked(reader: Reader, raw: JsonObj, key: str, check: Callable[[Any], object]) -> Any:
    """`raw[key]` when `check` accepts it (or it is absent); None, with an advisory problem, when not."""
    value = raw.get(key)
    if value is None:
        return None
    try:
        check(value)
    except ValueError as err:  # IntOrPercentError, SelectorError
        reader.fail(f"spec.updateStrategy.{key}", f"spec.updateStrategy.{key}: {err}", advisory=True)
        return None
    return value


def read_revision_pin(reader: Reader, injection: JsonObj) -> RevisionPin | None:
    """The pin, or None when `revision` is absent or names neither a revision nor a custom version."""
    field = "spec.injectionStrategy.revision"
    revision = reader.optional_object(injection.get("revision"), field, advisory=True)
    if revision is None:
        return None
    values: list[str] = []
    for key in ("revisionName", "customVersion"):
        value = revision.get(key)
        if value is not None and not isinstance(value, str):
            reader.fail(f"{field}.{key}", f"{field}.{key} must be a string, got {value!r}", advisory=True)
            value = None
        values.append(value or "")
    raw_policy = revision.get("policy")
    policy = next((p for p in RevisionPolicy if p.value == raw_policy), None)
    if policy is None and raw_policy not in (None, ""):
        reader.fail(
            f"{field}.policy",
            f"{field}.policy {raw_policy!r} is not supported (use Always or Partial)",
            advisory=True,
        )
    name, version = values
    if not name and not version:
        return None
    return RevisionPin(name, version, policy or RevisionPolicy.ALWAYS)
