#!/usr/bin/env bash
# The project's test command: installs what is missing, then lint, types, and every test tier.
#   bash tools/test.sh            # everything (unit, HTTP, e2e on a real kube-apiserver + etcd)
#   bash tools/test.sh -k inject  # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

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

# Test control plane binaries: built once per machine into ~/.cache/sidecarctl (or $KUBEBUILDER_ASSETS).
bash tools/build-control-plane.sh >/dev/null

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/pytest "$@"
