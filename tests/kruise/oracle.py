"""OpenKruise v1.9.1's own Go code as a process: the differential tier's reference.

`tools/build-kruise-oracle.sh` builds `tests/kruise/oracle/` (a Go program importing
`github.com/openkruise/kruise` at exactly v1.9.1) once and caches the binary outside the repository;
`.ci/run` runs that script. The process reads one JSON request per line and answers one JSON line
per request, so a whole corpus is one process start (about 0.1 s) and a few milliseconds per case.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

KRUISE_VERSION = "v1.9.1"


def binary() -> Path:
    cache = Path(os.environ.get("SIDECARCTL_CACHE") or Path.home() / ".cache" / "sidecarctl")
    return cache / "kruise" / KRUISE_VERSION / "kruise-oracle"


class Oracle:
    """One long-lived oracle process; `ask` sends requests in order and returns their answers."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )

    def ask(self, requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        answers = []
        for request in requests:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"kruise oracle exited ({self.proc.poll()}) on {request['op']}")
            answers.append(json.loads(line))
        return answers

    def one(self, request: dict[str, Any]) -> dict[str, Any]:
        return self.ask([request])[0]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)
