"""SidecarSet validation: everything Kruise's validating webhook checks that a pure function can.

One entry point serves the `/validate-sidecarset` webhook and the CLI. It returns every
problem at once (a user fixing a manifest should not need one round trip per mistake), names
the field of each, and never raises, whatever JSON it is given: a malformed object is itself
just a list of FieldErrors.

What it does not do: look up ControllerRevisions named by `injectionStrategy.revision` (the
caller with cluster access does that), or gate patchPodMetadata keys with a whitelist.

Both versions are validated as they are written (error paths name the fields of the object's own
version); the fields where they differ are the `validation.versions` rules.

The rules live in one module per part of the spec. It imports `sidecarsets.spec` and
`sidecarsets.values` only: validation needs no pods, rollout or controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec.defaults import apply_defaults
from sidecarsets.spec.model import SidecarSet, namespace_of
from sidecarsets.validation import tenancy
from sidecarsets.validation.base import Errors, FieldError, obj_field, type_name, validate_selector
from sidecarsets.validation.canary import validate_canary
from sidecarsets.validation.conflicts import validate_conflicts
from sidecarsets.validation.containers import validate_containers
from sidecarsets.validation.metadata import validate_name, validate_patch_pod_metadata
from sidecarsets.validation.overrides import validate_overrides
from sidecarsets.validation.strategy import validate_injection_strategy, validate_update_strategy
from sidecarsets.validation.update import validate_update
from sidecarsets.validation.versions import validate_version_fields
from sidecarsets.validation.volumes import validate_pull_secrets, validate_revision_history_limit, validate_volumes

__all__ = ["MAX_SIDECARS", "MAX_SIDECARSET_BYTES", "FieldError", "validate_sidecarset"]

# etcd stores objects up to 1.5 MiB: a larger SidecarSet can never be written.
MAX_SIDECARSET_BYTES = 1536 * 1024
# Validation works per sidecar (and per pair with other SidecarSets); a pod of more is not a pod.
MAX_SIDECARS = 256


def _spec(obj: Mapping[str, Any], spec: Mapping[str, Any], errs: Errors) -> None:
    validate_selector(spec.get("selector"), "spec.selector", errs, required=True)
    validate_version_fields(obj, spec, errs)
    validate_injection_strategy(spec, errs)
    validate_update_strategy(spec, errs)
    volumes = validate_volumes(spec, errs)
    validate_containers(spec, errs, volumes=volumes)
    validate_pull_secrets(spec, errs)
    validate_revision_history_limit(spec, errs)
    validate_patch_pod_metadata(spec, errs)
    validate_overrides(spec, errs)


def _too_many_sidecars(obj: Mapping[str, Any]) -> FieldError | None:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    count = sum(len(spec[k]) for k in ("containers", "initContainers") if isinstance(spec.get(k), list))
    if count <= MAX_SIDECARS:
        return None
    return FieldError("spec.containers", f"{count} sidecars is more than the {MAX_SIDECARS} a SidecarSet may define")


def validate_sidecarset(
    obj: JsonObj,
    *,
    old: JsonObj | None = None,
    others: Iterable[JsonObj] = (),
    models: Mapping[str, SidecarSet] | None = None,
) -> list[FieldError]:
    """Every problem with the SidecarSet `obj` (defaults applied first).

    `old` is the stored object on update; `others` are the other SidecarSets in the cluster
    (the one named like `obj` is skipped), checked for container, volume and annotation
    conflicts. An empty list means valid.
    """
    raw: Any = obj  # callers pass whatever JSON they received
    if not isinstance(raw, dict):
        return [FieldError("SidecarSet", f"must be a JSON object, not {type_name(raw)}")]
    too_many = _too_many_sidecars(raw)
    if too_many is not None:
        return [too_many]  # checked first: everything else is work per sidecar
    errs: Errors = []
    current = apply_defaults(raw)
    others = list(others)
    validate_name(current, errs)
    if namespace_of(current):
        tenancy.validate_shape(current, errs)
    validate_canary(current, old if isinstance(old, Mapping) else None, others, errs)
    spec = obj_field(current, "spec", "spec", errs)
    if spec is None:
        if current.get("spec") is None:
            errs.append(FieldError("spec", "spec is required"))
        return errs
    _spec(current, spec, errs)
    if isinstance(old, Mapping):
        validate_update(spec, apply_defaults(old), errs)
    validate_conflicts(current, others, errs, models=models)
    return errs
