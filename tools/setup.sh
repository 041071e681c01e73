#!/usr/bin/env bash
# Installs what the tests and the demo need, once: the venv with pinned Python deps, the test
# control plane binaries (built from Go modules into ~/.cache/sidecarctl, or $KUBEBUILDER_ASSETS),
# and as root what the real-node tier needs (tools/setup-node.sh: Debian packages, kubelet, images).
# Sourced by tools/test.sh and tools/demo.sh; safe to run again (it does nothing when up to date).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

py=${PYTHON:-python3}
"$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
if [[ ! -x .venv/bin/python ]]; then
  "$py" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [[ ! -e "$stamp" ]]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -c constraints.txt -e '.[dev]'
  touch "$stamp"
fi
bash tools/build-control-plane.sh >/dev/null
# The real-node tier (tests/node) needs root; without it that tier says so in one line.
if [[ $(id -u) -eq 0 ]]; then
  bash tools/setup-node.sh
fi
