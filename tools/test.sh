#!/usr/bin/env bash
# The project's test command: installs what is missing, then lint, types, and every test tier.
#   bash tools/test.sh            # everything (unit, HTTP, e2e, reliability, real node as root)
#   bash tools/test.sh -k inject  # extra arguments go to pytest
#   bash tools/test.sh --quick    # the inner loop: lint, types, unit, HTTP and one e2e module
#                                 # (injection through the real API server), in under 3 minutes
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
if [[ "${1:-}" == "--quick" ]]; then
  quick=1
  shift
fi

bash tools/setup.sh

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
# The cache lives beside the control plane binaries, so a fresh clone checks only what changed
# (mypy compares each file's content hash, not its path or mtime): 13 s cold, 0.5 s warm.
.venv/bin/mypy --cache-dir "${XDG_CACHE_HOME:-$HOME/.cache}/sidecarctl/mypy"
echo "== pytest"
if [[ $quick -eq 1 ]]; then
  exec .venv/bin/pytest tests/unit tests/http tests/e2e/test_inject_e2e.py "$@"
fi
exec .venv/bin/pytest "$@"
