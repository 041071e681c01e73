"""The MutatingAdmissionPolicies kept in the API server: support found, policies written, the webhook narrowed.

`injector.policy` generates the policies from the SidecarSets (pure); here runs the loop that makes
the API server hold them (`sync`), with the pod webhook's matchCondition (`narrowing`), what the
server serves and enforces (`support`), and the objects as written and stored (`desired`, `stored`).
It imports `injector.policy`, `injector.engine` and `sidecarsets.spec` / `sidecarsets.values`, and
the runtime's API client; never the HTTP side or the controller.
"""
