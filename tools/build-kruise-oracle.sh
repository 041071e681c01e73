#!/usr/bin/env bash
# Builds the Kruise oracle (tests/kruise/oracle: OpenKruise v1.9.1's own webhook, validation,
# upgrade-order and conversion code behind a JSON-lines process) into the per-machine cache, once
# per version of its sources. Prints the binary's path. Used by the Kruise differential tier
# (tests/kruise) and bench/bench_kruise.py; test infrastructure only, like the control plane.
#
# Kruise is fetched from the Go module proxy at exactly v1.9.1 (the proxy serves that version but
# does not list it); its go.mod's `replace` directives for k8s.io/* are copied into the oracle's.
# A cold build takes about 3 minutes on 2 cores; a warm one is a hash check.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=$here/tests/kruise/oracle
cache_root=${SIDECARCTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sidecarctl}
out=$cache_root/kruise/v1.9.1
stamp=$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-16)
built() { [[ -x "$out/kruise-oracle" && "$(cat "$out/.source" 2>/dev/null)" == "$stamp" ]]; }
if built; then
  echo "$out/kruise-oracle"
  exit 0
fi
mkdir -p "$out"
exec 9>"$out.lock"
flock 9
if built; then  # another setup built it while this one waited for the lock
  echo "$out/kruise-oracle"
  exit 0
fi
(cd "$src" && GOFLAGS=-buildvcs=false go build -trimpath -o "$out/kruise-oracle.tmp" .)
mv "$out/kruise-oracle.tmp" "$out/kruise-oracle"
echo "$stamp" >"$out/.source"
echo "$out/kruise-oracle"
