#!/usr/bin/env bash
# The local demo: installs what is missing, then runs tools/demo.py (see its docstring for what is
# real and what is faked). Needs Python >= 3.11 and Go >= 1.26 (or $KUBEBUILDER_ASSETS) on the machine.
# As root with the real-node packages (tools/setup-node.sh) it runs on a real kubelet + containerd;
# otherwise its first line says why not, and a fake kubelet stands in. `--fake` forces the latter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python tools/demo.py "$@"
