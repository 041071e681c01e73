"""What the command line names: a pod, the pods of a label selector, or a workload's pods."""

from __future__ import annotations

import re
from dataclasses import dataclass

APPS = "/apis/apps/v1/namespaces/{ns}/{plural}/{name}"

WORKLOADS = {
    "deployment": APPS.replace("{plural}", "deployments"),
    "statefulset": APPS.replace("{plural}", "statefulsets"),
    "daemonset": APPS.replace("{plural}", "daemonsets"),
    "replicaset": APPS.replace("{plural}", "replicasets"),
    "job": "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
}

ALIASES = {"deploy": "deployment", "sts": "statefulset", "ds": "daemonset", "rs": "replicaset", "po": "pod"}

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class Target:
    kind: str  # "pod", "selector", or a key of WORKLOADS
    namespace: str
    name: str  # the label selector for "selector"


def parse_target(target: str | None, namespace: str | None, selector: str | None) -> Target:
    """The object the command line names; ValueError with what is wrong (argparse makes it status 2)."""
    if namespace is not None and not _valid(namespace, label=True):
        raise ValueError(f"-n {namespace!r} is not a namespace name")
    ns = namespace or "default"
    if target is not None and selector is not None:
        raise ValueError("give a pod, a workload or -l SELECTOR, not both")
    if selector is not None:
        if not selector.strip():
            raise ValueError("-l needs a label selector such as app=web")
        return Target("selector", ns, selector)
    if target is None:
        raise ValueError("give a pod (NAME or NAMESPACE/NAME), a workload (KIND/NAME) or -l SELECTOR")
    parts = target.split("/")
    if len(parts) > 2:
        raise ValueError(f"{target!r}: use NAME, NAMESPACE/NAME or KIND/NAME")
    if len(parts) == 1:
        kind, name = "pod", parts[0]
    else:
        word = parts[0].lower().removesuffix("s") if parts[0].lower() not in ALIASES else parts[0].lower()
        word = ALIASES.get(word, word)
        if word == "pod" or word in WORKLOADS:
            kind, name = word, parts[1]
        elif namespace is not None and namespace != parts[0]:
            raise ValueError(f"{target!r} names namespace {parts[0]}, but -n says {namespace}")
        elif _valid(parts[0], label=True):
            kind, ns, name = "pod", parts[0], parts[1]
        else:
            raise ValueError(f"{parts[0]!r} is neither a namespace nor one of pod, {', '.join(WORKLOADS)}")
    if not _valid(name):
        raise ValueError(f"{name!r} is not a valid object name")
    return Target(kind, ns, name)


def _valid(name: str, *, label: bool = False) -> bool:
    return bool(_NAME.match(name)) and (not label or (len(name) <= 63 and "." not in name))
