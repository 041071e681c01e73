#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager, and kubectl for
# the demo and the manifest tests) of one supported Kubernetes version from the Go module proxy into
# a per-machine cache, once per version. Prints the directory holding the binaries.
#
#   build-control-plane.sh                     # the newest supported version (what every tier runs)
#   build-control-plane.sh --version 1.34      # a supported minor (or its exact version, 1.34.4)
#   build-control-plane.sh --list              # the supported versions, oldest first
#   build-control-plane.sh --dir [--version V] # only print the cache directory; build nothing
#   build-control-plane.sh --node              # also kubelet, kube-scheduler and helm (newest only)
#
# SIDECARCTL_K8S_VERSION picks the version as --version does (the versions tier sets it).
#
# The supported versions are the directories tools/k8sbin/v<version>/, each a wrapper module whose
# go.mod/go.sum pin k8s.io/kubernetes at that version and its staging modules with it (nothing from
# Kubernetes is kept in this repository). etcd is one build (tools/etcdbin), shared by every version.
#
# With --node it also builds what the real-node tier needs into the same directory: kubelet and
# kube-scheduler (same wrapper module, so the same Kubernetes dependency versions) and helm (its
# own wrapper, tools/helmbin, so minimal version selection cannot move Kubernetes' dependencies).
# KUBEBUILDER_ASSETS then still provides the control plane, but the node binaries come from here.
#
# Why from modules: prebuilt release downloads are not reachable from every build machine,
# while the Go module proxy is.
#
# KUBEBUILDER_ASSETS, when set to a directory holding etcd and kube-apiserver, wins when no version
# is asked for, and nothing is built.
set -euo pipefail

ETCD_VERSION=3.6.16
HELM_VERSION=4.3.2
here=$(cd "$(dirname "$0")" && pwd)

supported() {
  # Oldest first, by version number (1.9 would sort after 1.10 as text).
  for d in "$here"/k8sbin/v*/; do
    d=${d%/}
    echo "${d##*/v}"
  done | sort -t. -k1,1n -k2,2n -k3,3n
}

node=false
dir_only=false
asked=${SIDECARCTL_K8S_VERSION:-}
while (($#)); do
  case "$1" in
    --node) node=true ;;
    --dir) dir_only=true ;;
    --list)
      supported
      exit 0
      ;;
    --version)
      asked=${2:?--version needs a version, e.g. 1.34}
      shift
      ;;
    *)
      echo "build-control-plane.sh: unknown argument $1" >&2
      exit 2
      ;;
  esac
  shift
done

if [[ -z "$asked" ]]; then
  K8S_VERSION=$(supported | tail -n 1)
else
  K8S_VERSION=$(supported | awk -v want="$asked" '$0 == want || index($0, want ".") == 1' | tail -n 1)
  if [[ -z "$K8S_VERSION" ]]; then
    echo "build-control-plane.sh: Kubernetes $asked is not supported here; supported: $(supported | tr '\n' ' ')" >&2
    exit 2
  fi
fi
newest=$(supported | tail -n 1)
if [[ $node == true && $K8S_VERSION != "$newest" ]]; then
  echo "build-control-plane.sh: --node builds the newest version ($newest) only" >&2
  exit 2
fi

cache_root=${SIDECARCTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sidecarctl}
out="$cache_root/k8s/v$K8S_VERSION-etcd$ETCD_VERSION"
if [[ $dir_only == true ]]; then
  echo "$out"
  exit 0
fi

if [[ -n "${KUBEBUILDER_ASSETS:-}" && -z "$asked" && $node == false ]]; then
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
minor=${K8S_VERSION#*.}
minor=${minor%%.*}
ldf="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldf="$ldf -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=${K8S_VERSION%%.*}"
  ldf="$ldf -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$stamp"
done

if [[ ! -x "$out/etcd" ]]; then
  # One etcd for every Kubernetes version (each of them supports etcd 3.6), built once.
  etcd_dir="$cache_root/etcd/v$ETCD_VERSION"
  mkdir -p "$etcd_dir"
  if [[ ! -x "$etcd_dir/etcd" ]]; then
    echo "building etcd v$ETCD_VERSION into $etcd_dir" >&2
    (cd "$here/etcdbin" && go build -trimpath \
      -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=v$ETCD_VERSION" \
      -o "$etcd_dir/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$etcd_dir/etcd.tmp" "$etcd_dir/etcd"
  fi
  ln -f "$etcd_dir/etcd" "$out/etcd" 2>/dev/null || cp "$etcd_dir/etcd" "$out/etcd"
fi

k8s_cmds=(kube-apiserver kube-controller-manager kubectl)
if [[ $node == true ]]; then
  k8s_cmds+=(kubelet kube-scheduler)
fi
missing=()
for cmd in "${k8s_cmds[@]}"; do
  [[ -x "$out/$cmd" ]] || missing+=("$cmd")
done
if ((${#missing[@]})); then
  echo "building ${missing[*]} v$K8S_VERSION into $out" >&2
  tmp=$(mktemp -d "$out/.build.XXXXXX")
  pkgs=()
  for cmd in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  # One go command for all of them: their shared packages compile once, the links run side by side.
  (cd "$here/k8sbin/v$K8S_VERSION" && go build -trimpath -tags selinux,notest,grpcnotrace \
    -ldflags "$ldf" -o "$tmp/" "${pkgs[@]}")
  for cmd in "${missing[@]}"; do mv "$tmp/$cmd" "$out/$cmd"; done
  rmdir "$tmp"
fi

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

echo "binaries built in $(($(date +%s) - start))s: $(du -sh "$out" | cut -f1)" >&2
echo "$out"
