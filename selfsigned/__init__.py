"""Self-signed mode: a CA and a serving leaf issued into a Secret that every replica shares, renewed
before they expire, and written into each replica's cert directory for certwatcher to serve.

Modules: `issuer` (the Secret, its replicas' agreement and the two-phase rotation), `issuing` (making
the CA and the leaf, and when each is due). It imports the generic runtime (kuberuntime) and
certwatcher (the cert directory's layout, checking a pair, pem), nothing else of ours.
"""
