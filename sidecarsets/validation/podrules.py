"""A sidecar checked as the container it becomes: core/v1's pod rules, in the API server's words.

Kruise validates a SidecarSet by building a pod of its sidecars and volumes and running the
API server's pod validation on it; a SidecarSet that passes is one whose sidecars the API server
will accept in a pod. Python has no copy of that code, so the rules users actually trip over are
written here, with kube-apiserver 1.37's field paths and messages (checked against it: the same
containers put in a pod give the same lines): names, images, pull and termination-message
policies, ports, env names, volume mounts (which must name a volume of the SidecarSet, since the
pod's own volumes are unknown here), resource quantities and requests above limits, and probes
and hooks (sidecarsets.validation.probes). The rest of Container validation is left to the API
server when the pod is created.

A malformed quantity is not a validation error for the API server but a decoding one, with no
field ("quantities must match the regular expression ..."); here it names its field.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sidecarsets.validation.base import (
    Errors,
    FieldError,
    duplicate,
    invalid,
    is_int,
    list_field,
    not_found,
    objects,
    required,
    type_name,
    unsupported,
)
from sidecarsets.validation.probes import PORT_RANGE, port_name_problems, validate_probes_and_hooks
from sidecarsets.values import quantity

PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TERMINATION_MESSAGE_POLICIES = ("File", "FallbackToLogsOnError")
INIT_RESTART_POLICIES = ("Always", "Never", "OnFailure")
PROTOCOLS = ("SCTP", "TCP", "UDP")
MOUNT_PROPAGATIONS = ("Bidirectional", "HostToContainer", "None")
CONTAINER_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
_STANDARD_RESOURCES = CONTAINER_RESOURCES | {"storage", "pods", "services", "nvidia.com/gpu"}
DNS_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def dns_label_errors(value: str, path: str) -> list[FieldError]:
    """ValidateDNS1123Label: container and volume names."""
    out = []
    if len(value) > 63:
        out.append(invalid(path, value, "must be no more than 63 characters"))
    ok = bool(value) and value[0].isalnum() and value[-1].isalnum()
    if not (ok and all(c.isascii() and (c.islower() or c.isdigit() or c == "-") for c in value)):
        out.append(invalid(path, value, DNS_LABEL_MESSAGE))
    return out


def _name(container: Mapping[str, Any], path: str, seen: set[str], errs: Errors) -> None:
    name = container.get("name")
    if name is None or name == "":
        errs.append(required(f"{path}.name"))
        return
    if not isinstance(name, str):
        errs.append(FieldError(f"{path}.name", f"must be a string, not {type_name(name)}"))
        return
    errs.extend(dns_label_errors(name, f"{path}.name"))
    if name in seen:
        errs.append(duplicate(f"{path}.name", name))
    seen.add(name)


def _image(container: Mapping[str, Any], path: str, errs: Errors) -> None:
    image = container.get("image")
    if image is None or image == "":
        errs.append(required(f"{path}.image"))
    elif not isinstance(image, str):
        errs.append(FieldError(f"{path}.image", f"must be a string, not {type_name(image)}"))
    elif image != image.strip():
        errs.append(invalid(f"{path}.image", image, "must not have leading or trailing whitespace"))


def _choice(container: Mapping[str, Any], key: str, allowed: tuple[str, ...], path: str, errs: Errors) -> None:
    """An enumerated field; empty means the API server's default."""
    value = container.get(key)
    if value not in (None, "") and value not in allowed:
        errs.append(unsupported(f"{path}.{key}", value, allowed))


def _ports(container: Mapping[str, Any], path: str, errs: Errors) -> None:
    ppath = f"{path}.ports"
    names: set[str] = set()
    for _, item_path, port in objects(list_field(container, "ports", ppath, errs), ppath, errs):
        name = port.get("name")
        if isinstance(name, str) and name:
            problems = port_name_problems(name)
            errs.extend(invalid(f"{item_path}.name", name, problem) for problem in problems)
            if not problems and name in names:
                errs.append(duplicate(f"{item_path}.name", name))
            names.add(name)
        number = port.get("containerPort")
        if number is None or number == 0:
            errs.append(required(f"{item_path}.containerPort"))
        elif not is_int(number) or not 1 <= number <= 65535:
            errs.append(invalid(f"{item_path}.containerPort", number, PORT_RANGE))
        host = port.get("hostPort")
        if host not in (None, 0) and (not is_int(host) or not 1 <= host <= 65535):
            errs.append(invalid(f"{item_path}.hostPort", host, PORT_RANGE))
        _choice(port, "protocol", PROTOCOLS, item_path, errs)


def _env(container: Mapping[str, Any], path: str, errs: Errors) -> None:
    epath = f"{path}.env"
    for _, item_path, item in objects(list_field(container, "env", epath, errs), epath, errs):
        name = item.get("name")
        if name is None or name == "":
            errs.append(required(f"{item_path}.name"))
        elif not isinstance(name, str) or not all(" " <= c <= "~" and c != "=" for c in name):
            detail = "a valid environment variable name must consist only of printable ASCII characters other than '='"
            errs.append(invalid(f"{item_path}.name", name, detail))


