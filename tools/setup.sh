#!/usr/bin/env bash
# Installs what the tests and the demo need, once: the venv with pinned Python deps, the test
# control plane binaries of every supported Kubernetes minor (built from Go modules into
# ~/.cache/sidecarctl),
# and as root what the real-node tier needs (tools/setup-node.sh: Debian packages, kubelet, images).
# Sourced by tools/test.sh and tools/demo.sh; safe to run again (it does nothing when up to date).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

py=${PYTHON:-python3}
"$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
if [[ ! -x .venv/bin/python ]]; then
  "$py" -m venv .venv
fi
deps=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
stamp=.venv/.installed-$deps
if [[ ! -e "$stamp" ]]; then
  # The pinned dependencies as wheels, fetched once per pin set into a wheelhouse beside the control
  # plane binaries: a fresh clone then installs offline (a PyPI outage cannot fail a warm run), and
  # tests/e2e/test_image_e2e.py installs the image's venv from it (9.3 s -> 2.8 s here).
  house=${SIDECARCTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sidecarctl}/wheels/$deps
  if [[ ! -e "$house/.complete" ]]; then
    .venv/bin/pip install -q --upgrade pip
    mkdir -p "$(dirname "$house")"
    tmp=$(mktemp -d "$house.XXXXXX")
    .venv/bin/pip wheel -q -c constraints.txt --wheel-dir "$tmp" '.[dev]' pip setuptools wheel
    rm -f "$tmp"/sidecarctl-*.whl  # the project itself is installed from the checkout
    touch "$tmp/.complete"
    rm -rf "$house" && mv "$tmp" "$house"
  fi
  .venv/bin/pip install -q --no-index --find-links "$house" --upgrade pip
  .venv/bin/pip install -q --no-index --find-links "$house" -c constraints.txt -e '.[dev]'
  touch "$stamp"
fi
# Every supported Kubernetes minor (tools/k8sbin/v*): the newest for every tier, the others for the versions tier.
for version in $(bash tools/build-control-plane.sh --list); do
  bash tools/build-control-plane.sh --version "$version" >/dev/null
done
# OpenKruise v1.9.1's own code as a process, for the Kruise differential tier (tests/kruise).
bash tools/build-kruise-oracle.sh >/dev/null
# OpenKruise v1.9.1's own manager binary, for the side-by-side e2e test and bench/bench_vs_kruise.py.
bash tools/build-kruise-manager.sh >/dev/null
# Prometheus and promtool, for the alert rules' tests and the Prometheus e2e test.
bash tools/build-prometheus.sh >/dev/null
# The real-node tier (tests/node) needs root; without it that tier says so in one line.
if [[ $(id -u) -eq 0 ]]; then
  bash tools/setup-node.sh
fi
