"""The parameter object of a generated MutatingAdmissionPolicy: the values a new image changes.

kube-apiserver type-checks a policy's CEL when the policy is written and again to enforce it (about
55 ms a group on an idle API server here, in time that grows with the square of a group's calls), so
an image bump that rewrote a 60-group policy's CEL cost the API server 14.6 s of compiling under
load and halved the rate of every policy-served pod meanwhile (docs/benchmarks.md). What an image
changes (each sidecar's image, the SidecarSet's hash, its two bookkeeping entries with their revision
and time) is read instead from a parameter object named like the policy (the policy's `paramKind`,
its binding's `paramRef`). The API server reads it from an informer per admission and compiles
nothing when it changes, so a bump writes one small object and leaves the CEL alone.

The kind is a PodTemplate in the manager's namespace, the values its template's annotations:
- a built-in kind: kube-apiserver resolves a policy's `paramKind` through a REST mapping it fills
  from discovery and refreshes every 30 s. A kind of our own (a CRD) is not in it for a while after
  every kube-apiserver start, and each policy-matched pod was refused meanwhile (`failed to find
  resource referenced by paramKind`, measured: docs/benchmarks.md); a built-in kind is there from
  the start;
- a kind with few objects: a `paramKind` makes every kube-apiserver keep an informer of every
  object of that kind in the cluster, and PodTemplates are written by almost nothing else (a
  ConfigMap, the other candidate, would have it hold every ConfigMap of every namespace).
A PodTemplate is never run: nothing in Kubernetes makes pods from one.

`parameterNotFoundAction: Deny`: a pod the binding matches while the object is missing is refused
(the policies, like the webhook, fail closed), never admitted without its sidecars. So the sync
(injector.policysync.sync) writes the object before a policy whose CEL reads a new key of it, and
deletes it only after its policy and binding are gone. It has no ownerReferences: the garbage
collector would delete it beside the binding, in either order.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from kuberuntime.jsontypes import JsonObj

KIND = "PodTemplate"
PLURAL = "podtemplates"
# Each value's key is an annotation name: at most 63 of these characters, alphanumeric at both ends.
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
# The object must hold a valid pod template; its one container is never run, and meets the restricted
# Pod Security level so that a namespace warning on it does not warn on every write.
_PLACEHOLDER: JsonObj = {
    "name": "values",
    "image": "sidecarctl.io/parameters-only",
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
}


def path(namespace: str) -> str:
    """Where the parameter objects live: the manager's namespace."""
    return f"/api/v1/namespaces/{namespace}/{PLURAL}"


def kind() -> JsonObj:
    """The policy's `paramKind`."""
    return {"apiVersion": "v1", "kind": KIND}


def reference(name: str, namespace: str) -> JsonObj:
    """The binding's `paramRef`: the object named like the policy, its absence refusing the pod."""
    return {"name": name, "namespace": namespace, "parameterNotFoundAction": "Deny"}


def key_name(key: str, taken: Mapping[str, str]) -> str:
    """The annotation name under which the value of `key` (`<SidecarSet>:image:<container>` and the
    like) is stored: `key` with `:` and `/` as `_` where that is a valid name no other key of the
    object (`taken`: name -> key) has, else a digest of it."""
    name = key.replace(":", "_").replace("/", "_")
    if _NAME.fullmatch(name) and taken.get(name, key) == key:
        return name
    return "h." + hashlib.sha256(key.encode()).hexdigest()[:24]


def parameter_object(name: str, namespace: str, values: Mapping[str, str], labels: Mapping[str, str]) -> JsonObj:
    """The object the policy `name` reads its values from."""
    return {
        "apiVersion": "v1",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "template": {
            "metadata": {"annotations": dict(sorted(values.items()))},
            "spec": {"containers": [_PLACEHOLDER]},
        },
    }


def values(obj: JsonObj | None) -> dict[str, str]:
    """The values a stored (or wanted) parameter object holds."""
    found: dict[str, str] = (((obj or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}
    return found


def with_values(obj: JsonObj, new: Mapping[str, str]) -> JsonObj:
    """`obj` holding `new` instead of its values."""
    template = obj["template"]
    meta = {**template["metadata"], "annotations": dict(sorted(new.items()))}
    return {**obj, "template": {**template, "metadata": meta}}
