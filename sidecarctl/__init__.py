"""The sidecarctl program: the composition root, where every other package is wired. Nothing imports it.

`cli/` is the command line (`inject`, `preview`, `status`, `check-inject`, and the flags of `run`)
with its YAML and text I/O; `manager/` is what `sidecarctl run` starts: a supervisor, the control process
(Lease, controller, certificates, caBundle, policies) and the admission workers. cli may import
manager (the `run` command starts it); manager never imports cli.
"""

from importlib import metadata as _metadata

# The one version is pyproject.toml's; the installed distribution's metadata carries it here.
# (tests/unit/docs/test_version.py checks the chart, the manager image tag and the Dockerfile agree.)
try:
    __version__ = _metadata.version("sidecarctl")
except _metadata.PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"
