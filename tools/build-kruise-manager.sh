#!/usr/bin/env bash
# Builds OpenKruise v1.9.1's own manager (the `main` package at the root of the module
# github.com/openkruise/kruise, the binary Kruise's image ships as /manager) into the per-machine
# cache, once per version of the wrapper module. Prints the binary's path. Used by
# tests/kube/kruisemanager.py (the e2e smoke test and bench/bench_vs_kruise.py); test
# infrastructure only, like the control plane and the Kruise oracle.
#
# tools/kruisemanager is a wrapper module: it requires github.com/openkruise/kruise at exactly
# v1.9.1 (the proxy serves that version but does not list it) and copies Kruise's own `replace`
# directives (Go ignores them in a dependency), so minimal version selection picks every version
# Kruise's go.mod does. Kruise's Dockerfile builds with CGO_ENABLED=0 and no -ldflags; so does
# this (its Go toolchain is newer: whatever `go` is here).
#
# Cold (no binary cached; the Go build cache holding what the oracle's build left), on 2 cores
# shared with two other Go builds: 344 s wall, 237 CPU-seconds; the binary is 105 MiB (not stripped,
# as Kruise's image). A warm run is a hash check.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=$here/tools/kruisemanager
cache_root=${SIDECARCTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sidecarctl}
out=$cache_root/kruise-manager/v1.9.1
stamp=$(cat "$src/go.mod" "$src/go.sum" "$0" | sha256sum | cut -c1-16)
built() { [[ -x "$out/kruise-manager" && "$(cat "$out/.source" 2>/dev/null)" == "$stamp" ]]; }
if built; then
  echo "$out/kruise-manager"
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "error: no Go toolchain to build Kruise's manager (install Go >= 1.24)" >&2
  exit 2
fi
mkdir -p "$out"
exec 9>"$out.lock"
flock 9
if built; then  # another setup built it while this one waited for the lock
  echo "$out/kruise-manager"
  exit 0
fi
start=$(date +%s)
echo "building OpenKruise v1.9.1's manager into $out" >&2
(cd "$src" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" \
  go build -trimpath -o "$out/kruise-manager.tmp" github.com/openkruise/kruise)
mv "$out/kruise-manager.tmp" "$out/kruise-manager"
echo "$stamp" >"$out/.source"
echo "kruise-manager built in $(($(date +%s) - start))s: $(du -h "$out/kruise-manager" | cut -f1)" >&2
echo "$out/kruise-manager"
