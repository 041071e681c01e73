#!/usr/bin/env bash
# The local demo: installs what is missing, then runs tools/demo.py (see its docstring for what is
# real and what is faked). Needs Python >= 3.11 and Go >= 1.26 (or $KUBEBUILDER_ASSETS) on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/python tools/demo.py "$@"