def _descending_path(value: Any, path: str, errs: Errors) -> None:
    if not isinstance(value, str):
        errs.append(FieldError(path, f"must be a string, not {type_name(value)}"))
    elif value.startswith("/"):
        errs.append(invalid(path, value, "must be a relative path"))
    elif ".." in value.split("/"):
        errs.append(invalid(path, value, "must not contain '..'"))


def _volume_mounts(container: Mapping[str, Any], path: str, volumes: Collection[str], errs: Errors) -> None:
    mpath = f"{path}.volumeMounts"
    mount_paths: set[str] = set()
    for _, item_path, mount in objects(list_field(container, "volumeMounts", mpath, errs), mpath, errs):
        name = mount.get("name")
        if name is None or name == "":
            errs.append(required(f"{item_path}.name"))
        if not isinstance(name, str) or name not in volumes:
            errs.append(not_found(f"{item_path}.name", name if name is not None else ""))
        mount_path = mount.get("mountPath")
        if mount_path is None or mount_path == "":
            errs.append(required(f"{item_path}.mountPath"))
        elif isinstance(mount_path, str) and mount_path in mount_paths:
            errs.append(invalid(f"{item_path}.mountPath", mount_path, "must be unique"))
        if isinstance(mount_path, str):
            mount_paths.add(mount_path)
        # The API server names these two fields without the mount's index.
        sub_path, sub_path_expr = mount.get("subPath"), mount.get("subPathExpr")
        if sub_path:
            _descending_path(sub_path, f"{mpath}.subPath", errs)
        if sub_path_expr:
            if sub_path:
                errs.append(
                    invalid(f"{item_path}.subPathExpr", sub_path_expr, "subPathExpr and subPath are mutually exclusive")
                )
            _descending_path(sub_path_expr, f"{mpath}.subPathExpr", errs)
        propagation = mount.get("mountPropagation")
        if propagation is not None and propagation not in MOUNT_PROPAGATIONS:
            errs.append(unsupported(f"{mpath}.mountPropagation", propagation, MOUNT_PROPAGATIONS))


def quantity_value(raw: Any, path: str, errs: Errors) -> quantity.Quantity | None:
    """A quantity field (a string or a number); reported with its field when it does not parse."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        errs.append(FieldError(path, f"must be a quantity (a string or a number), not {type_name(raw)}"))
        return None
    text = raw.strip() if isinstance(raw, str) else repr(raw)
    try:
        return quantity.parse(text)
    except quantity.QuantityError as e:
        errs.append(invalid(path, text, str(e)))
        return None


def _resource_list(resources: Mapping[str, Any], key: str, path: str, errs: Errors) -> dict[str, quantity.Quantity]:
    values = resources.get(key)
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        errs.append(FieldError(f"{path}.{key}", f"must be an object, not {type_name(values)}"))
        return {}
    out = {}
    for key_name, raw in values.items():
        name = str(key_name)
        rpath = f"{path}.{key}[{name}]"
        if "/" not in name and name not in CONTAINER_RESOURCES and not name.startswith("hugepages-"):
            if name not in _STANDARD_RESOURCES:
                errs.append(invalid(rpath, name, "must be a standard resource type or fully qualified"))
            errs.append(invalid(rpath, name, "must be a standard resource for containers"))
        value = quantity_value(raw, rpath, errs)
        if value is not None:
            if value.sign() < 0:
                errs.append(invalid(rpath, str(value), "must be greater than or equal to 0"))
            out[name] = value
    return out


def _resources(container: Mapping[str, Any], path: str, errs: Errors) -> None:
    rpath = f"{path}.resources"
    resources = container.get("resources")
    if resources is None:
        return
    if not isinstance(resources, Mapping):
        errs.append(FieldError(rpath, f"must be an object, not {type_name(resources)}"))
        return
    limits = _resource_list(resources, "limits", rpath, errs)
    requests = _resource_list(resources, "requests", rpath, errs)
    for name, limit in limits.items():
        if name not in requests:
            # The API server defaults a missing request to its limit, and checks it again.
            if limit.sign() < 0:
                errs.append(invalid(f"{rpath}.requests[{name}]", str(limit), "must be greater than or equal to 0"))
            continue
        if requests[name].cmp(limit) > 0:
            errs.append(
                invalid(
                    f"{rpath}.requests", str(requests[name]), f"must be less than or equal to {name} limit of {limit}"
                )
            )


def validate_pod_container(
    container: Mapping[str, Any], path: str, *, init: bool, volumes: Collection[str], seen: set[str], errs: Errors
) -> None:
    """core/v1's checks of one container; `seen` collects names across the pod's containers."""
    _name(container, path, seen, errs)
    _image(container, path, errs)
    _choice(container, "imagePullPolicy", PULL_POLICIES, path, errs)
    _choice(container, "terminationMessagePolicy", TERMINATION_MESSAGE_POLICIES, path, errs)
    if init:
        _choice(container, "restartPolicy", INIT_RESTART_POLICIES, path, errs)
    _ports(container, path, errs)
    _env(container, path, errs)
    _volume_mounts(container, path, volumes, errs)
    _resources(container, path, errs)
    plain_init = init and container.get("restartPolicy") != "Always"
    validate_probes_and_hooks(container, path, errs, plain_init=plain_init)
