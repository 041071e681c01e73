#!/usr/bin/env python3
"""Generate the SidecarSet CustomResourceDefinition (config/crd/sidecarctl.io_sidecarsets.yaml) and the
NamespacedSidecarSet one (config/crd/sidecarctl.io_namespacedsidecarsets.yaml).

Why a generator: the CRD carries a structural schema, and the API server prunes every field the
schema does not name. A SidecarSet embeds whole core/v1 Containers and Volumes, so a hand-written
schema that misses one field (a new probe option, a new volume source) silently deletes it from
users' sidecars. The kube-apiserver publishes the exact core/v1 schemas in its OpenAPI v3
document; this script inlines them the way controller-gen would, so the schema tracks the
Kubernetes version we build against instead of a memory of it.

Regenerate (stdlib + PyYAML only), from the repository root:

    .venv/bin/python tools/gen_crd.py \
        --openapi /root/go/pkg/mod/k8s.io/kubernetes@v1.37.2/api/openapi-spec/v3/api__v1_openapi.json

`--check` compares instead of writing and exits 1 when the committed file is stale. Without
`--openapi` the document is looked up in $GOMODCACHE (or ~/go/pkg/mod) for KUBERNETES_VERSION.

Conversions (what an apiextensions.k8s.io/v1 schema does not allow, or what would hurt users):
- every `$ref` is inlined; `allOf: [$ref]` wrappers are flattened;
- IntOrString -> `x-kubernetes-int-or-string: true` + `anyOf: [{type: integer}, {type: string}]`;
  Quantity -> the same plus the Quantity pattern (a YAML float such as `cpu: 0.5` is therefore
  rejected, exactly as in every controller-gen CRD; write `500m` or `"0.5"`);
  metav1.Time -> `string`/`date-time`; FieldsV1 -> object with preserved unknown fields;
- `default`s of nested Kubernetes fields are dropped (they are zero values or pod-level defaults
  the API server applies to the pod anyway; applied here they would rewrite users' SidecarSets),
  except a default on a list-map key that is not required, which the API server insists on;
- `x-kubernetes-patch-*`, `x-kubernetes-unions` and discriminators are dropped (not CRD fields);
- Container `env` and `ports` become atomic lists: pods accept duplicate env names and duplicate
  ports (with a warning), a list-map would reject such a SidecarSet;
- descriptions of Kubernetes fields are cut to their first sentence so the CRD stays under the
  256 KiB that client-side `kubectl apply` can store in its last-applied annotation (with two
  versions it holds the schema twice).

Versions: v1alpha1 (stored) and v1beta1 share one schema but for the fields where they differ
(sidecarsets.spec.conversion): v1beta1 has Kruise 1.9's top-level `namespaceSelector` and
`customVersion`, and still reads the legacy `specificNamespace{namespace, namespaceSelector}` (a CEL
rule keeps it apart from the top-level selector; the conversion never writes it). Conversion is
the manager's webhook at /convert behind the `sidecarctl-webhook` Service.

NamespacedSidecarSet: namespaced, v1beta1 only (no conversion), SidecarSet v1beta1's schema and
printer columns without the namespace fields (`namespaceSelector`, `specificNamespace`): it selects
pods of its own namespace.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sidecarsets.spec import defaults, names
from sidecarsets.spec.enums import (
    InjectPolicy,
    PatchPolicy,
    RevisionPolicy,
    SharePolicy,
    TargetContainersMode,
    UpdateType,
    UpgradeType,
    values,
)

KUBERNETES_VERSION = "1.37.2"
REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "config" / "crd" / "sidecarctl.io_sidecarsets.yaml"
NAMESPACED_OUTPUT = REPO / "config" / "crd" / f"{names.GROUP}_{names.NAMESPACED_PLURAL}.yaml"

GROUP = names.GROUP
# Both served; stored as v1alpha1 (README: "Storage version"): the manager reads and writes it, so
# neither its own watches nor objects stored before v1beta1 existed depend on the conversion webhook.
VERSIONS = (names.VERSION, names.VERSION_V1BETA1)
STORAGE_VERSION = names.VERSION
CONVERSION_SERVICE = (names.DEFAULT_MANAGER_NAMESPACE, "sidecarctl-webhook")
KIND = names.KIND
PLURAL = names.PLURAL
SINGULAR = "sidecarset"
SHORT_NAMES = ["scs"]

CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
DESCRIPTION_MAX = 200
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

Schema = dict[str, Any]

# Keys copied as they are from the Kubernetes document.
_COPIED = {
    "type",
    "format",
    "required",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
}
# Keys that a CRD schema does not know; dropped on purpose.
_DROPPED = {
    "x-kubernetes-patch-strategy",
    "x-kubernetes-patch-merge-key",
    "x-kubernetes-unions",
    "x-kubernetes-group-version-kind",
    "discriminator",
    "fields-to-discriminateBy",
    "default",
}
# Lists that are list-maps on pods but whose keys pods do not enforce as unique.
_ATOMIC_LISTS = {(CORE + "Container", "env"), (CORE + "Container", "ports")}


def int_or_string() -> Schema:
    return {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}


def short_description(text: str) -> str:
    """First sentence, at most DESCRIPTION_MAX characters, whitespace folded."""
    text = " ".join(text.split())
    m = re.search(r"(?<=[a-z0-9)\]\"'`])\. (?=[A-Z`\"'])", text)
    if m:
        text = text[: m.start() + 1]
    if len(text) > DESCRIPTION_MAX:
        text = text[: DESCRIPTION_MAX - 3].rstrip() + "..."
    return text


class Inliner:
    """Turns `$ref`-linked OpenAPI v3 component schemas into one self-contained CRD schema."""

    def __init__(self, document: Schema) -> None:
        self.schemas: dict[str, Schema] = document["components"]["schemas"]

    def named(self, name: str, *, description: str | None = None) -> Schema:
        out = self._named(name, ())
        if description is not None:
            out["description"] = description
        return out

    def _named(self, name: str, stack: tuple[str, ...]) -> Schema:
        if name == INT_OR_STRING:
            return int_or_string()
        if name == QUANTITY:
            return {**int_or_string(), "pattern": QUANTITY_PATTERN}
        if name == META + "Time" or name == META + "MicroTime":
            return {"type": "string", "format": "date-time"}
        if name == META + "FieldsV1":
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        if name in stack:
            raise SystemExit(f"recursive schema {' -> '.join((*stack, name))}: cannot inline")
        return self._convert(self.schemas[name], (*stack, name))

    def _convert(self, node: Schema, stack: tuple[str, ...]) -> Schema:
        if "$ref" in node:
            target = self._named(node["$ref"].rsplit("/", 1)[-1], stack)
            if "description" in node:
                target["description"] = short_description(node["description"])
            return target
        out: Schema = {}
        if "allOf" in node:
            if len(node["allOf"]) != 1:
                raise SystemExit(f"{'.'.join(stack)}: allOf with {len(node['allOf'])} entries")
            out = self._convert(node["allOf"][0], stack)
        owner = stack[-1] if stack else ""
        for key, value in node.items():
            if key in ("allOf", "$ref") or key in _DROPPED:
                continue
            if key == "description":
                out["description"] = short_description(value)
            elif key in _COPIED:
                out[key] = copy.deepcopy(value)
            elif key == "items":
                out["items"] = self._convert(value, stack)
            elif key == "additionalProperties":
                out[key] = self._convert(value, stack) if isinstance(value, dict) else value
            elif key == "properties":
                props: Schema = {}
                for pname, pschema in value.items():
                    if (owner, pname) in _ATOMIC_LISTS:
                        pschema = {k: v for k, v in pschema.items() if k != "x-kubernetes-list-map-keys"}
                        pschema["x-kubernetes-list-type"] = "atomic"
                    props[pname] = self._convert(pschema, stack)
                out["properties"] = props
            else:
                raise SystemExit(f"{'.'.join(stack)}: unsupported schema keyword {key!r}")
        if out.get("x-kubernetes-list-type") == "map":
            self._default_map_keys(node, out, stack)
        return out

    def _default_map_keys(self, node: Schema, out: Schema, stack: tuple[str, ...]) -> None:
        """A list-map key must be required or defaulted; bring back the source default."""
        items_src = node["items"]
        if "$ref" in items_src:
            items_src = self.schemas[items_src["$ref"].rsplit("/", 1)[-1]]
        required = set(out["items"].get("required", []))
        for key in out["x-kubernetes-list-map-keys"]:
            if key in required:
                continue
            source = items_src["properties"][key]
            if "default" not in source:
                raise SystemExit(f"{'.'.join(stack)}: list-map key {key} has neither required nor default")
            out["items"]["properties"][key]["default"] = source["default"]


def label_selector(inl: Inliner, description: str) -> Schema:
    return inl.named(META + "LabelSelector", description=description)


def sidecar_container(inl: Inliner, *, init: bool) -> Schema:
    where = "initContainers" if init else "containers"
    schema = inl.named(
        CORE + "Container",
        description=(
            f"A sidecar injected into pod.spec.{where}: a complete core/v1 Container plus how to inject and upgrade it."
        ),
    )
    share_policy: Schema = {
        "type": "object",
        "properties": {
            "type": {
                "type": "string",
                "enum": values(SharePolicy),
                "description": "enabled: also mount what the pod's own containers mount.",
            }
        },
    }
    transfer_env: Schema = {
        "type": "object",
        "description": "Copies env vars of a pod container into the sidecar.",
        "properties": {
            "sourceContainerName": {"type": "string", "description": "Name of the pod container to copy from."},
            "sourceContainerNameFrom": {
                "type": "object",
                "description": "Reads the source container name from the pod's metadata.",
                "properties": {
                    "fieldRef": inl.named(
                        CORE + "ObjectFieldSelector",
                        description=(
                            "metadata.name, metadata.labels['<KEY>'] or metadata.annotations['<KEY>'] of the pod."
                        ),
                    )
                },
            },
            "envName": {"type": "string", "description": "One env var to copy."},
            "envNames": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Several env vars to copy.",
            },
        },
        "x-kubernetes-validations": [
            {
                "rule": "has(self.envName) || (has(self.envNames) && size(self.envNames) > 0)",
                "message": "one of envName or envNames must be set",
            },
            {
                "rule": "has(self.sourceContainerName) != has(self.sourceContainerNameFrom)",
                "message": "exactly one of sourceContainerName or sourceContainerNameFrom must be set",
            },
        ],
    }
    expr_pair: Schema = {
        "type": "object",
        "properties": {
            "cpu": {"type": "string", "description": "Expression over `cpu`, e.g. max(cpu*50%, 50m)."},
            "memory": {"type": "string", "description": "Expression over `memory`, e.g. 200Mi."},
        },
    }
    extras: Schema = {
        "podInjectPolicy": {
            "type": "string",
            "enum": values(InjectPolicy),
            # Not defaulted here: the default differs between containers (BeforeAppContainer)
            # and initContainers (AfterAppContainer), and both lists share this schema in
            # Kruise's API. sidecarsets/spec/defaults.py and the mutating path fill it in.
            "description": (
                "Where the sidecar goes among the pod's containers. Defaults to BeforeAppContainer "
                "for containers and AfterAppContainer for initContainers."
            ),
        },
        "upgradeStrategy": {
            "type": "object",
            "description": "How a running sidecar is upgraded in place.",
            "properties": {
                "upgradeType": {
                    "type": "string",
                    "enum": values(UpgradeType),
                    "description": "ColdUpgrade restarts the container on the new image; immutable.",
                },
                "hotUpgradeEmptyImage": {
                    "type": "string",
                    "description": "HotUpgrade only: an image that behaves like the sidecar but does no work.",
                },
            },
        },
        "shareVolumePolicy": {
            **copy.deepcopy(share_policy),
            "description": "Whether the sidecar also mounts the volumes of the pod's containers.",
        },
        "shareVolumeDevicePolicy": {
            **copy.deepcopy(share_policy),
            "description": "Whether the sidecar also gets the volume devices of the pod's containers.",
        },
        "transferEnv": {
            "type": "array",
            "items": transfer_env,
            "description": "Env vars copied from pod containers into the sidecar at injection.",
        },
        "resourcesPolicy": {
            "type": "object",
            "description": "Derives the sidecar's resources from the pod's containers at injection.",
            "properties": {
                "targetContainersMode": {
                    "type": "string",
                    "enum": values(TargetContainersMode),
                    "description": "How the resources of the target containers are combined.",
                },
                "targetContainersNameRegex": {
                    "type": "string",
                    "description": "Regular expression selecting the target containers by name.",
                },
                "resourcesExpr": {
                    "type": "object",
                    "description": "Expressions (+ - * / max() min()) for limits and requests.",
                    "properties": {"limits": copy.deepcopy(expr_pair), "requests": copy.deepcopy(expr_pair)},
                },
            },
        },
    }
    for name in extras:
        if name in schema["properties"]:
            raise SystemExit(f"core/v1 Container now has a field {name!r}: it clashes with SidecarContainer")
    schema["properties"].update(extras)
    return schema


def update_strategy(inl: Inliner) -> Schema:
    return {
        "type": "object",
        "description": "How pods that already carry the sidecars are upgraded when the SidecarSet changes.",
        "properties": {
            "type": {
                "type": "string",
                "enum": values(UpdateType),
                "description": "NotUpdate only injects new pods; RollingUpdate also upgrades injected pods.",
            },
            "paused": {"type": "boolean", "description": "Stops upgrading pods; injection goes on."},
            "selector": label_selector(inl, "Only pods matching this selector are upgraded."),
            "partition": {
                **int_or_string(),
                "description": "Number or percentage of matched pods kept on the old revision.",
            },
            "maxUnavailable": {
                **int_or_string(),
                "description": "Number or percentage (rounded up) of pods unavailable at once during an upgrade.",
            },
            "progressDeadlineSeconds": {
                "type": "integer",
                "format": "int32",
                "minimum": 1,
                "description": "sidecarctl extension: seconds an upgraded pod may take to be ready again. Past it "
                "the rollout stops itself (condition Progressing=False, reason ProgressDeadlineExceeded) until "
                "the spec changes or that condition is removed. Absent: no deadline.",
            },
            "priorityStrategy": {
                "type": "object",
                "description": "Order in which pods are upgraded: weightPriority or orderPriority, not both.",
                "properties": {
                    "weightPriority": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["weight", "matchSelector"],
                            "properties": {
                                "weight": {
                                    "type": "integer",
                                    "format": "int32",
                                    "description": "Weight, 1-100, added for pods that match.",
                                },
                                "matchSelector": label_selector(inl, "Pods this weight applies to."),
                            },
                        },
                    },
                    "orderPriority": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["orderedKey"],
                            "properties": {
                                "orderedKey": {
                                    "type": "string",
                                    "description": "Pod label whose trailing integer orders the pods.",
                                }
                            },
                        },
                    },
                },
                "x-kubernetes-validations": [
                    {
                        "rule": (
                            "!(has(self.weightPriority) && size(self.weightPriority) > 0 && "
                            "has(self.orderPriority) && size(self.orderPriority) > 0)"
                        ),
                        "message": "only one of weightPriority and orderPriority can be used",
                    }
                ],
            },
            "scatterStrategy": {
                "type": "array",
                "description": "Spreads pods with these label key=value pairs across upgrade batches.",
                "items": {
                    "type": "object",
                    "required": ["key", "value"],
                    "properties": {
                        "key": {"type": "string"},
                        "value": {"type": "string", "description": "A value, or * for every value."},
                    },
                },
            },
        },
        "x-kubernetes-validations": [
            {
                "rule": (
                    "!(has(self.type) && self.type == 'RollingUpdate' && has(self.selector) && "
                    "has(self.partition) && (type(self.partition) == string || self.partition != 0))"
                ),
                "message": "Partition and Selector cannot be used together",
                "fieldPath": ".partition",
            }
        ],
    }


def injection_strategy() -> Schema:
    return {
        "type": "object",
        "description": "Which revision new pods get.",
        "properties": {
            "paused": {"type": "boolean", "description": "Stops injecting into new pods."},
            "revision": {
                "type": "object",
                "description": "Injects a stored revision instead of the current spec.",
                "properties": {
                    "customVersion": {
                        "type": "string",
                        "description": "Revision labelled sidecarctl.io/sidecarset-custom-version=<value>.",
                    },
                    "revisionName": {"type": "string", "description": "Name of a ControllerRevision."},
                    "policy": {
                        "type": "string",
                        "enum": values(RevisionPolicy),
                        "description": "Always: every new pod; Partial: per updateStrategy selector/partition.",
                    },
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "has(self.revisionName) || has(self.customVersion)",
                        "message": "revisionName and customVersion cannot be empty simultaneously",
                    }
                ],
            },
        },
    }


def namespace_fields(inl: Inliner) -> Schema:
    """v1alpha1's `namespace` and `namespaceSelector` (and the legacy v1beta1 `specificNamespace`'s)."""
    return {
        "namespace": {
            "type": "string",
            "description": "Only pods in this namespace; overrides namespaceSelector.",
        },
        "namespaceSelector": label_selector(inl, "Only pods in matching namespaces; unset means all."),
    }


def v1beta1_namespace_fields(inl: Inliner) -> Schema:
    return {
        "specificNamespace": {
            "type": "object",
            "description": "Legacy, still read: use namespaceSelector. The namespaces whose pods are injected.",
            "minProperties": 1,
            "properties": namespace_fields(inl),
        },
        "namespaceSelector": label_selector(
            inl,
            "Only pods in matching namespaces; unset means all. One namespace: the label "
            "kubernetes.io/metadata.name (as Kruise 1.9).",
        ),
        "customVersion": {
            "type": "string",
            "description": "Custom version of this spec, put as a label on its ControllerRevisions.",
            "maxLength": 63,
            "pattern": LABEL_VALUE_PATTERN,
        },
    }


def overrides_schema(inl: Inliner) -> Schema:
    """`spec.overrides` (our extension, both versions): what pods may change of a sidecar by the
    annotation sidecarctl.io/overrides. The quantity checks (parse, min <= max) are the validating
    webhook's (sidecarsets.validation.overrides): CEL's quantity library is not on every supported minor."""
    quantity = inl.named(QUANTITY)
    bound: Schema = {
        "type": "object",
        "description": "The range a request and a limit of this resource may take (either end optional).",
        "minProperties": 1,
        "properties": {
            "min": {**copy.deepcopy(quantity), "description": "Smallest value a pod may ask for."},
            "max": {**copy.deepcopy(quantity), "description": "Largest value a pod may ask for."},
        },
    }
    return {
        "type": "array",
        "description": (
            "sidecarctl extension: what a pod may change of a sidecar with its annotation "
            f"{names.ANN_OVERRIDES}, within which bounds. Absent: nothing."
        ),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["containerName"],
        "maxItems": 256,
        "items": {
            "type": "object",
            "required": ["containerName"],
            "properties": {
                "containerName": {"type": "string", "description": "A sidecar of this SidecarSet."},
                "resources": {
                    "type": "object",
                    "description": "Per resource (cpu, memory): the range a request and a limit may take.",
                    "properties": {"cpu": copy.deepcopy(bound), "memory": copy.deepcopy(bound)},
                },
                "env": {
                    "type": "array",
                    "description": "Env var names a pod may set a value for (value only, no valueFrom).",
                    "x-kubernetes-list-type": "set",
                    "maxItems": 128,
                    "items": {"type": "string", "minLength": 1, "pattern": "^[ -<>-~]+$"},
                },
            },
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.resources) || has(self.env)",
                    "message": "an entry must allow resources or env (or both) to be overridden",
                }
            ],
        },
    }


def spec_schema(inl: Inliner, version: str) -> Schema:
    beta = version == names.VERSION_V1BETA1
    schema: Schema = {
        "type": "object",
        "description": f"Sidecars to inject, where, and how to upgrade them (OpenKruise SidecarSet {version}).",
        "properties": {
            "selector": label_selector(inl, "Pods to inject; required and not empty."),
            **(v1beta1_namespace_fields(inl) if beta else namespace_fields(inl)),
            "initContainers": {
                "type": "array",
                "description": "Injected at pod creation only, sorted by name.",
                "items": sidecar_container(inl, init=True),
            },
            "containers": {
                "type": "array",
                "description": "Sidecar containers, upgraded in place when their image changes.",
                "items": sidecar_container(inl, init=False),
            },
            "volumes": {
                "type": "array",
                "description": "Volumes the sidecars mount; added to the pod when referenced.",
                "items": inl.named(CORE + "Volume"),
            },
            "updateStrategy": update_strategy(inl),
            "injectionStrategy": injection_strategy(),
            "imagePullSecrets": {
                "type": "array",
                "description": "Pull secrets added to the pod at injection.",
                "items": inl.named(CORE + "LocalObjectReference"),
            },
            "overrides": overrides_schema(inl),
            "revisionHistoryLimit": {
                "type": "integer",
                "format": "int32",
                "description": "How many ControllerRevisions to keep (at least 1 is kept).",
            },
            "patchPodMetadata": {
                "type": "array",
                "description": "Annotations put on injected pods.",
                "items": {
                    "type": "object",
                    "properties": {
                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                        "patchPolicy": {
                            "type": "string",
                            "enum": values(PatchPolicy),
                            "description": (
                                "Retain keeps a pod's value, Overwrite replaces it, MergePatchJson merges JSON objects."
                            ),
                        },
                    },
                },
            },
        },
        "x-kubernetes-validations": [
            {
                "rule": (
                    "has(self.selector) && ("
                    "(has(self.selector.matchLabels) && size(self.selector.matchLabels) > 0) || "
                    "(has(self.selector.matchExpressions) && size(self.selector.matchExpressions) > 0))"
                ),
                "message": "selector must be set and must not be empty",
                "fieldPath": ".selector",
            },
            {
                "rule": (
                    "(has(self.containers) && size(self.containers) > 0) || "
                    "(has(self.initContainers) && size(self.initContainers) > 0)"
                ),
                "message": "no initContainer or container defined for SidecarSet",
            },
        ],
    }
    if beta:
        schema["x-kubernetes-validations"].append(
            {
                "rule": "!has(self.namespaceSelector) || !has(self.specificNamespace)",
                "message": "namespaceSelector and specificNamespace are mutually exclusive",
                "fieldPath": ".namespaceSelector",
            }
        )
    return schema


def status_schema() -> Schema:
    def count(description: str) -> Schema:
        return {"type": "integer", "format": "int32", "description": description}

    return {
        "type": "object",
        "description": "Observed state, written by the controller.",
        "required": ["matchedPods", "updatedPods", "readyPods"],
        "properties": {
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "Generation the status was computed for.",
            },
            "matchedPods": count("Pods the SidecarSet is injected into."),
            "updatedPods": count("Matched pods on the latest sidecar spec."),
            "readyPods": count("Matched pods that are ready."),
            "updatedReadyPods": count("Matched pods that are both updated and ready."),
            "latestRevision": {"type": "string", "description": "Name of the newest ControllerRevision."},
            "collisionCount": count("Hash collisions met while naming ControllerRevisions."),
            "conditions": {
                "type": "array",
                "description": "PolicyInjection: True when a MutatingAdmissionPolicy injects this SidecarSet "
                "(no webhook call), False with the reason the webhook serves it. PodsMissingSidecars: True "
                "while running pods it selects lack its sidecars (which and why in the message). Progressing "
                "(with updateStrategy.progressDeadlineSeconds): False, reason ProgressDeadlineExceeded, once "
                "the rollout stopped itself at observedGeneration.",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": {"type": "string"},
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": {"type": "string"},
                        "message": {"type": "string"},
                        "lastTransitionTime": {"type": "string", "format": "date-time"},
                        "observedGeneration": {"type": "integer", "format": "int64"},
                    },
                },
            },
        },
    }


def node_at(schema: Schema, path: str) -> Schema:
    """The sub-schema for a defaults-table path such as `spec.containers[].upgradeStrategy.type`."""
    node = schema
    for part in path.split("."):
        many = part.endswith("[]")
        node = node["properties"][part[:-2] if many else part]
        if many:
            node = node["items"]
    return node


def with_table_defaults(schema: Schema) -> Schema:
    """Every default of sidecarsets.spec.defaults that the schema can carry, put where it applies."""
    for row in defaults.DEFAULTS:
        if row.schema:
            node_at(schema, row.path)["default"] = copy.deepcopy(row.value)
    return schema


def root_schema(inl: Inliner, version: str) -> Schema:
    schema: Schema = {
        "type": "object",
        "description": "SidecarSet injects sidecar containers into matching pods and upgrades them in place.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "Versioned schema of this object."},
            "kind": {"type": "string", "description": "REST resource this object represents."},
            "metadata": {"type": "object"},
            "spec": spec_schema(inl, version),
            "status": status_schema(),
        },
    }
    return with_table_defaults(schema)


def conversion() -> Schema:
    """The manager converts between the versions; caBundle is left out (the manager or cainjector fills it)."""
    service = {
        "namespace": CONVERSION_SERVICE[0],
        "name": CONVERSION_SERVICE[1],
        "path": names.CONVERT_PATH,
        "port": 443,
    }
    return {
        "strategy": "Webhook",
        "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {"service": service}},
    }


def crd(inl: Inliner) -> Schema:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": names.CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
            },
            "scope": "Cluster",
            "conversion": conversion(),
            "versions": [version_entry(inl, version) for version in VERSIONS],
        },
    }


def namespaced_crd(inl: Inliner) -> Schema:
    """The NamespacedSidecarSet CRD: SidecarSet v1beta1 without its namespace fields, in a namespace."""
    entry = version_entry(inl, names.VERSION_V1BETA1)
    entry["storage"] = True
    root = entry["schema"]["openAPIV3Schema"]
    root["description"] = (
        "NamespacedSidecarSet injects sidecar containers into matching pods of its own namespace and upgrades "
        "them in place; written by the namespace's admins (they must be allowed to create pods there)."
    )
    spec = root["properties"]["spec"]
    for field in ("namespaceSelector", "specificNamespace"):
        del spec["properties"][field]
    spec["description"] = "Sidecars to inject into pods of this namespace, and how to upgrade them."
    spec["x-kubernetes-validations"] = [
        rule for rule in spec["x-kubernetes-validations"] if "specificNamespace" not in rule["rule"]
    ]
    kind = names.NAMESPACED_KIND
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": names.NAMESPACED_CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": names.NAMESPACED_PLURAL,
                "singular": kind.lower(),
                "shortNames": ["nscs"],
                "categories": ["sidecarctl"],
            },
            "scope": "Namespaced",
            "versions": [entry],
        },
    }


def version_entry(inl: Inliner, version: str) -> Schema:
    return {
        "name": version,
        "served": True,
        "storage": version == STORAGE_VERSION,
        "subresources": {"status": {}},
        "additionalPrinterColumns": [
            {
                "name": "MATCHED",
                "type": "integer",
                "jsonPath": ".status.matchedPods",
                "description": "The number of pods matched.",
            },
            {
                "name": "UPDATED",
                "type": "integer",
                "jsonPath": ".status.updatedPods",
                "description": "The number of pods matched and updated.",
            },
            {
                "name": "READY",
                "type": "integer",
                "jsonPath": ".status.readyPods",
                "description": "The number of pods matched and ready.",
            },
            {
                "name": "POLICY",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="PolicyInjection")].status',
                "description": "True: injected by a MutatingAdmissionPolicy, without a webhook call.",
            },
            {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        "schema": {"openAPIV3Schema": root_schema(inl, version)},
    }


class _Dumper(yaml.SafeDumper):
    """Never emit anchors/aliases: some CRD consumers do not resolve them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(document: Schema, *, namespaced: bool = False) -> str:
    header = (
        "# Generated by tools/gen_crd.py from the Kubernetes "
        f"v{KUBERNETES_VERSION} OpenAPI v3 document. Do not edit by hand.\n"
    )
    inl = Inliner(document)
    body = yaml.dump(
        namespaced_crd(inl) if namespaced else crd(inl), Dumper=_Dumper, sort_keys=True, width=100, allow_unicode=False
    )
    return header + "---\n" + body


