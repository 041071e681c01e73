"""Probes and lifecycle hooks of a sidecar, checked as the API server checks them in a pod.

A probe or hook without a handler, or with two, passes the SidecarSet's schema but makes every
pod it is injected into invalid. The rules and messages are core/v1's (kube-apiserver 1.37), after
the API server's defaults (timeoutSeconds 1, periodSeconds 10, successThreshold 1,
failureThreshold 3 where a value is 0 or absent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarsets.validation.base import Errors, FieldError, forbidden, invalid, is_int, required

PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HOOKS = ("postStart", "preStop")
_PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
_HOOK_HANDLERS = ("exec", "httpGet", "tcpSocket", "sleep")
_PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}
_NON_NEGATIVE = ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold")
PORT_RANGE = "must be between 1 and 65535, inclusive"


def port_name_problems(name: str) -> list[str]:
    """IsValidPortName: an IANA service name."""
    out = []
    if len(name) > 15:
        out.append("must be no more than 15 characters")
    if not all(c.isascii() and (c.islower() or c.isdigit() or c == "-") for c in name):
        out.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not any("a" <= c <= "z" for c in name):
        out.append("must contain at least one letter (a-z)")
    if "--" in name:
        out.append("must not contain consecutive hyphens")
    if name.startswith("-") or name.endswith("-"):
        out.append("must not begin or end with a hyphen")
    return out


def port_number_or_name(value: Any, path: str, errs: Errors) -> None:
    """An int-or-string port: a number in range, or a valid port name."""
    if isinstance(value, str):
        errs.extend(invalid(path, value, problem) for problem in port_name_problems(value))
    elif is_int(value):
        if not 1 <= value <= 65535:
            errs.append(invalid(path, value, PORT_RANGE))
    else:
        errs.append(invalid(path, value, "must be a port number or name"))


def _handler(handler: Mapping[str, Any], kinds: tuple[str, ...], path: str, errs: Errors) -> None:
    count = 0
    for kind in kinds:
        action = handler.get(kind)
        if action is None:
            continue
        if count:
            errs.append(forbidden(f"{path}.{kind}", "may not specify more than 1 handler type"))
            continue
        count += 1
        if not isinstance(action, Mapping):
            errs.append(FieldError(f"{path}.{kind}", "must be an object"))
        elif kind == "exec" and not action.get("command"):
            errs.append(required(f"{path}.exec.command"))
        elif kind in ("httpGet", "tcpSocket"):
            port_number_or_name(action.get("port"), f"{path}.{kind}.port", errs)
        elif kind == "grpc":
            port = action.get("port")
            if not is_int(port) or not 1 <= port <= 65535:
                errs.append(invalid(f"{path}.grpc.port", port, PORT_RANGE))
    if count == 0:
        errs.append(required(path, "must specify a handler type"))


def _probe(probe: Mapping[str, Any], kind: str, path: str, errs: Errors) -> None:
    _handler(probe, _PROBE_HANDLERS, path, errs)
    values = {key: probe.get(key) for key in _NON_NEGATIVE}
    for key, default in _PROBE_DEFAULTS.items():
        if values[key] in (None, 0):
            values[key] = default
    for key in _NON_NEGATIVE:
        value = values[key]
        if value is None:
            continue
        if not is_int(value):
            errs.append(invalid(f"{path}.{key}", value, "must be an integer"))
        elif value < 0:
            errs.append(invalid(f"{path}.{key}", value, "must be greater than or equal to 0"))
    grace = probe.get("terminationGracePeriodSeconds")
    if grace is not None:
        if kind == "readinessProbe":
            errs.append(invalid(f"{path}.terminationGracePeriodSeconds", grace, "must not be set for readinessProbes"))
        elif not is_int(grace) or grace <= 0:
            errs.append(invalid(f"{path}.terminationGracePeriodSeconds", grace, "must be greater than 0"))
    success = values["successThreshold"]
    if kind != "readinessProbe" and is_int(success) and success != 1:
        errs.append(invalid(f"{path}.successThreshold", success, "must be 1"))


def validate_probes_and_hooks(container: Mapping[str, Any], path: str, errs: Errors, *, plain_init: bool) -> None:
    """Plain init containers (no `restartPolicy: Always`) may have neither probes nor hooks."""
    lifecycle = container.get("lifecycle")
    if plain_init:
        for key in ("lifecycle", *PROBES):
            if container.get(key) is not None:
                errs.append(
                    forbidden(f"{path}.{key}", "may not be set for init containers without restartPolicy=Always")
                )
        return
    if lifecycle is not None:
        if not isinstance(lifecycle, Mapping):
            errs.append(FieldError(f"{path}.lifecycle", "must be an object"))
        else:
            for hook in HOOKS:
                handler = lifecycle.get(hook)
                if isinstance(handler, Mapping):
                    _handler(handler, _HOOK_HANDLERS, f"{path}.lifecycle.{hook}", errs)
                elif handler is not None:
                    errs.append(FieldError(f"{path}.lifecycle.{hook}", "must be an object"))
    for kind in PROBES:
        probe = container.get(kind)
        if isinstance(probe, Mapping):
            _probe(probe, kind, f"{path}.{kind}", errs)
        elif probe is not None:
            errs.append(FieldError(f"{path}.{kind}", "must be an object"))
