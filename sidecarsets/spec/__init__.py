"""The SidecarSet API as data: the one model and everything that reads, defaults, converts or names it.

The model (model, reading: strict for admission, tolerant for objects read back), Kruise's defaults
and enums, the update and injection strategies, sidecar containers and their HotUpgrade pairs,
patchPodMetadata, resourcesPolicy, v1alpha1 <-> v1beta1 conversion, the hashes, label selectors,
the ControllerRevision semantics and the names fixed by the contract. Pure functions only. May
import `sidecarsets.values` and kuberuntime's JSON types; never pods, rollout or controller.
"""
