#!/usr/bin/env bash
# The project's test command: installs what is missing, then lint, types, and every test tier.
#   bash tools/test.sh            # everything (unit, HTTP, e2e on a real kube-apiserver + etcd)
#   bash tools/test.sh -k inject  # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

bash tools/setup.sh

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/pytest "$@"
