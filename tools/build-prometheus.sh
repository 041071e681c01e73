#!/usr/bin/env bash
# Builds Prometheus and promtool (github.com/prometheus/prometheus v0.316.0, the module of Prometheus
# 3.x) into the per-machine cache, once per version of tools/prometheus/go.{mod,sum}. Prints the
# directory holding both. Test infrastructure only, like the control plane: `promtool test rules`
# checks config/alerts in the unit tier, and tests/e2e/test_prometheus_e2e.py runs Prometheus against
# the manager. The proxy serves that exact version but does not list it; both commands are `tool`
# lines of tools/prometheus/go.mod. A cold build takes about 4.5 minutes on 2 cores (no web UI assets:
# only the HTTP API is used).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=$here/tools/prometheus
cache_root=${SIDECARCTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sidecarctl}
out=$cache_root/prometheus/v0.316.0
stamp=$(cat "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-16)
built() { [[ -x "$out/prometheus" && -x "$out/promtool" && "$(cat "$out/.source" 2>/dev/null)" == "$stamp" ]]; }
if built; then
  echo "$out"
  exit 0
fi
mkdir -p "$out"
exec 9>"$out.lock"
flock 9
if built; then  # another setup built it while this one waited for the lock
  echo "$out"
  exit 0
fi
tmp=$(mktemp -d "$out/.build.XXXXXX")
(cd "$src" && GOFLAGS=-buildvcs=false go build -trimpath -o "$tmp/" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
mv "$tmp/prometheus" "$out/prometheus"
mv "$tmp/promtool" "$out/promtool"
rmdir "$tmp"
echo "$stamp" >"$out/.source"
echo "$out"
