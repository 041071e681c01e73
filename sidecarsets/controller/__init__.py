"""The leader's SidecarSet controller: the loop and everything it writes to the cluster.

Reconciling a SidecarSet (status, revision history, in-place upgrades through the pure rollout
room), the writes to pods (upgrade patches, the `SidecarSetUpgradable` condition), per-pod backoff
of refused patches, the periodic scan for pods that missed their sidecars, and the controller's
metrics. May import every other room of sidecarsets and kuberuntime; nothing but the program
(sidecarctl) imports it.
"""
