"""The logs a failed test wrote, copied where later runs do not delete them.

Why: every temporary file of a run lives under pytest's base directory, of which pytest keeps the
newest three, and one CI run makes five (the serial run, then one per older minor), so the manager
log of a test that failed in the serial run is gone by the time the run ends. The CI summary keeps
only the head of a long captured log. A copy under the machine's cache keeps the whole log.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import tempfile
from pathlib import Path

from tests.kube.images import cache_root

KEPT = 20  # failed tests whose logs are kept; the oldest go first


def keep(nodeid: str, since: float, *, into: Path | None = None) -> Path | None:
    """Copy every `*.log` under the temporary directory written since `since` (a test's start, as a
    time.time() value) into a directory named for the test; return it, or None when there was none.

    A log written by a process started before the test (a module's manager) counts: it was written
    while the test ran."""
    root = Path(tempfile.gettempdir())
    logs = [p for p in root.rglob("*.log") if p.is_file() and p.stat().st_mtime >= since]
    if not logs:
        return None
    base = into or cache_root() / "failed-tests"
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    target = base / f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', nodeid)[-120:]}"
    target.mkdir(parents=True, exist_ok=True)
    for log in logs:
        rel = log.relative_to(root)
        dest = target / "__".join(rel.parts)
        shutil.copyfile(log, dest)
    for old in sorted(p for p in base.iterdir() if p.is_dir())[:-KEPT]:
        shutil.rmtree(old, ignore_errors=True)
    return target
