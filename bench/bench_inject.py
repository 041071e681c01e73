"""`sidecarctl inject` throughput on large manifests (documents/s), as a user runs it.

Run: `.venv/bin/python bench/bench_inject.py [--rounds R] [--only NAME ...]`. Each input is written
to a temporary file and injected by the installed `sidecarctl` in a child process (start-up
included), R times; the table shows the median wall time, the child's CPU time and documents/s.

The inputs are the kind of file people pipe through it: per application a Deployment (injected
with both sample SidecarSets, `config/samples/03-*` and `04-*`), a Service, a ConfigMap holding a
shell script as a block scalar, and a ServiceAccount, each with comments, quoted strings and an
octal file mode. `1k` and `8k` are 1,000 and 8,000 such documents; `5mb-configmap` is one
ConfigMap of 5 MB of block-scalar scripts (nothing to inject: the whole cost is reading and
writing it). Only flags that every version of `inject` has are used, so the same command measures
the code before and after a change; `--before DIR` runs an older checkout in alternation with the
current code, for a fair ratio on a machine others share.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, positive_int, print_machine, table, temp_dir

SAMPLES = REPO / "config" / "samples"
SIDECARSETS = [SAMPLES / "03-mesh-proxy-sidecarset.yaml", SAMPLES / "04-log-agent-sidecarset.yaml"]
NAMESPACE = "demo-shop"
TIMESTAMP = "2024-05-01T10:00:00Z"
TARGET_SPEEDUP = 5.0

_APP = """\
# {name}: the web front end of the shop, with its service, script and account.
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: demo-shop
  labels:
    app.kubernetes.io/name: {name}
    app.kubernetes.io/part-of: shop  # grouped in dashboards
  annotations:
    deployment.kubernetes.io/revision: "3"
spec:
  replicas: 2
  selector:
    matchLabels:
      app.kubernetes.io/name: {name}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {name}
        log-collection: enabled
    spec:
      serviceAccountName: {name}
      containers:
      - name: app
        image: registry.example.com/shop/{name}:1.{i}.0
        command: ["/bin/sh", "/scripts/start.sh"]
        env:
        - name: SERVICE_NAME
          value: {name}
        - name: LOG_LEVEL
          value: 'info'
        ports:
        - containerPort: 8080
          name: http
        readinessProbe:
          httpGet: {{path: /healthz, port: http}}
          periodSeconds: 5
        resources:
          requests: {{cpu: 100m, memory: 128Mi}}
          limits: {{memory: 256Mi}}
        securityContext:
          runAsNonRoot: true
          allowPrivilegeEscalation: false
          capabilities:
            drop: ["ALL"]
        volumeMounts:
        - name: scripts
          mountPath: /scripts
      volumes:
      - name: scripts
        configMap:
          name: {name}-scripts
          defaultMode: 0555
---
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: demo-shop
spec:
  selector:
    app.kubernetes.io/name: {name}
  ports:
  - port: 80
    targetPort: http  # the container's named port
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {name}-scripts
  namespace: demo-shop
data:
  start.sh: |
    #!/bin/sh
    # Wait for the proxy, then start the server.
    set -eu
    until wget -q -O /dev/null http://127.0.0.1:15090/stats/prometheus; do
      sleep 1
    done
    exec /app/server --port 8080 --name "{name}"
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {name}
  namespace: demo-shop
