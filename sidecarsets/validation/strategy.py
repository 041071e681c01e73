"""Validation of how a SidecarSet rolls out: updateStrategy and injectionStrategy.

These fields steer the controller and the revision choice at injection; a value they cannot
interpret would stall a rollout or fail pod creation later, far from the edit that caused it,
so they are checked when the SidecarSet is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarsets.spec.enums import RevisionPolicy, UpdateType, values
from sidecarsets.validation.base import (
    Errors,
    FieldError,
    bool_field,
    invalid,
    is_int,
    list_field,
    obj_field,
    objects,
    str_field,
    type_name,
    validate_selector,
)
from sidecarsets.values import intorpercent

WEIGHT_MIN, WEIGHT_MAX = 1, 100


def _partition_is_set(partition: Any) -> bool:
    """Kruise's intStrIsSet: any string, or an integer other than 0."""
    return isinstance(partition, str) or (is_int(partition) and partition != 0)


def _int_or_percent(strategy: Mapping[str, Any], key: str, path: str, errs: Errors) -> None:
    if key not in strategy or strategy[key] is None:
        return
    try:
        intorpercent.parse(strategy[key])
    except intorpercent.IntOrPercentError as err:
        errs.append(FieldError(f"{path}.{key}", str(err)))


def _priority(priority: Mapping[str, Any], path: str, errs: Errors) -> None:
    weights = list_field(priority, "weightPriority", f"{path}.weightPriority", errs)
    orders = list_field(priority, "orderPriority", f"{path}.orderPriority", errs)
    if weights and orders:
        errs.append(FieldError(path, "only one of weightPriority and orderPriority can be used"))
    for _, term_path, term in objects(weights, f"{path}.weightPriority", errs):
        weight = term.get("weight")
        if not is_int(weight) or not WEIGHT_MIN <= weight <= WEIGHT_MAX:
            errs.append(
                FieldError(
                    f"{term_path}.weight",
                    f"weight must be valid number in the range {WEIGHT_MIN}-{WEIGHT_MAX}, not {weight!r}",
                )
            )
        selector = term.get("matchSelector")
        if selector is None:
            errs.append(FieldError(f"{term_path}.matchSelector", "selector can not be empty"))
        else:
            validate_selector(selector, f"{term_path}.matchSelector", errs, required=True)
    for _, term_path, term in objects(orders, f"{path}.orderPriority", errs):
        key = term.get("orderedKey")
        if not isinstance(key, str) or not key:
            errs.append(FieldError(f"{term_path}.orderedKey", "order key can not be empty"))


def _scatter(terms: list[Any], path: str, errs: Errors) -> None:
    seen: set[tuple[str, str]] = set()
    for _, term_path, term in objects(terms, path, errs):
        key, value = term.get("key"), term.get("value")
        if not isinstance(key, str) or not key:
            errs.append(FieldError(f"{term_path}.key", "key should not be empty"))
            continue
        if not isinstance(value, str):
            errs.append(FieldError(f"{term_path}.value", f"must be a string, not {type_name(value)}"))
            continue
        if (key, value) in seen:
            errs.append(FieldError(term_path, f"duplicated key={key} value={value}"))
        seen.add((key, value))


def validate_update_strategy(spec: Mapping[str, Any], errs: Errors) -> None:
    """Kruise's RollingUpdate rules.

    Kruise checks values only under RollingUpdate; we check them under NotUpdate too, because
    they are still read (an injection revision policy of Partial reads the partition and the
    selector) and a value that is wrong today blocks switching to RollingUpdate tomorrow. Only
    "partition together with selector" stays RollingUpdate-only: under NotUpdate that pair
    legitimately steers Partial injection.
    """
    path = "spec.updateStrategy"
    strategy = obj_field(spec, "updateStrategy", path, errs)
    if strategy is None:
        return
    kind = strategy.get("type")
    if kind not in values(UpdateType):
        errs.append(
            FieldError(
                f"{path}.type", f"unsupported update strategy type {kind!r}: use {' or '.join(values(UpdateType))}"
            )
        )
    bool_field(strategy, "paused", f"{path}.paused", errs)
    _int_or_percent(strategy, "partition", path, errs)
    _int_or_percent(strategy, "maxUnavailable", path, errs)
    rolling = kind == UpdateType.ROLLING_UPDATE
    selector = strategy.get("selector")
    if rolling and selector is not None and _partition_is_set(strategy.get("partition")):
        errs.append(FieldError(f"{path}.partition", "Partition and Selector cannot be used together"))
    validate_selector(selector, f"{path}.selector", errs, required=False)
    priority = obj_field(strategy, "priorityStrategy", f"{path}.priorityStrategy", errs)
    if priority is not None:
        _priority(priority, f"{path}.priorityStrategy", errs)
    _scatter(list_field(strategy, "scatterStrategy", f"{path}.scatterStrategy", errs), f"{path}.scatterStrategy", errs)
    deadline = strategy.get("progressDeadlineSeconds")
    if deadline is not None and (not is_int(deadline) or not 1 <= deadline <= 2**31 - 1):
        errs.append(
            invalid(
                f"{path}.progressDeadlineSeconds", deadline, "must be a whole number of seconds from 1 to 2147483647"
            )
        )


def validate_injection_strategy(spec: Mapping[str, Any], errs: Errors) -> None:
    """Revision pinning must name a revision and a known policy.

    Whether the named ControllerRevision exists is checked by the caller that can reach the
    cluster; this module stays pure.
    """
    path = "spec.injectionStrategy"
    injection = obj_field(spec, "injectionStrategy", path, errs)
    if injection is None:
        return
    bool_field(injection, "paused", f"{path}.paused", errs)
    revision = obj_field(injection, "revision", f"{path}.revision", errs)
    if revision is None:
        return
    rpath = f"{path}.revision"
    str_field(revision, "revisionName", f"{rpath}.revisionName", errs)
    str_field(revision, "customVersion", f"{rpath}.customVersion", errs)
    if revision.get("revisionName") in (None, "") and revision.get("customVersion") in (None, ""):
        errs.append(FieldError(rpath, "revisionName and customVersion cannot be empty simultaneously"))
    policy = revision.get("policy")
    if policy not in values(RevisionPolicy):
        errs.append(
            FieldError(
                f"{rpath}.policy", f"Invalid policy {policy!r}, supported: [{', '.join(values(RevisionPolicy))}]"
            )
        )
