"""Names fixed by the public contract: other people's tests and manifests rely on them.

Kept in one module so a rename is one edit and a grep finds every use.
"""

from __future__ import annotations

GROUP = "sidecarctl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "SidecarSet"
PLURAL = "sidecarsets"
KRUISE_API_VERSION = "apps.kruise.io/v1alpha1"

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
# On a SidecarSet: `webhook` keeps it on the webhook even where a MutatingAdmissionPolicy could serve it.
ANN_INJECTION_PATH = "sidecarctl.io/injection-path"
INJECTED_BY_POLICY = "policy"
INJECTED_BY_WEBHOOK = "webhook"
# SidecarSet status condition: whether MutatingAdmissionPolicies inject it, or why the webhook must.
CONDITION_POLICY_INJECTION = "PolicyInjection"

# SidecarSet-side annotations, as Kruise keeps them on the SidecarSet object.
SS_ANN_HASH = "sidecarctl.io/sidecarset-hash"
SS_ANN_HASH_WITHOUT_IMAGE = "sidecarctl.io/sidecarset-hash-without-image"
# Kruise v1alpha1 keeps a SidecarSet's custom version in this label.
SS_LABEL_CUSTOM_VERSION = "sidecarctl.io/sidecarset-custom-version"
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
