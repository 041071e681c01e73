#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, and kubectl for
# the demo and the manifest tests) from the
# Go module proxy into a per-machine cache, once. Prints the directory holding the binaries.
#
# With --node it also builds what the real-node tier needs into the same directory: kubelet and
# kube-scheduler (same wrapper module, so the same Kubernetes dependency versions) and helm (its
# own wrapper, tools/helmbin, so minimal version selection cannot move Kubernetes' dependencies).
# KUBEBUILDER_ASSETS then still provides the control plane, but the node binaries come from here.
#
# Why from modules: prebuilt release downloads are not reachable from every build machine,
# while the Go module proxy is. The wrappers in tools/k8sbin and tools/etcdbin pin versions
# (their go.mod/go.sum); nothing from Kubernetes or etcd is kept in this repository.
#
# KUBEBUILDER_ASSETS, when set to a directory holding etcd and kube-apiserver, wins and
# nothing is built.
#
# With --dir it only prints the cache directory (whatever it holds so far) and builds nothing.
set -euo pipefail

K8S_VERSION=1.37.2
ETCD_VERSION=3.6.16
HELM_VERSION=4.3.2
here=$(cd "$(dirname "$0")" && pwd)

node=false
if [[ "${1:-}" == "--node" ]]; then
  node=true
fi

cache_root=${SIDECARCTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sidecarctl}
out="$cache_root/k8s/v$K8S_VERSION-etcd$ETCD_VERSION"
if [[ "${1:-}" == "--dir" ]]; then
  echo "$out"
  exit 0
fi

if [[ -n "${KUBEBUILDER_ASSETS:-}" && $node == false ]]; then
  for b in etcd kube-apiserver; do
    if [[ ! -x "$KUBEBUILDER_ASSETS/$b" ]]; then
      echo "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable $b" >&2
      exit 2
    fi
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

wanted=(etcd kube-apiserver kube-controller-manager kubectl)
if [[ $node == true ]]; then
  wanted+=(kubelet kube-scheduler "helm-v$HELM_VERSION")
fi
complete() {
  for b in "${wanted[@]}"; do
    [[ -x "$out/$b" ]] || return 1
  done
}
if complete; then
  echo "$out"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<EOF
error: no test control plane binaries and no Go toolchain to build them.
Either install Go >= 1.26 (the binaries are then built once into $out),
or set KUBEBUILDER_ASSETS to a directory holding etcd and kube-apiserver
(kube-controller-manager optional).
EOF
  exit 2
fi

mkdir -p "$out"
# One build at a time per machine: two test runs starting together must not race.
exec 9>"$out.lock"
flock 9
if complete; then
  echo "$out"
  exit 0
fi

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
start=$(date +%s)
stamp=$(date -u +%FT%TZ)
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=${K8S_VERSION%%.*}"
  minor=${K8S_VERSION#*.}; minor=${minor%%.*}
  ldf="$ldf -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$stamp"
done

if [[ ! -x "$out/etcd" ]]; then
  echo "building etcd v$ETCD_VERSION into $out" >&2
  (cd "$here/etcdbin" && go build -trimpath \
    -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$ETCD_VERSION" \
    -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$out/etcd.tmp" "$out/etcd"
fi

k8s_cmds=(kube-apiserver kube-controller-manager kubectl)
if [[ $node == true ]]; then
  k8s_cmds+=(kubelet kube-scheduler)
fi
for cmd in "${k8s_cmds[@]}"; do
  [[ -x "$out/$cmd" ]] && continue
  echo "building $cmd v$K8S_VERSION into $out" >&2
  (cd "$here/k8sbin" && go build -trimpath -tags selinux,notest,grpcnotrace \
    -ldflags "$ldf" -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd")
  mv "$out/$cmd.tmp" "$out/$cmd"
done

if [[ $node == true && ! -x "$out/helm-v$HELM_VERSION" ]]; then
  echo "building helm v$HELM_VERSION into $out" >&2
  hv=helm.sh/helm/v${HELM_VERSION%%.*}/internal/version
  (cd "$here/helmbin" && go build -trimpath \
    -ldflags "-s -w -X $hv.version=v$HELM_VERSION -X $hv.metadata= -X $hv.gitTreeState=clean" \
    -o "$out/helm.tmp" "helm.sh/helm/v${HELM_VERSION%%.*}/cmd/helm")
  mv "$out/helm.tmp" "$out/helm-v$HELM_VERSION"
fi
if [[ $node == true ]]; then
  ln -sfn "helm-v$HELM_VERSION" "$out/helm"
fi

echo "binaries built in $(( $(date +%s) - start ))s: $(du -sh "$out" | cut -f1)" >&2
echo "$out"
