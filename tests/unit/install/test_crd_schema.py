"""The SidecarSet CRD: structural, complete, and not pruning anything a Kruise user writes.

The key property is the last one: the API server silently drops every field its schema does not
name, so a gap in the schema deletes parts of users' sidecars without an error. The checker
below walks an object against the schema the way structural pruning does and lists what would
be dropped.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecarsets.spec import names
from sidecarsets.spec.defaults import DEFAULTS

REPO = Path(__file__).resolve().parents[3]
CRD_PATH = REPO / "config" / "crd" / "sidecarctl.io_sidecarsets.yaml"
OPENAPI = (
    Path(os.environ.get("GOMODCACHE") or Path.home() / "go" / "pkg" / "mod")
    / "k8s.io/kubernetes@v1.37.2/api/openapi-spec/v3/api__v1_openapi.json"
)

# A SidecarSet as written for OpenKruise (after the Kruise docs and API): a sidecar with volumes,
# transferEnv, a hot-upgraded proxy, an init container, and a rolling update with partition '30%'.
# Only `apiVersion` differs from what Kruise accepts.
KRUISE_SAMPLE_YAML = """
apiVersion: apps.kruise.io/v1alpha1
kind: SidecarSet
metadata:
  name: log-agent
  labels: {team: platform}
