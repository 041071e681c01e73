"""`sidecarctl check-inject`: why a pod was (or was not) injected, and whether its sidecars are
current, like `istioctl x check-inject`.

Reads the pods (one, a label selector's, or a workload's: its spec.selector; its pod template when
it has none), every SidecarSet, the namespaces, our MutatingAdmissionPolicies and, only when a pod
carries an outdated sidecar, the injected pods and ControllerRevisions that place it in its rollout:
GET and LIST only. The verdicts are the product's own.

Exit status 0 when every SidecarSet that selects a checked pod is in it at its current version, 1
when one is missing or out of date (or the cluster cannot be read, or the object does not exist),
2 for a bad command line. A SidecarSet already in a pod is judged as its controller counts the pod,
even where the injection rules (paused injection, the namespace label, opting out) now say no.

`command` (the command line and the run) reads through `reading` what `target` names; `report`
judges each pod with `rules` (does the SidecarSet select it, and if not, which rule says no),
`paths` (which path injects it) and `state` (its sidecars as the controller counts them), in the
terms of `model`; `render` writes the text or the JSON. Imports what the cli may import.
"""
