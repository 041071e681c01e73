"""The rules on the fields where v1alpha1 and v1beta1 differ: the namespace scope and the custom version.

v1alpha1: `spec.namespace` and `spec.namespaceSelector` (both may be set; `namespace` wins, as in
Kruise's current v1alpha1 API; Kruise 1.8 rejected the combination), and the custom-version label.
v1beta1: Kruise 1.9's top-level `spec.namespaceSelector` (one namespace is the selector
`kubernetes.io/metadata.name: N`), or `spec.specificNamespace{namespace, namespaceSelector}`, an
earlier shape of ours that is still read (never written by the conversion), and
`spec.customVersion`. A field of the other version is refused rather than ignored (the API server
would prune it: the SidecarSet would silently reach every namespace), naming the field to use. The
annotations under `conversion.sidecarctl.io/` are written by the conversion to v1alpha1
(sidecarsets.spec.conversion) and may not come with a v1beta1 object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kuberuntime.jsontypes import mapping, resolve
from sidecarsets.spec import names
from sidecarsets.spec.conversion import is_v1beta1
from sidecarsets.validation.base import (
    Errors,
    FieldError,
    dns1123_label_problem,
    label_value_problem,
    obj_field,
    type_name,
    validate_selector,
)

# A v1beta1 field met in a v1alpha1 object, or the reverse: what to write instead.
_ALPHA_INSTEAD = {
    "specificNamespace": "spec.namespace and spec.namespaceSelector",
    "customVersion": f"the label {names.SS_LABEL_CUSTOM_VERSION}",
}
_BETA_INSTEAD = {"namespace": f"spec.namespaceSelector.matchLabels[{names.NS_NAME_LABEL}]"}


def _namespace(value: Any, path: str, errs: Errors) -> None:
    if value is None or value == "":
        return
    if not isinstance(value, str):
        errs.append(FieldError(path, f"must be a string, not {type_name(value)}"))
        return
    problem = dns1123_label_problem(value)
    if problem:
        errs.append(FieldError(path, problem))


def _other_version(spec: Mapping[str, Any], instead: Mapping[str, str], version: str, errs: Errors) -> None:
    for field, use in instead.items():
        if field in spec:
            errs.append(FieldError(f"spec.{field}", f"is not a field of {names.GROUP}/{version}: use {use}"))


def _v1alpha1(obj: Mapping[str, Any], spec: Mapping[str, Any], errs: Errors) -> None:
    _other_version(spec, _ALPHA_INSTEAD, names.VERSION, errs)
    _namespace(spec.get("namespace"), "spec.namespace", errs)
    validate_selector(spec.get("namespaceSelector"), "spec.namespaceSelector", errs, required=False)
    # The conversion makes this annotation a v1beta1 label again: it must be a label value.
    stashed = resolve(obj, "metadata", "annotations", names.ANN_CONVERSION_VERSION_LABEL)
    if stashed is not None:
        problem = label_value_problem(stashed) if isinstance(stashed, str) else "must be a string"
        if problem:
            errs.append(FieldError(f"metadata.annotations[{names.ANN_CONVERSION_VERSION_LABEL}]", problem))


def _v1beta1(obj: Mapping[str, Any], spec: Mapping[str, Any], errs: Errors) -> None:
    _other_version(spec, _BETA_INSTEAD, names.VERSION_V1BETA1, errs)
    validate_selector(spec.get("namespaceSelector"), "spec.namespaceSelector", errs, required=False)
    specific = obj_field(spec, "specificNamespace", "spec.specificNamespace", errs)
    if specific is not None:
        if spec.get("namespaceSelector") is not None:
            errs.append(
                FieldError("spec.namespaceSelector", "and spec.specificNamespace are mutually exclusive: set one")
            )
        if not any(specific.get(k) is not None for k in ("namespace", "namespaceSelector")):
            errs.append(FieldError("spec.specificNamespace", "set namespace or namespaceSelector, or leave it out"))
        for key in sorted(set(specific) - {"namespace", "namespaceSelector"}):
            errs.append(FieldError(f"spec.specificNamespace.{key}", "unknown field"))
        _namespace(specific.get("namespace"), "spec.specificNamespace.namespace", errs)
        selector = specific.get("namespaceSelector")
        validate_selector(selector, "spec.specificNamespace.namespaceSelector", errs, required=False)
    version = spec.get("customVersion")
    if version is not None:
        if not isinstance(version, str):
            errs.append(FieldError("spec.customVersion", f"must be a string, not {type_name(version)}"))
        elif problem := label_value_problem(version):
            # It becomes a label on the SidecarSet's ControllerRevisions (and in v1alpha1).
            errs.append(FieldError("spec.customVersion", problem))
    for key in sorted(mapping(obj, "metadata", "annotations")):
        if isinstance(key, str) and key.startswith(names.CONVERSION_ANNOTATION_PREFIX):
            errs.append(
                FieldError(
                    f"metadata.annotations[{key}]",
                    f"is reserved: the conversion to {names.API_VERSION} writes it; remove it",
                )
            )


def validate_version_fields(obj: Mapping[str, Any], spec: Mapping[str, Any], errs: Errors) -> None:
    """The namespace scope and custom version, by the object's apiVersion."""
    if is_v1beta1(obj):
        _v1beta1(obj, spec, errs)
    else:
        _v1alpha1(obj, spec, errs)