spec:
  namespace: shop
  selector:
    matchLabels: {app: web}
    matchExpressions:
    - {key: tier, operator: In, values: [frontend, backend]}
  containers:
  - name: log-agent
    image: registry.example.com/log-agent:1.0
    imagePullPolicy: IfNotPresent
    command: ["/bin/agent"]
    args: ["--config", "/etc/agent/agent.yaml"]
    env:
    - name: NODE
      valueFrom:
        fieldRef: {apiVersion: v1, fieldPath: spec.nodeName}
    - {name: LEVEL, value: info}
    ports:
    - {name: metrics, containerPort: 9100, protocol: TCP}
    resources:
      limits: {cpu: 200m, memory: 128Mi}
      requests: {cpu: "0.1", memory: 64Mi}
    livenessProbe:
      httpGet: {path: /healthz, port: metrics, scheme: HTTP}
      initialDelaySeconds: 5
    readinessProbe:
      tcpSocket: {port: 9100}
    lifecycle:
      preStop:
        exec: {command: [/bin/sh, -c, sleep 5]}
    securityContext:
      runAsNonRoot: true
      runAsUser: 1000
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
    volumeMounts:
    - {name: varlog, mountPath: /var/log, readOnly: true}
    - {name: agent-config, mountPath: /etc/agent}
    podInjectPolicy: AfterAppContainer
    upgradeStrategy: {upgradeType: ColdUpgrade}
    shareVolumePolicy: {type: enabled}
    transferEnv:
    - {sourceContainerName: main, envName: APP_NAME}
    - sourceContainerNameFrom:
        fieldRef: {apiVersion: v1, fieldPath: "metadata.labels['app-container']"}
      envNames: [TZ, LANG]
  - name: envoy
    image: envoyproxy/envoy:v1.30.0
    upgradeStrategy:
      upgradeType: HotUpgrade
      hotUpgradeEmptyImage: envoyproxy/envoy-empty:v1
    shareVolumeDevicePolicy: {type: disabled}
    resourcesPolicy:
      targetContainersMode: sum
      targetContainersNameRegex: ^app.*$
      resourcesExpr:
        limits: {cpu: "max(cpu*50%, 50m)", memory: 200Mi}
        requests: {cpu: 50m, memory: 100Mi}
  initContainers:
  - name: init-config
    image: busybox:1.36
    command: [sh, -c, cp /src/* /etc/agent/]
    volumeMounts:
    - {name: agent-config, mountPath: /etc/agent}
  volumes:
  - name: varlog
    hostPath: {path: /var/log, type: Directory}
  - name: agent-config
    emptyDir: {medium: Memory, sizeLimit: 16Mi}
  - name: agent-secret
    projected:
      defaultMode: 420
      sources:
      - secret:
          name: agent-token
          items: [{key: token, path: token}]
      - configMap: {name: agent-ca}
      - downwardAPI:
          items:
          - path: labels
            fieldRef: {fieldPath: metadata.labels}
      - serviceAccountToken: {audience: agent, expirationSeconds: 3600, path: sa-token}
  - name: scratch
    ephemeral:
      volumeClaimTemplate:
        metadata:
          labels: {purpose: scratch}
        spec:
          accessModes: [ReadWriteOnce]
          storageClassName: fast
          resources:
            requests: {storage: 1Gi}
  updateStrategy:
    type: RollingUpdate
    partition: '30%'
    maxUnavailable: 20%
    priorityStrategy:
      weightPriority:
      - weight: 50
        matchSelector:
          matchLabels: {canary: "true"}
    scatterStrategy:
    - {key: zone, value: a}
  injectionStrategy:
    paused: false
    revision: {customVersion: v2, policy: Partial}
  imagePullSecrets:
  - name: regcred
  revisionHistoryLimit: 5
  patchPodMetadata:
  - annotations:
      oom-score: '{"log-agent": 1}'
    patchPolicy: MergePatchJson
  - annotations:
      example.com/agent: enabled
status:
  observedGeneration: 3
  matchedPods: 10
  updatedPods: 7
  readyPods: 9
  updatedReadyPods: 6
  latestRevision: log-agent-6d9f8c7b5
  collisionCount: 0
"""


def kruise_sample() -> dict[str, Any]:
    """The Kruise manifest with only its apiVersion changed."""
    doc: dict[str, Any] = yaml.safe_load(KRUISE_SAMPLE_YAML)
    doc["apiVersion"] = names.API_VERSION
    return doc


@functools.cache
def load_crd() -> dict[str, Any]:
    """Parsed once per session (it is large); callers must not modify it."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = [d for d in yaml.load_all(CRD_PATH.read_text(), Loader=loader) if d]
    assert len(docs) == 1
    crd: dict[str, Any] = docs[0]
    return crd


def version_entry(version: str = names.VERSION) -> dict[str, Any]:
    """The CRD's entry for `version` (v1alpha1 unless told; tests/unit/install/test_crd_versions.py
    compares the two)."""
    versions = {v["name"]: v for v in load_crd()["spec"]["versions"]}
    assert set(versions) == {names.VERSION, names.VERSION_V1BETA1}
    entry: dict[str, Any] = versions[version]
    return entry


def root_schema(version: str = names.VERSION) -> dict[str, Any]:
    schema: dict[str, Any] = version_entry(version)["schema"]["openAPIV3Schema"]
    return schema


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def at(schema: dict[str, Any], dotted: str) -> dict[str, Any]:
    """Sub-schema for `a.b[].c` style paths."""
    node = schema
    for part in dotted.split("."):
        node = node["properties"][part[:-2]]["items"] if part.endswith("[]") else node["properties"][part]
    return node


# --- the pruning checker ----------------------------------------------------------------------


def schema_problems(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """What structural pruning would drop from `value`, plus values of the wrong type.

    Follows apiextensions: unknown fields of an object are pruned unless the schema preserves
    them or has additionalProperties; int-or-string takes integers and strings only.
    """
    problems: list[str] = []
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            problems.append(f"{path}: {value!r} is not an integer or a string")
        elif isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append(f"{path}: {value!r} does not match {schema['pattern']}")
        return problems
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {value!r}"]
        props = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, sub in value.items():
            if key in props:
                problems += schema_problems(sub, props[key], f"{path}.{key}")
            elif isinstance(additional, dict):
                problems += schema_problems(sub, additional, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and additional is not True:
                problems.append(f"{path}.{key}: pruned (not in the schema)")
        for key in schema.get("required") or []:
            if key not in value:
                problems.append(f"{path}.{key}: required")
    elif kind == "array":
        if not isinstance(value, list):
            return [f"{path}: expected an array, got {value!r}"]
        for i, item in enumerate(value):
            problems += schema_problems(item, schema["items"], f"{path}[{i}]")
    elif kind == "string":
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string, got {value!r}")
        elif "enum" in schema and value not in schema["enum"]:
            problems.append(f"{path}: {value!r} not in {schema['enum']}")
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{path}: expected an integer, got {value!r}")
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"{path}: expected a number, got {value!r}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            problems.append(f"{path}: expected a boolean, got {value!r}")
    elif not schema.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: schema has no type")
    return problems


def object_problems(obj: dict[str, Any]) -> list[str]:
    schema = root_schema()
    # metadata is handled by the API server itself, not by the CRD schema.
    rest = {k: v for k, v in obj.items() if k != "metadata"}
    return schema_problems(rest, schema, "")


def words(text: str) -> list[str]:
    return text.split()


# --- tests ------------------------------------------------------------------------------------


def test_crd_identity() -> None:
    crd = load_crd()
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{names.PLURAL}.{names.GROUP}"
    spec = crd["spec"]
    assert spec["group"] == names.GROUP
    assert spec["scope"] == "Cluster"
    assert spec["names"]["kind"] == names.KIND
    assert spec["names"]["plural"] == names.PLURAL
    assert spec["names"]["singular"] == "sidecarset"
    assert spec["names"]["shortNames"]
    assert not {"ss", "sts", "sa", "svc", "cs", "po"} & set(spec["names"]["shortNames"])
    entry = version_entry()
    assert entry["name"] == names.VERSION
    assert entry["served"] is True and entry["storage"] is True
    assert entry["subresources"] == {"status": {}}


@pytest.mark.parametrize("version", [names.VERSION, names.VERSION_V1BETA1])
def test_printer_columns(version: str) -> None:
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in version_entry(version)["additionalPrinterColumns"]}
    assert columns == {
        "MATCHED": ("integer", ".status.matchedPods"),
        "UPDATED": ("integer", ".status.updatedPods"),
        "READY": ("integer", ".status.readyPods"),
        "POLICY": ("string", '.status.conditions[?(@.type=="PolicyInjection")].status'),
        "AGE": ("date", ".metadata.creationTimestamp"),
    }


def test_kustomization_lists_the_crd() -> None:
    kustomization = yaml.safe_load((CRD_PATH.parent / "kustomization.yaml").read_text())
    assert kustomization["resources"] == [CRD_PATH.name, "sidecarctl.io_namespacedsidecarsets.yaml"]


def test_schema_is_structural() -> None:
    root = root_schema()
    assert root["type"] == "object"
    assert "additionalProperties" not in root
    assert root["properties"]["metadata"] == {"type": "object"}
    problems = []
    for path, node in walk(root):
        if "$ref" in node or "oneOf" in node or "nullable" in node or "not" in node:
            problems.append(f"{path}: keyword not allowed in a structural schema")
        if node.get("x-kubernetes-int-or-string"):
            if node.get("anyOf") != [{"type": "integer"}, {"type": "string"}] or "type" in node:
                problems.append(f"{path}: int-or-string must be anyOf integer/string without a type")
        elif "anyOf" in node or "allOf" in node:
            problems.append(f"{path}: anyOf/allOf only for int-or-string")
        elif "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            problems.append(f"{path}: no type")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{path}: array without items")
        if path and "metadata" in (node.get("properties") or {}) and not path.endswith(".volumeClaimTemplate"):
            problems.append(f"{path}: unexpected nested metadata")
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                if key not in item.get("required", []) and "default" not in item["properties"][key]:
                    problems.append(f"{path}: list-map key {key} is neither required nor defaulted")
        elif "x-kubernetes-list-map-keys" in node:
            problems.append(f"{path}: list-map keys without list-type map")
        if node.get("x-kubernetes-list-type") == "set" and node["items"].get("type") not in (
            "string",
            "integer",
            "number",
            "boolean",
        ):
            problems.append(f"{path}: list-type set needs scalar items")
        for key in node.get("required") or []:
            if key not in (node.get("properties") or {}):
                problems.append(f"{path}: required {key} is not a property")
    assert problems == []
    assert "$ref" not in CRD_PATH.read_text()


def test_fits_in_a_last_applied_annotation() -> None:
    # Client-side `kubectl apply` stores the object in an annotation, capped at 256 KiB.
    assert len(json.dumps(load_crd(), separators=(",", ":"))) < 256 * 1024


KRUISE_FIELDS = words(
    """
spec.selector.matchLabels spec.selector.matchExpressions[].key spec.selector.matchExpressions[].operator
spec.selector.matchExpressions[].values spec.namespace spec.namespaceSelector.matchLabels
spec.namespaceSelector.matchExpressions
spec.containers[].podInjectPolicy spec.containers[].upgradeStrategy.upgradeType
spec.containers[].upgradeStrategy.hotUpgradeEmptyImage spec.containers[].shareVolumePolicy.type
spec.containers[].shareVolumeDevicePolicy.type spec.containers[].transferEnv[].sourceContainerName
spec.containers[].transferEnv[].sourceContainerNameFrom.fieldRef.fieldPath
spec.containers[].transferEnv[].sourceContainerNameFrom.fieldRef.apiVersion
spec.containers[].transferEnv[].envName spec.containers[].transferEnv[].envNames
spec.containers[].resourcesPolicy.targetContainersMode spec.containers[].resourcesPolicy.targetContainersNameRegex
spec.containers[].resourcesPolicy.resourcesExpr.limits.cpu spec.containers[].resourcesPolicy.resourcesExpr.limits.memory
spec.containers[].resourcesPolicy.resourcesExpr.requests.cpu
spec.containers[].resourcesPolicy.resourcesExpr.requests.memory
spec.initContainers[].podInjectPolicy spec.initContainers[].upgradeStrategy.upgradeType
spec.initContainers[].transferEnv[].envName spec.initContainers[].restartPolicy
spec.volumes[].name spec.updateStrategy.type spec.updateStrategy.paused spec.updateStrategy.selector
spec.updateStrategy.partition spec.updateStrategy.maxUnavailable
spec.updateStrategy.priorityStrategy.weightPriority[].weight
spec.updateStrategy.priorityStrategy.weightPriority[].matchSelector
spec.updateStrategy.priorityStrategy.orderPriority[].orderedKey
spec.updateStrategy.scatterStrategy[].key spec.updateStrategy.scatterStrategy[].value
spec.injectionStrategy.paused spec.injectionStrategy.revision.customVersion
spec.injectionStrategy.revision.revisionName spec.injectionStrategy.revision.policy
spec.imagePullSecrets[].name spec.revisionHistoryLimit spec.patchPodMetadata[].annotations
spec.patchPodMetadata[].patchPolicy
status.observedGeneration status.matchedPods status.updatedPods status.readyPods status.updatedReadyPods
status.latestRevision status.collisionCount
"""
)

CONTAINER_FIELDS = words(
    """
name image command args workingDir ports envFrom env resources resizePolicy restartPolicy
restartPolicyRules volumeMounts volumeDevices livenessProbe readinessProbe startupProbe lifecycle
terminationMessagePath terminationMessagePolicy imagePullPolicy securityContext stdin stdinOnce tty
"""
)

VOLUME_SOURCES = words(
    """
hostPath emptyDir gcePersistentDisk awsElasticBlockStore gitRepo secret nfs iscsi glusterfs
persistentVolumeClaim rbd flexVolume cinder cephfs flocker downwardAPI fc azureFile configMap
vsphereVolume quobyte azureDisk photonPersistentDisk projected portworxVolume scaleIO storageos csi
ephemeral image
"""
)


@pytest.mark.parametrize("dotted", KRUISE_FIELDS)
def test_every_kruise_field_is_in_the_schema(dotted: str) -> None:
    assert at(root_schema(), dotted)


@pytest.mark.parametrize("which", ["containers", "initContainers"])
def test_sidecar_containers_carry_the_whole_core_container(which: str) -> None:
    item = at(root_schema(), f"spec.{which}[]")
    assert set(CONTAINER_FIELDS) <= set(item["properties"])
    assert item["required"] == ["name"]
    # Deep fields that hand-written schemas tend to miss.
    assert at(item, "securityContext.appArmorProfile.type")["type"] == "string"
    assert at(item, "lifecycle.preStop.sleep.seconds")["type"] == "integer"
    assert at(item, "livenessProbe.grpc.port")["type"] == "integer"
    assert at(item, "resources.claims[].name")["type"] == "string"
    assert at(item, "env[].valueFrom.secretKeyRef.key")["type"] == "string"


def test_volumes_carry_every_core_volume_source() -> None:
    volume = at(root_schema(), "spec.volumes[]")
    assert set(VOLUME_SOURCES) <= set(volume["properties"])
    assert volume["required"] == ["name"]
    template = at(volume, "ephemeral.volumeClaimTemplate")
    assert set(template["properties"]["metadata"]["properties"]) >= {"labels", "annotations"}


def test_quantities_and_int_or_strings_follow_controller_gen() -> None:
    root = root_schema()
    limits = at(root, "spec.containers[].resources.limits")["additionalProperties"]
    assert limits["x-kubernetes-int-or-string"] is True
    assert limits["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert re.search(limits["pattern"], "500m") and not re.search(limits["pattern"], "lots")
    port = at(root, "spec.containers[].livenessProbe.httpGet.port")
    assert port["x-kubernetes-int-or-string"] is True and "pattern" not in port
    for field in ("partition", "maxUnavailable"):
        assert at(root, f"spec.updateStrategy.{field}")["x-kubernetes-int-or-string"] is True


def test_kubernetes_only_extensions_are_gone() -> None:
    text = CRD_PATH.read_text()
    for keyword in ("x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key", "x-kubernetes-unions"):
        assert keyword not in text


def test_duplicate_env_names_and_ports_stay_accepted() -> None:
    container = at(root_schema(), "spec.containers[]")
    for field in ("env", "ports"):
        assert container["properties"][field]["x-kubernetes-list-type"] == "atomic"
    mounts = container["properties"]["volumeMounts"]
    assert mounts["x-kubernetes-list-type"] == "map" and mounts["x-kubernetes-list-map-keys"] == ["mountPath"]


SCHEMA_DEFAULTS = {
    "spec.containers[].shareVolumePolicy.type": "disabled",
    "spec.containers[].upgradeStrategy.upgradeType": "ColdUpgrade",
    "spec.initContainers[].shareVolumePolicy.type": "disabled",
    "spec.initContainers[].upgradeStrategy.upgradeType": "ColdUpgrade",
    "spec.updateStrategy.type": "RollingUpdate",
    "spec.updateStrategy.partition": 0,
    "spec.updateStrategy.maxUnavailable": 1,
    "spec.revisionHistoryLimit": 10,
    "spec.patchPodMetadata[].patchPolicy": "Retain",
    "spec.injectionStrategy.revision.policy": "Always",
    "spec.containers[].resourcesPolicy.targetContainersNameRegex": ".*",
}


@pytest.mark.parametrize(("dotted", "value"), SCHEMA_DEFAULTS.items())
def test_schema_defaults(dotted: str, value: Any) -> None:
    assert at(root_schema(), dotted)["default"] == value


def test_only_intended_defaults_exist() -> None:
    """Nested Kubernetes defaults would rewrite users' objects; only ours may be present."""
    found = {path for path, node in walk(root_schema()) if "default" in node}
    intended = {"." + p for p in SCHEMA_DEFAULTS} | {
        ".spec.updateStrategy",
        ".spec.containers[].upgradeStrategy",
        ".spec.containers[].shareVolumePolicy",
        ".spec.initContainers[].upgradeStrategy",
        ".spec.initContainers[].shareVolumePolicy",
        ".spec.containers[].shareVolumeDevicePolicy.type",
        ".spec.initContainers[].shareVolumeDevicePolicy.type",
        ".spec.initContainers[].resourcesPolicy.targetContainersNameRegex",
    }
    assert found == intended


def test_pod_inject_policy_is_enumerated_but_not_defaulted() -> None:
    for which in ("containers", "initContainers"):
        policy = at(root_schema(), f"spec.{which}[].podInjectPolicy")
        assert "default" not in policy
        assert policy["enum"] == ["BeforeAppContainer", "AfterAppContainer"]


@pytest.mark.parametrize(
    ("dotted", "values"),
    [
        ("spec.containers[].upgradeStrategy.upgradeType", ["ColdUpgrade", "HotUpgrade"]),
        ("spec.containers[].shareVolumePolicy.type", ["enabled", "disabled"]),
        ("spec.updateStrategy.type", ["NotUpdate", "RollingUpdate"]),
        ("spec.injectionStrategy.revision.policy", ["Always", "Partial"]),
        ("spec.patchPodMetadata[].patchPolicy", ["Retain", "Overwrite", "MergePatchJson"]),
        ("spec.containers[].resourcesPolicy.targetContainersMode", ["sum", "max"]),
    ],
)
def test_enums(dotted: str, values: list[str]) -> None:
    assert at(root_schema(), dotted)["enum"] == values


CEL_RULES = {
    "spec": ["selector must be set", "no initContainer or container defined"],
    "spec.updateStrategy": ["Partition and Selector cannot be used together"],
    "spec.updateStrategy.priorityStrategy": ["only one of weightPriority and orderPriority"],
    "spec.injectionStrategy.revision": ["revisionName and customVersion cannot be empty"],
    "spec.overrides[]": ["must allow resources or env"],
    "spec.containers[].transferEnv[]": ["envName or envNames", "sourceContainerName or sourceContainerNameFrom"],
    "spec.initContainers[].transferEnv[]": ["envName or envNames", "sourceContainerName or sourceContainerNameFrom"],
}


@pytest.mark.parametrize(("dotted", "messages"), CEL_RULES.items())
def test_cel_rules_present(dotted: str, messages: list[str]) -> None:
    node = at(root_schema(), dotted) if dotted != "spec" else root_schema()["properties"]["spec"]
    rules = node["x-kubernetes-validations"]
    for message in messages:
        assert any(message in r["message"] for r in rules), message


def test_cel_rules_name_only_fields_of_their_schema() -> None:
    """A rule about a field the schema does not have is rejected by the API server."""
    for path, node in walk(root_schema()):
        for rule in node.get("x-kubernetes-validations") or []:
            for chain in re.findall(r"self((?:\.\w+)+)", rule["rule"]):
                sub = node
                for name in chain.strip(".").split("."):
                    assert name in sub.get("properties", {}), f"{path}: {rule['rule']} names {name}"
                    sub = sub["properties"][name]
            if "fieldPath" in rule:
                assert rule["fieldPath"].lstrip(".") in node["properties"]


def test_kruise_sample_is_not_pruned() -> None:
    assert object_problems(kruise_sample()) == []


def test_kruise_sample_only_needs_the_api_version_changed() -> None:
    original = yaml.safe_load(KRUISE_SAMPLE_YAML)
    converted = kruise_sample()
    assert original["apiVersion"] == names.KRUISE_API_VERSION
    assert {k: v for k, v in converted.items() if k != "apiVersion"} == {
        k: v for k, v in original.items() if k != "apiVersion"
    }


def test_the_checker_reports_what_pruning_drops() -> None:
    obj = kruise_sample()
    obj["spec"]["containers"][0]["futureField"] = 1
    obj["spec"]["volumes"][0]["hostPath"]["bogus"] = "x"
    obj["spec"]["updateStrategy"]["partition"] = 1.5
    assert object_problems(obj) == [
        ".spec.containers[0].futureField: pruned (not in the schema)",
        ".spec.volumes[0].hostPath.bogus: pruned (not in the schema)",
        ".spec.updateStrategy.partition: 1.5 is not an integer or a string",
    ]


def test_a_pod_worth_of_fields_survives() -> None:
    """Rarely used Container and Volume fields, all of which must survive pruning."""
    obj = kruise_sample()
    sidecar = obj["spec"]["containers"][0]
    sidecar.update(
        {
            "workingDir": "/work",
            "stdin": True,
            "stdinOnce": False,
            "tty": True,
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "cfg", "optional": True}}],
            "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
            "volumeDevices": [{"name": "raw", "devicePath": "/dev/xvda"}],
            "startupProbe": {"exec": {"command": ["true"]}, "failureThreshold": 30},
        }
    )
    sidecar["securityContext"].update(
        {
            "appArmorProfile": {"type": "Localhost", "localhostProfile": "p"},
            "seLinuxOptions": {"level": "s0:c123,c456"},
            "windowsOptions": {"runAsUserName": "ContainerUser"},
            "procMount": "Default",
        }
    )
    obj["spec"]["volumes"] += [
        {"name": "csi", "csi": {"driver": "d", "volumeAttributes": {"a": "b"}}},
        {"name": "pvc", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
        {"name": "img", "image": {"reference": "registry/x:1", "pullPolicy": "IfNotPresent"}},
        {"name": "cm", "configMap": {"name": "c", "items": [{"key": "k", "path": "p", "mode": 256}]}},
    ]
    assert object_problems(obj) == []


@pytest.mark.skipif(not OPENAPI.exists(), reason="Kubernetes OpenAPI document not in the Go module cache")
def test_committed_crd_is_what_the_generator_produces() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_crd.py"), "--openapi", str(OPENAPI), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(not OPENAPI.exists(), reason="Kubernetes OpenAPI document not in the Go module cache")
def test_every_core_container_field_is_kept() -> None:
    document = json.loads(OPENAPI.read_text())
    core = document["components"]["schemas"]["io.k8s.api.core.v1.Container"]["properties"]
    volume = document["components"]["schemas"]["io.k8s.api.core.v1.Volume"]["properties"]
    assert set(core) <= set(at(root_schema(), "spec.containers[]")["properties"])
    assert set(volume) <= set(at(root_schema(), "spec.volumes[]")["properties"])


def test_sample_is_not_modified_by_the_checker() -> None:
    obj = kruise_sample()
    before = copy.deepcopy(obj)
    object_problems(obj)
    assert obj == before


def test_the_schema_carries_every_default_of_the_table_and_no_other() -> None:
    """sidecarsets.spec.defaults is the one table: the CRD has exactly its schema rows."""
    table = {"." + row.path: row.value for row in DEFAULTS if row.schema}
    found = {path: node["default"] for path, node in walk(root_schema()) if "default" in node}
    assert found == table
    assert {"." + p for p in SCHEMA_DEFAULTS} <= set(table)
    assert all(row.path.endswith("podInjectPolicy") for row in DEFAULTS if not row.schema)


def test_overrides_survive_pruning_in_both_versions_and_are_keyed_by_container() -> None:
    """spec.overrides is our extension: nothing of it may be pruned, in either served version."""
    overrides = [
        {"containerName": "sidecar1", "resources": {"cpu": {"min": "50m", "max": 2}, "memory": {"max": "2Gi"}}},
        {"containerName": "sidecar2", "env": ["LOG_LEVEL", "DEBUG.x"]},
    ]
    for version in (names.VERSION, names.VERSION_V1BETA1):
        spec = {**kruise_sample()["spec"], "overrides": overrides}
        spec.pop("namespace", None)
        schema = root_schema(version)["properties"]["spec"]
        assert schema_problems(spec, schema, ".spec") == [], version
        field = schema["properties"]["overrides"]
        assert field["x-kubernetes-list-type"] == "map" and field["x-kubernetes-list-map-keys"] == ["containerName"]
        bound = at(root_schema(version), "spec.overrides[].resources.cpu")
        assert bound["minProperties"] == 1 and bound["properties"]["max"]["x-kubernetes-int-or-string"] is True
        env = at(root_schema(version), "spec.overrides[].env")
        assert re.search(env["items"]["pattern"], "LOG_LEVEL") and not re.search(env["items"]["pattern"], "A=B")
    bad = {**kruise_sample()["spec"], "overrides": [{"containerName": "s", "resources": {"gpu": {"max": "1"}}}]}
    assert schema_problems(bad, root_schema()["properties"]["spec"], ".spec") == [
        ".spec.overrides[0].resources.gpu: pruned (not in the schema)"
    ]
