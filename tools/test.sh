#!/usr/bin/env bash
# The project's test command: installs what is missing, then lint, types, and every test tier.
#   bash tools/test.sh            # everything (unit, HTTP, e2e, reliability, real node as root)
#   bash tools/test.sh -k inject  # extra arguments go to both pytest runs (below)
#   bash tools/test.sh --quick    # the inner loop: lint, types, docs, unit, HTTP and one e2e module
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
echo "== mkdocs build --strict"
# The documentation site: a broken link, a missing anchor or a page left out of the nav fails here
# (not --quiet: it hides the warnings that --strict counts).
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site" || { rm -rf "$site"; exit 1; }
rm -rf "$site"
echo "== pytest"
# Two runs. The unit and HTTP tests are CPU-bound and hold no bound on elapsed time, so they run on
# every core (pytest-xdist); the tests marked `serial` do bound elapsed time (tests/conftest.py marks
# every tier that talks to a real API server, kubelet or manager process), so they run alone, one
# test at a time, and fail rather than run under several xdist workers.
# The Kruise differential tier (tests/kruise) runs in this second run: it bounds no time, but its
# summary lines (cases, equal, documented and undocumented differences) are printed by this process.
if [[ $quick -eq 1 ]]; then
  rest=(tests/kruise tests/e2e/test_inject_e2e.py)
else
  rest=(tests/kruise tests/e2e tests/node tests/reliability)
fi
status=0
report=$(mktemp)
trap 'rm -f "$report"' EXIT
export SIDECARCTL_VERSIONS_REPORT=$report
# Exit status 5 is "no test selected" (say `-k` picked tests of one run only): not a failure.
.venv/bin/pytest -n auto -m "not serial" tests/unit tests/http "$@" || { rc=$?; [[ $rc -eq 5 ]] || status=$rc; }
.venv/bin/pytest -m serial tests/unit tests/http "${rest[@]}" "$@" || { rc=$?; [[ $rc -eq 5 ]] || status=$rc; }
if [[ $quick -eq 0 ]]; then
  # The versions tier: the e2e tests marked `versions` against every older supported minor (the run
  # above ran them, with every other tier, against the newest). One minor at a time, like the rest.
  newest=$(bash tools/build-control-plane.sh --list | tail -n 1)
  for version in $(bash tools/build-control-plane.sh --list); do
    [[ $version == "$newest" ]] && continue
    echo "== versions tier: Kubernetes $version"
    SIDECARCTL_K8S_VERSION=$version .venv/bin/pytest -m versions tests/e2e "$@" || {
      rc=$?
      [[ $rc -eq 5 ]] || status=$rc
    }
  done
  # Every supported minor ran the tier, with nothing failed or skipped (or the run fails); a run
  # narrowed by -k or -m only prints what ran.
  narrowed=()
  for arg in "$@"; do
    case "$arg" in -k* | -m*) narrowed=(--narrowed) ;; esac
  done
  .venv/bin/python tools/versions_report.py "$report" "${narrowed[@]}" || { [[ $status -ne 0 ]] || status=1; }
fi
exit $status
