"""Injection inside the API server: SidecarSets compiled to MutatingAdmissionPolicies.

`generate` turns an overlap group of SidecarSets into one JSONPatch policy and its binding (or
says which feature needs the webhook); `plan` decides, for all SidecarSets, which are served by
policies, which by the webhook and why, and the condition that narrows the webhook to the pods
only it can serve; `injector.policysync` keeps that plan in the API server. It imports `injector.engine` (the
bookkeeping annotations both paths write) and `sidecarsets.spec` / `sidecarsets.values`; never
the HTTP side.
"""
