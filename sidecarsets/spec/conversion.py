"""SidecarSets converted between v1alpha1 and v1beta1, as Kruise 1.9 converts them.

The versions differ in two places (README: SidecarSet reference):
- the namespaces: v1alpha1 has `spec.namespace` and `spec.namespaceSelector`; v1beta1 has only a
  top-level `spec.namespaceSelector`. An alpha `namespace: N` becomes the selector
  `kubernetes.io/metadata.name: N` (the label the API server puts on every namespace), which
  overrides an alpha selector beside it exactly as `namespace` did; a v1beta1 selector comes back
  as the alpha `namespaceSelector`. That is Kruise's own mapping
  (`apis/apps/v1alpha1/sidecarset_conversion.go`), checked against it by tests/kruise: a v1beta1
  client reads what a Kruise client reads. Nothing it selects changes; the spelling does, once: a
  v1beta1 read-modify-write of an alpha `namespace` stores the equivalent selector.
- the custom version: v1alpha1 keeps it in the label `sidecarctl.io/sidecarset-custom-version`,
  v1beta1 in `spec.customVersion`; an empty one is none, and is dropped either way (as Kruise).

`spec.specificNamespace{namespace, namespaceSelector}`, a v1beta1 shape of this project's before it
followed Kruise's, is still read (converted to the alpha fields), never written. Kruise loses a
v1beta1 label that has the custom-version key; this conversion keeps it in the annotation
`conversion.sidecarctl.io/custom-version-label` of the v1alpha1 object and restores it, so that
label survives both ways. Refused (ConversionError naming the field): both namespace spellings at
once, an empty or non-object `specificNamespace`, a non-string `namespace` or `customVersion`, the
other version's fields, a v1beta1 object bringing the conversion's own annotation. Nothing else
changes: every other field of metadata, spec and status keeps its value.

Pure: the input is never modified; the output shares the values it does not change with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names

__all__ = ["ConversionError", "convert", "is_v1beta1", "version_of"]

_VERSIONS: Final = {
    names.API_VERSION: names.VERSION,
    names.KRUISE_API_VERSION: names.VERSION,
    names.API_VERSION_V1BETA1: names.VERSION_V1BETA1,
    names.KRUISE_API_VERSION_V1BETA1: names.VERSION_V1BETA1,
}
_MISSING: Final = object()
_SPECIFIC_KEYS: Final = ("namespace", "namespaceSelector")
_LABEL: Final = names.SS_LABEL_CUSTOM_VERSION
_AT: Final = names.ANN_CONVERSION_SELECTOR_AT
_STASHED_LABEL: Final = names.ANN_CONVERSION_VERSION_LABEL


class ConversionError(ValueError):
    """An object that cannot be converted without loss; the message names the field."""


def version_of(api_version: object) -> str | None:
    """The version (v1alpha1 or v1beta1) of a SidecarSet apiVersion, ours or Kruise's; else None."""
    return _VERSIONS.get(api_version) if isinstance(api_version, str) else None


def is_v1beta1(obj: Mapping[str, Any]) -> bool:
    """Whether `obj` is written in the v1beta1 shape (an object without apiVersion is v1alpha1)."""
    return version_of(obj.get("apiVersion")) == names.VERSION_V1BETA1


def convert(obj: Any, api_version: str) -> JsonObj:
    """`obj` as a SidecarSet of `api_version` (same version: a copy with that apiVersion)."""
    desired = version_of(api_version)
    if desired is None:
        raise ConversionError(f"cannot convert to {api_version!r}: not a SidecarSet version")
    if not isinstance(obj, Mapping):
        raise ConversionError("a SidecarSet must be an object")
    if obj.get("kind") != names.KIND:
        raise ConversionError(f"kind: {obj.get('kind')!r} is not {names.KIND}")
    current = version_of(obj.get("apiVersion"))
    if current is None:
        raise ConversionError(f"apiVersion: {obj.get('apiVersion')!r} is not a SidecarSet version")
    out: JsonObj = {**obj, "apiVersion": api_version}
    if current == desired:
        return out
    meta = _Metadata(out)
    spec = _spec(out)
    if desired == names.VERSION_V1BETA1:
        _to_v1beta1(spec, meta)
    else:
        _to_v1alpha1(spec, meta)
    out["spec"] = spec
    meta.store(out)
    return out


