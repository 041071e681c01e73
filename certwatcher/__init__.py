"""Serving-certificate reload and caBundle sync. It imports only the generic runtime (kuberuntime).

Modules: `reloader` (watch a cert dir, swap the served pair), `tls` (check a pair, build contexts,
the front context hypercorn keeps), `cabundle` (publish the CA into our webhook configurations),
`selfsigned` / `issuing` (a CA and leaf kept in a Secret, renewal), `files` / `atomicdir` (the
kubelet's `..data` layout), `pem`, `metrics`.
"""
