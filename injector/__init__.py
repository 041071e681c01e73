"""Admission: the pure injection engine, the webhooks over HTTP, manual injection and policies.

`engine/` turns (pod, namespace, SidecarSets) into JSON Patch operations without I/O; `policy/`
compiles SidecarSets into MutatingAdmissionPolicies; `http/` serves /inject, /validate-sidecarset
and /convert from the store; `manifests/` runs the engine over manifest files and imagined new pods.
Arrows: engine <- policy <- http and manifests. It imports sidecarsets (spec, values, validation, the
store and pins), never its controller or rollout rooms.
"""