class _Metadata:
    """Copies of the object's labels and annotations, written back only when changed."""

    def __init__(self, obj: JsonObj) -> None:
        meta = obj.get("metadata")
        if meta is not None and not isinstance(meta, Mapping):
            raise ConversionError("metadata must be an object")
        self._meta: Mapping[str, Any] = meta or {}
        self.labels = self._strings("labels")
        self.annotations = self._strings("annotations")
        self.changed: set[str] = set()

    def _strings(self, key: str) -> dict[str, Any]:
        value = self._meta.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConversionError(f"metadata.{key} must be an object")
        return dict(value)

    def pop(self, key: str, name: str) -> Any:
        self.changed.add(key)
        return getattr(self, key).pop(name)

    def put(self, key: str, name: str, value: Any) -> None:
        self.changed.add(key)
        getattr(self, key)[name] = value

    def store(self, obj: JsonObj) -> None:
        if not self.changed:
            return
        meta = dict(self._meta)
        for key in self.changed:
            value = getattr(self, key)
            if value:
                meta[key] = value
            else:  # the API server keeps no empty label or annotation map either
                meta.pop(key, None)
        obj["metadata"] = meta


def _spec(obj: JsonObj) -> JsonObj:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise ConversionError("spec must be an object")
    return dict(spec)


def _refuse_fields(spec: JsonObj, fields: tuple[str, ...], version: str) -> None:
    for field in fields:
        if field in spec:
            raise ConversionError(f"spec.{field} is not a field of {version}")


def _to_v1beta1(spec: JsonObj, meta: _Metadata) -> None:
    _refuse_fields(spec, ("specificNamespace", "customVersion"), names.VERSION)
    namespace = spec.pop("namespace", _MISSING)
    selector = spec.pop("namespaceSelector", _MISSING)
    if namespace is not _MISSING and namespace is not None and not isinstance(namespace, str):
        raise ConversionError("spec.namespace must be a string")
    if isinstance(namespace, str) and namespace:
        spec["namespaceSelector"] = {"matchLabels": {names.NS_NAME_LABEL: namespace}}
    elif selector is not _MISSING and selector is not None:
        spec["namespaceSelector"] = selector
    if _AT in meta.annotations:
        meta.pop("annotations", _AT)  # an earlier version's marker for the shape now always written
    if _LABEL in meta.labels:
        version = meta.pop("labels", _LABEL)
        if not isinstance(version, str):
            raise ConversionError(f"metadata.labels[{_LABEL}] must be a string")
        if version:  # as Kruise: an empty custom version is none (customVersion is omitempty)
            spec["customVersion"] = version
    if _STASHED_LABEL in meta.annotations:
        meta.put("labels", _LABEL, meta.pop("annotations", _STASHED_LABEL))


def _reserved(key: str, why: str) -> ConversionError:
    return ConversionError(f"metadata.annotations[{key}] is reserved for the conversion to v1alpha1 ({why}); remove it")


def _to_v1alpha1(spec: JsonObj, meta: _Metadata) -> None:
    _refuse_fields(spec, ("namespace",), names.VERSION_V1BETA1)
    specific = spec.pop("specificNamespace", _MISSING)
    if specific is not _MISSING and specific is not None:  # null is absent, as for Go
        if not isinstance(specific, Mapping):
            raise ConversionError("spec.specificNamespace must be an object")
        unknown = sorted(set(specific) - set(_SPECIFIC_KEYS))
        if unknown:
            raise ConversionError(f"spec.specificNamespace.{unknown[0]} is not a field of {names.VERSION_V1BETA1}")
        if not specific:
            raise ConversionError("spec.specificNamespace is empty: set namespace or namespaceSelector, or omit it")
        if spec.get("namespaceSelector") is not None:
            raise ConversionError("spec.namespaceSelector and spec.specificNamespace are mutually exclusive")
        spec.update((k, specific[k]) for k in _SPECIFIC_KEYS if k in specific)
    if _STASHED_LABEL in meta.annotations:
        raise _reserved(_STASHED_LABEL, f"it holds the {_LABEL} label")
    if _LABEL in meta.labels:
        meta.put("annotations", _STASHED_LABEL, meta.pop("labels", _LABEL))
    version = spec.pop("customVersion", None)
    if version is not None:
        if not isinstance(version, str):
            raise ConversionError("spec.customVersion must be a string")
        if version:  # as Kruise: no label for an empty custom version
            meta.put("labels", _LABEL, version)
