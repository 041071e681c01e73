"""The SidecarSet domain: the one model, the store the webhook reads, the controller and its pure parts.

Pure pieces (model, defaults, hashing, selectors, validation, pins, the upgrade planner, status)
sit beside the controller and the revision I/O; the generic runtime they run on (API client,
informer, work queue, leader election) is kuberuntime, which knows nothing of SidecarSets.
"""
