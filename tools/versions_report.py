"""Prints the versions tier's summary: per Kubernetes version, how its `versions` tests ended.

Each pytest run of tools/test.sh appends one JSON line to the file SIDECARCTL_VERSIONS_REPORT names
(tests/conftest.py): the version its control plane ran, and its counts. Usage:
    python tools/versions_report.py FILE [--narrowed]
Exits 1 when a supported version has no line, or any test of the tier failed or was skipped there;
with --narrowed (the run was narrowed by -k or -m) it only prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "build-control-plane.sh"


def _key(version: str) -> list[int]:
    return [int(part) for part in version.lstrip("v").split(".") if part.isdigit()]


def main(path: str, *, narrowed: bool = False) -> int:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    supported = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True)
    wanted = {f"v{v}" for v in supported.stdout.split()}
    print("== versions tier: the tests marked `versions`, minor by minor")
    bad = False
    for row in sorted(rows, key=lambda r: _key(r["kubernetes"])):
        print(
            f"Kubernetes {row['kubernetes']}: {row['passed']} passed, {row['failed']} failed, {row['skipped']} skipped"
        )
        bad |= bool(row["failed"] or row["skipped"])
    missing = sorted(wanted - {r["kubernetes"] for r in rows}, key=_key)
    for version in missing:
        print(f"Kubernetes {version}: did not run")
    return 0 if narrowed else (1 if bad or missing else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], narrowed="--narrowed" in sys.argv[2:]))
