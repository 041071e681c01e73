"""The sidecarctl program: the composition root, where every other package is wired. Nothing imports it.

`cli/` is the command line (`inject`, `preview`, `status`, `check-inject`, and the flags of `run`)
with its YAML and text I/O; `manager/` is what `sidecarctl run` starts: a supervisor, the control process
(Lease, controller, certificates, caBundle, policies) and the admission workers. cli may import
manager (the `run` command starts it); manager never imports cli.
"""
