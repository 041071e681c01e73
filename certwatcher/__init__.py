"""Serving-certificate reload: the webhook serves the pair in its cert directory, swapped in as it
changes. It imports only the generic runtime (kuberuntime).

Modules: `reloader` (watch a cert dir, swap the served pair), `tls` (check a pair, build contexts,
the front context hypercorn keeps), `files` / `atomicdir` (reading and writing the kubelet's `..data`
layout), `pem` (certificate bundles, block by block), `metrics`. Publishing the CA into caBundle is
the `cabundle` package's; issuing a self-signed CA and leaf into a Secret is `selfsigned`'s. The
modules `cabundle` and `selfsigned` here only keep the names the manager's control role imported
from this package before those moved; import them from their packages.
"""
