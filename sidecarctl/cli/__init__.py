"""The `sidecarctl` command line: one module per command, and the YAML and text they read and write.

`main` parses and dispatches; `inject` (with its inputs, the manifest codec that keeps original
text, and stdout that never tracebacks), `preview`, `status` and `check-inject` (the package
`checkinject`: why a pod was or was not injected, and whether its sidecars are current), with the
cluster reads they share and their text rendering, the one error every command shows
(`clierror`), and the flags of `run`. May import every product package and
`sidecarctl.manager` (to start the manager); nothing imports it but `python -m sidecarctl.cli`.
"""
