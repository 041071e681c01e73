"""Names fixed by the public contract: other people's tests and manifests rely on them.

Kept in one module so a rename is one edit and a grep finds every use.
"""

from __future__ import annotations

from collections.abc import Mapping

GROUP = "sidecarctl.io"
# The version the manager reads and writes, and the CRD's storage version (README: storage version).
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
# Kruise 1.9's shape, served beside v1alpha1 and converted by the manager at CONVERT_PATH.
VERSION_V1BETA1 = "v1beta1"
API_VERSION_V1BETA1 = f"{GROUP}/{VERSION_V1BETA1}"
KIND = "SidecarSet"
PLURAL = "sidecarsets"
CRD_NAME = f"{PLURAL}.{GROUP}"
# Tenant SidecarSets: namespaced, v1beta1 only, selecting pods of their own namespace. A pod's
# annotations key one as `<namespace>/<name>` (sidecarset_key), which no cluster SidecarSet name can
# be (a name has no "/"), so `shop/mesh` and a cluster `mesh` never share an entry.
NAMESPACED_KIND = "NamespacedSidecarSet"
NAMESPACED_PLURAL = "namespacedsidecarsets"
NAMESPACED_CRD_NAME = f"{NAMESPACED_PLURAL}.{GROUP}"
# Namespace label: `disabled` refuses NamespacedSidecarSets there and stops their injection.
NS_NAMESPACED_SIDECARSETS_LABEL = "sidecarctl.io/namespaced-sidecarsets"
NS_NAMESPACED_SIDECARSETS_DISABLED = "disabled"
# NamespacedSidecarSet status condition: a cluster SidecarSet owns some of its names in its pods.
CONDITION_CLUSTER_CONFLICT = "ClusterSidecarSetConflict"
KRUISE_GROUP = "apps.kruise.io"
KRUISE_API_VERSION = f"{KRUISE_GROUP}/{VERSION}"
KRUISE_API_VERSION_V1BETA1 = f"{KRUISE_GROUP}/{VERSION_V1BETA1}"

# Namespace label that turns injection on; only this exact value counts.
NS_INJECTION_LABEL = "sidecar-injection"
NS_INJECTION_ENABLED = "enabled"
NS_NAME_LABEL = "kubernetes.io/metadata.name"

# Pod-level opt out and the marker put on every injected pod (the controller watches by it).
POD_INJECT_LABEL = "sidecarctl.io/inject"
POD_INJECTED_LABEL = "sidecarctl.io/injected"

ANN_HASH = "sidecarctl.io/sidecarset-hash"
ANN_HASH_WITHOUT_IMAGE = "sidecarctl.io/sidecarset-hash-without-image"
ANN_INJECTED_LIST = "sidecarctl.io/sidecarset-injected-list"
ANN_INPLACE_STATE = "sidecarctl.io/inplace-update-state"
ANN_DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
# How a pod got its sidecars: "policy" (a MutatingAdmissionPolicy) or "webhook" (/inject, or the CLI).
ANN_INJECTED_BY = "sidecarctl.io/injected-by"
# Per-pod overrides: the pod asks by this annotation (JSON: container -> {resources, env}) for what its
# SidecarSets' `spec.overrides` allow; injection records the env values it applied in the second one
# ({container: {NAME: value}}), which a running container cannot change (the controller compares them).
ANN_OVERRIDES = "sidecarctl.io/overrides"
ANN_OVERRIDES_ENV_APPLIED = "sidecarctl.io/overrides-env-applied"
# HotUpgrade bookkeeping on the pod (Kruise's, under our prefix): which of `<n>-1` / `<n>-2` serves,
# and each container's version and its partner's (read by the containers as SIDECARSET_VERSION[_ALT]).
ANN_WORKING_HOT = "sidecarctl.io/sidecarset-working-hotupgrade-container"
ANN_VERSION_PREFIX = "version.sidecarset.sidecarctl.io/"
ANN_VERSION_ALT_PREFIX = "versionalt.sidecarset.sidecarctl.io/"
ENV_SIDECARSET_VERSION = "SIDECARSET_VERSION"
ENV_SIDECARSET_VERSION_ALT = "SIDECARSET_VERSION_ALT"
# On a SidecarSet: `webhook` keeps it on the webhook even where a MutatingAdmissionPolicy could serve it.
ANN_INJECTION_PATH = "sidecarctl.io/injection-path"
# "enforce": a SidecarSet whose sidecars a selected namespace's enforced Pod Security level would refuse
# is itself refused (the default only warns).
ANN_POD_SECURITY = "sidecarctl.io/pod-security"
INJECTED_BY_POLICY = "policy"
INJECTED_BY_WEBHOOK = "webhook"
# On a SidecarSet: "true" together with a base name makes it a canary, which replaces that base
# SidecarSet in the pods the canary selects (Kruise's apps.kruise.io/sidecarset-canary and -base).
ANN_CANARY = "sidecarctl.io/sidecarset-canary"
ANN_BASE = "sidecarctl.io/sidecarset-base"
# SidecarSet status condition: whether MutatingAdmissionPolicies inject it, or why the webhook must.
CONDITION_POLICY_INJECTION = "PolicyInjection"
CONDITION_MISSING_SIDECARS = "PodsMissingSidecars"
CONDITION_PROGRESSING = "Progressing"
CONDITION_POD_SECURITY = "PodSecurity"
REASON_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
REASON_RESIZE_INFEASIBLE = "ResizeInfeasible"  # Progressing: pods whose node cannot fit a resize

