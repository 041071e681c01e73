"""Keeping `caBundle` in our webhook configurations, and the CRD's conversion webhook, in step with
the local CA: one of the three jobs the manager does for TLS, apart from serving the certificate
(certwatcher) and issuing it (selfsigned).

Modules: `syncer` (the writes, guarded and rate limited), `bundlepolicy` (which CAs the bundle
holds, as pure functions), `writebudget` (the token bucket bounding writes), `metrics`. It imports
the generic runtime (kuberuntime) and certwatcher's certificate reading (pem), nothing else of ours.
"""
