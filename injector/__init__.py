"""The /inject admission webhook, its injection engine, and the `sidecarctl` command line."""