# SidecarSet-side annotations, as Kruise keeps them on the SidecarSet object.
SS_ANN_HASH = "sidecarctl.io/sidecarset-hash"
SS_ANN_HASH_WITHOUT_IMAGE = "sidecarctl.io/sidecarset-hash-without-image"
# Kruise v1alpha1 keeps a SidecarSet's custom version in this label (v1beta1: spec.customVersion).
SS_LABEL_CUSTOM_VERSION = "sidecarctl.io/sidecarset-custom-version"
# What a v1alpha1 object keeps of a v1beta1 one that v1alpha1 has no field for (sidecarsets.spec.conversion).
# Reserved: a v1beta1 object may not carry annotations under this prefix.
CONVERSION_ANNOTATION_PREFIX = "conversion.sidecarctl.io/"
# Written by an earlier version when v1beta1 had two selector spellings; dropped when read now.
ANN_CONVERSION_SELECTOR_AT = CONVERSION_ANNOTATION_PREFIX + "namespace-selector-at"
# The v1beta1 object's own SS_LABEL_CUSTOM_VERSION label (a plain label there), when it has one.
ANN_CONVERSION_VERSION_LABEL = CONVERSION_ANNOTATION_PREFIX + "custom-version-label"
# ControllerRevisions carry the SidecarSet name in this label.
REVISION_LABEL_SIDECARSET = "sidecarctl.io/sidecarset-name"

ENV_IS_INJECTED = "IS_INJECTED"
POD_CONDITION_UPGRADABLE = "SidecarSetUpgradable"

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
DEFAULT_MANAGER_NAMESPACE = "sidecarctl-system"

MUTATING_WEBHOOK_CONFIG = "sidecarctl-injector"
MUTATING_WEBHOOK_NAME = "inject.sidecarctl.io"
VALIDATING_WEBHOOK_CONFIG = "sidecarctl-validator"
INJECT_PATH = "/inject"
VALIDATE_PATH = "/validate-sidecarset"
CONVERT_PATH = "/convert"


def sidecarset_key(name: str, namespace: str = "") -> str:
    """How a SidecarSet is named in pod annotations, hashes, metrics and the caches: a cluster one by
    its name, a NamespacedSidecarSet as `<namespace>/<name>`."""
    return f"{namespace}/{name}" if namespace else name


def namespaced_sidecarsets_disabled(labels: Mapping[str, str] | None) -> bool:
    """Whether a namespace with these labels turned NamespacedSidecarSets off (unknown labels: off too)."""
    return labels is None or labels.get(NS_NAMESPACED_SIDECARSETS_LABEL) == NS_NAMESPACED_SIDECARSETS_DISABLED
