"""The SidecarSet domain, in rooms that import downwards only (tests/unit/test_layering.py).

`values/` (Quantity, IntOrString, resource expressions) <- `spec/` (the SidecarSet API as data) <-
`validation/`, `pods/` (the controller's view of a pod and what it concludes from pods) <-
`rollout/` (the pure in-place upgrade) <- `controller/` (the leader's loop and its writes).
Beside them, `store` and `pins` are what admission reads: the snapshot the watches swap and the
revision a new pod gets. The generic runtime (API client, informer, work queue, leader election) is
kuberuntime, which knows nothing of SidecarSets.
"""
