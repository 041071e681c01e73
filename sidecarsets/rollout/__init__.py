"""The in-place upgrade, as pure functions: which pods next, in which order, and the patch for each.

The status counters users watch a rollout by, the planner and Kruise's upgrade order (priority,
scatter), the pod patch and the pod's `SidecarSetUpgradable` condition, HotUpgrade's
upgrade-then-flip, the progress deadline, how a spec differs from what pods run (and so why a pod
is not upgradable), and the rollout simulated on pod copies for `sidecarctl preview`, `status`
and `check-inject`.
May import `sidecarsets.pods`, `sidecarsets.spec` and `sidecarsets.values`; never the controller,
and nothing that does I/O.
"""
