"""Pod values copied into a JSON Patch, rebuilt field by field.

Why rebuilt: on kube-apiserver 1.37, a policy with any matchCondition cannot put a list or
object read from `object` into a JSONPatch value ("could not marshal to JSON"); values built
from their scalar fields go through. Every field of EnvVar, VolumeMount and VolumeDevice that a
shared mount or a transferred env var can carry is listed here.
"""

from __future__ import annotations


def _optional(obj: str, field: str) -> str:
    return f'?"{field}": {obj}.?{field}.optMap(x, dyn(x))'


def _object(var: str, required: list[str], optional: list[str]) -> str:
    parts = [f'"{f}": dyn({var}.{f})' for f in required] + [_optional(var, f) for f in optional]
    return "dyn({" + ", ".join(parts) + "})"


def mount(m: str) -> str:
    optional = ("readOnly", "recursiveReadOnly", "subPath", "subPathExpr", "mountPropagation")
    return (
        "{"
        + f'"name": dyn({m}.name), "mountPath": dyn({m}.mountPath), '
        + ", ".join(_optional(m, f) for f in optional)
        + "}"
    )


def device(d: str) -> str:
    return "{" + f'"name": dyn({d}.name), "devicePath": dyn({d}.devicePath)' + "}"


def env(e: str) -> str:
    sources = ", ".join(
        [
            f'?"fieldRef": vf.?fieldRef.optMap(r, {_object("r", ["fieldPath"], ["apiVersion"])})',
            f'?"resourceFieldRef": vf.?resourceFieldRef.optMap(r, {_object("r", ["resource"], ["containerName", "divisor"])})',
            f'?"configMapKeyRef": vf.?configMapKeyRef.optMap(r, {_object("r", ["key"], ["name", "optional"])})',
            f'?"secretKeyRef": vf.?secretKeyRef.optMap(r, {_object("r", ["key"], ["name", "optional"])})',
            f'?"fileKeyRef": vf.?fileKeyRef.optMap(r, {_object("r", ["volumeName", "path", "key"], ["optional"])})',
        ]
    )
    return (
        "{"
        + f'"name": dyn({e}.name), '
        + _optional(e, "value")
        + f', ?"valueFrom": {e}.?valueFrom.optMap(vf, dyn({{{sources}}}))'
        + "}"
    )
