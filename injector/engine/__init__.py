"""The injection engine: (pod, namespace labels, SidecarSets) -> RFC 6902 operations, with no I/O.

Eligibility and pod checks, which SidecarSets a pod gets, the sidecars as they enter the pod (env,
shared volumes, transferEnv, resourcesPolicy, the pod's overrides, HotUpgrade pairs), where they
are placed, the bookkeeping annotations, and the patch operations with their in-place application.
One engine for the webhook, the policy generator's checks and the CLI. May import
`sidecarsets.spec`, `sidecarsets.values` and `sidecarsets.overrides`; no HTTP, no policy, no cluster.
"""