automountServiceAccountToken: false
"""

_SCRIPT_LINE = '    echo "step {j}: $(date -u +%FT%TZ) checking /var/lib/data/part-{j}" >> /var/log/job.log\n'


def documents(count: int) -> str:
    """`count` documents (a multiple of 4): applications of four objects each."""
    return "".join(_APP.format(name=f"shop-{i:05d}", i=i) for i in range(count // 4))


def big_configmap(size: int) -> str:
    """One ConfigMap of about `size` bytes: block-scalar scripts of 1,000 lines each."""
    head = (
        "# Maintenance scripts, one per key.\n"
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: scripts\n  namespace: {NAMESPACE}\ndata:\n"
    )
    parts = [head]
    total = len(head)
    key = 0
    while total < size:
        block = f"  script-{key:04d}.sh: |\n    #!/bin/sh\n" + "".join(_SCRIPT_LINE.format(j=j) for j in range(1000))
        parts.append(block)
        total += len(block)
        key += 1
    return "".join(parts)


@dataclass(frozen=True)
class Input:
    name: str
    docs: int
    make: Callable[[], str]


INPUTS = [
    Input("1k", 1000, lambda: documents(1000)),
    Input("8k", 8000, lambda: documents(8000)),
    Input("5mb-configmap", 1, lambda: big_configmap(5 * 1024 * 1024)),
]


def sidecarctl() -> list[str]:
    exe = Path(sys.executable).with_name("sidecarctl")
    return [str(exe)] if exe.exists() else [shutil.which("sidecarctl") or "sidecarctl"]


def run_once(path: Path, code: Path | None = None) -> tuple[float, float, int]:
    """Wall seconds, child CPU seconds and output bytes of one `sidecarctl inject`.

    `code`: a checkout whose `sidecarctl` to run instead (`python -m sidecarctl.cli.main` from there).
    """
    command = sidecarctl() if code is None else [sys.executable, "-m", "sidecarctl.cli.main"]
    argv = [*command, "inject", "-f", str(path), "--timestamp", TIMESTAMP]
    for ss in SIDECARSETS:
        argv += ["--sidecarset", str(ss)]
    argv += ["--namespace-labels", f"{NAMESPACE}:sidecar-injection=enabled"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False, cwd=code)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"sidecarctl inject exited {done.returncode}: {done.stderr.decode()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, len(done.stdout)


def _row(name: str, spec: Input, size: int, runs: list[tuple[float, float, int]]) -> tuple[list[str], float, float]:
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    row = [
        name,
        f"{spec.docs:,}",
        f"{size / 1e6:.2f} MB",
        f"{wall:.2f} s",
        f"{cpu:.2f} s",
        f"{spec.docs / wall:,.1f}",
        f"{runs[0][2] / 1e6:.2f} MB",
    ]
    return row, wall, cpu


def _ratio(speedup: float) -> str:
    return f"{speedup:.1f}x ({'met' if speedup >= TARGET_SPEEDUP else 'MISSED'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=positive_int, default=3, help="runs per input (median shown; default 3)")
    parser.add_argument("--only", action="append", choices=[i.name for i in INPUTS], help="measure only these inputs")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME=DOCS_PER_S",
        help="documents/s measured before a change, to print the speed-up against (repeatable)",
    )
    parser.add_argument(
        "--before",
        type=Path,
        metavar="DIR",
        help="a checkout of the code before a change (e.g. `git worktree add DIR COMMIT`): its runs alternate "
        "with the current code's, so that both see the same machine, and the speed-up is of the medians",
    )
    args = parser.parse_args(argv)
    baseline = {}
    for item in args.baseline:
        name, _, value = item.partition("=")
        baseline[name] = float(value)
    print_machine("sidecarctl inject on large manifests")
    work = temp_dir("bench-inject-")
    rows = []
    try:
        for spec in INPUTS:
            if args.only and spec.name not in args.only:
                continue
            path = work / f"{spec.name}.yaml"
            path.write_text(spec.make(), encoding="utf-8")
            size = path.stat().st_size
            now: list[tuple[float, float, int]] = []
            old: list[tuple[float, float, int]] = []
            for _ in range(args.rounds):
                if args.before is not None:
                    old.append(run_once(path, args.before))
                now.append(run_once(path))
            if old:
                row, old_wall, old_cpu = _row(f"{spec.name} before", spec, size, old)
                rows.append([*row, "", ""])
            row, wall, cpu = _row(spec.name, spec, size, now)
            if old:
                row += [_ratio(old_wall / wall), f"{old_cpu / cpu:.1f}x"]
            elif spec.name in baseline:
                row.append(_ratio(spec.docs / wall / baseline[spec.name]))
            elif baseline:
                row.append("")
            rows.append(row)
            print(f"   {spec.name}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    headers = ["input", "documents", "size", "wall (median)", "CPU", "documents/s", "output"]
    if args.before is not None:
        headers += [f"documents/s vs before (>= {TARGET_SPEEDUP:.0f}x)", "CPU vs before"]
    elif baseline:
        headers.append(f"vs baseline (>= {TARGET_SPEEDUP:.0f}x)")
    print()
    print(table(headers, rows))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
