"""The parameter object of a generated MutatingAdmissionPolicy: the values a new image changes.

kube-apiserver type-checks a policy's CEL when the policy is written and again to enforce it (about
55 ms a group on an idle API server here, in time that grows with the square of a group's calls), so
an image bump that rewrote a 60-group policy's CEL cost the API server 14.6 s of compiling under
load and halved the rate of every policy-served pod meanwhile (docs/benchmarks.md). What an image
changes (each sidecar's image, the SidecarSet's hash, its two bookkeeping entries with their revision
and time) is read instead from an `InjectionParameterSet` named like the policy (the policy's
`paramKind`, its binding's `paramRef`). The API server reads it from an informer per admission and
compiles nothing when it changes, so a bump writes one small object and leaves the CEL alone.

The kind is our own, not a ConfigMap: a policy's `paramKind` makes every kube-apiserver keep an
informer of every object of that kind in the cluster.

`parameterNotFoundAction: Deny`: a pod the binding matches while the object is missing is refused
(the policies, like the webhook, fail closed), never admitted without its sidecars. So the sync
(injector.policysync.sync) writes the object before a policy whose CEL reads a new key of it, and
deletes it only after its policy and binding are gone. It has no ownerReferences: the garbage
collector would delete it beside the binding, in either order.
"""

from __future__ import annotations

from collections.abc import Mapping

from injector.policy.generate import MANAGED_BY
from kuberuntime.jsontypes import JsonObj

GROUP = "sidecarctl.io"
VERSION = "v1alpha1"
KIND = "InjectionParameterSet"
PLURAL = "injectionparametersets"
PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"


def kind() -> JsonObj:
    """The policy's `paramKind`."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND}


def reference(name: str) -> JsonObj:
    """The binding's `paramRef`: the object named like the policy, its absence refusing the pod."""
    return {"name": name, "parameterNotFoundAction": "Deny"}


def parameter_object(name: str, values: Mapping[str, str]) -> JsonObj:
    """The object the policy `name` reads its values from."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "labels": dict(MANAGED_BY)},
        "spec": {"values": dict(sorted(values.items()))},
    }
