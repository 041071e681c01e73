#!/usr/bin/env bash
# Builds kube-apiserver with apiserver-policy-selector-cache.patch applied to k8s.io/apiserver, and
# prints a directory to pass as KUBEBUILDER_ASSETS (that kube-apiserver beside the cached etcd and
# the rest of the unpatched control plane). Usage:
#   KUBEBUILDER_ASSETS=$(bash tools/upstream/build-patched-apiserver.sh) .venv/bin/python bench/bench_scale.py
#
# Why: with many MutatingAdmissionPolicies, kube-apiserver parses every policy's label selectors
# again on each request (its webhook dispatcher keeps them parsed); the patch keeps them parsed per
# stored policy, the change this project proposes upstream. `bench/bench_scale.py` run with and
# without it shows how much of the per-pod cost at many SidecarSets that change removes.
# Not part of CI or of the product; the control plane tests use the unpatched build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
stock=$(bash "$here/../build-control-plane.sh")
cache_root=${SIDECARCTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sidecarctl}
out="$cache_root/k8s/patched-selector-cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cp "$here/../k8sbin/v1.37.2/go.mod" "$here/../k8sbin/v1.37.2/go.sum" "$work/"
apiserver_version=$(sed -n 's#^replace k8s.io/apiserver => k8s.io/apiserver \(v[0-9.]*\)$#\1#p' "$work/go.mod")
(cd "$work" && GOFLAGS=-mod=mod go mod download "k8s.io/apiserver@$apiserver_version")
cp -r "$(go env GOMODCACHE)/k8s.io/apiserver@$apiserver_version" "$work/apiserver"
chmod -R u+w "$work/apiserver"
patch -s -d "$work/apiserver" -p1 < "$here/apiserver-policy-selector-cache.patch" >&2  # stdout is the answer
sed -i "s#^replace k8s.io/apiserver => .*#replace k8s.io/apiserver => ./apiserver#" "$work/go.mod"

mkdir -p "$out"
version=$("$stock/kube-apiserver" --version | awk '{print $2}')
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  minor=${version#v*.}; minor=${minor%%.*}
  ldf="$ldf -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
(cd "$work" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -tags selinux,notest,grpcnotrace \
  -ldflags "$ldf" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
for f in "$stock"/*; do  # etcd and the rest of the control plane, unpatched
  [[ $(basename "$f") == kube-apiserver ]] || ln -sfn "$f" "$out/$(basename "$f")"
done
echo "$out"