def default_openapi_path() -> Path:
    root = os.environ.get("GOMODCACHE") or str(Path.home() / "go" / "pkg" / "mod")
    return Path(root) / f"k8s.io/kubernetes@v{KUBERNETES_VERSION}/api/openapi-spec/v3/api__v1_openapi.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--openapi", type=Path, default=None, help="kube-apiserver OpenAPI v3 document (api/v1)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--namespaced-output", type=Path, default=NAMESPACED_OUTPUT)
    parser.add_argument("--check", action="store_true", help="fail if --output is not up to date")
    args = parser.parse_args(argv)
    source: Path = args.openapi or default_openapi_path()
    try:
        document = json.loads(source.read_text())
    except (OSError, ValueError) as err:
        print(f"error: cannot read the OpenAPI document {source}: {err}", file=sys.stderr)
        return 2
    status = 0
    for output, namespaced in ((args.output, False), (args.namespaced_output, True)):
        text = render(document, namespaced=namespaced)
        if args.check:
            current = output.read_text() if output.exists() else ""
            if current != text:
                print(f"{output} is stale: run tools/gen_crd.py", file=sys.stderr)
                status = 1
            continue
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        print(f"wrote {output} ({len(text)} bytes)")
    return status


if __name__ == "__main__":
    sys.exit(main())
