"""The admission webhooks over HTTP: a bounded TLS listener, the ASGI app and what each webhook decides.

The listener and its budgets (connections, handshakes, bodies, bytes held at once), the
AdmissionReview and ConversionReview contracts, replay of repeated requests, the decisions of
/inject, /validate-sidecarset and /convert, the namespace lookup for a namespace the watch has not
delivered, and the admission metrics. May import `injector.engine`, `injector.policy` and the
sidecarsets store, pins, spec and validation; never `injector.manifests`.
"""
