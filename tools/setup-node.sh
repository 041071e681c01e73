#!/usr/bin/env bash
# What the real-node test tier needs on this machine, installed once (tools/setup.sh runs this as root):
#   - Debian packages: containerd, runc, CNI plugins, busybox-static (the test images' userland),
#     skopeo and umoci (image tools), buildah (builds the Dockerfile without a Docker engine),
#     debootstrap (the manager image's base is a Debian rootfs, no registry being reachable);
#   - kubelet, kube-scheduler and helm, built from the Go module proxy beside the control plane;
#   - the test images, built into ~/.cache/sidecarctl/images (tools/images/build.py; cached by a hash
#     of their inputs, so a warm run only hashes a few files).
# Safe to run again: every step checks first and does nothing when it is done.
# Not root, or no apt-get: says so in one line and exits 0; the node tier then reports the same line
# (and fails under CI=true).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(containerd runc containernetworking-plugins busybox-static skopeo umoci buildah debootstrap)

if [[ $(id -u) -ne 0 ]]; then
  echo "setup-node: not root, the real-node tier cannot run here (it needs root for containerd and the kubelet)" >&2
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-node: no apt-get to install ${missing[*]}; the real-node tier cannot run here" >&2
    exit 0
  fi
  echo "setup-node: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # An old or empty package list is the usual reason for "Unable to locate package".
  if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

bash tools/build-control-plane.sh --node >/dev/null
"${PYTHON:-.venv/bin/python}" tools/images/build.py >/dev/null
