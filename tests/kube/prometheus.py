"""Prometheus and promtool for the alert tests and the Prometheus e2e test: the binaries
tools/build-prometheus.sh keeps in its cache (built from the Prometheus Go module, never looked up
on PATH, so the tests run the version the project pins).

`binaries()` runs the build script, a hash check once built (tools/setup.sh builds them); under
CI=true a missing Go toolchain or a failed build fails the test instead of skipping it.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest

from tests.kube.ci import IN_CI
from tests.kube.controlplane import REPO

BUILD_SCRIPT = REPO / "tools" / "build-prometheus.sh"


@functools.cache
def _built() -> Path | str:
    try:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{BUILD_SCRIPT.name} could not run: {e}"
    if proc.returncode != 0:
        return f"{BUILD_SCRIPT.name} failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
    return Path(proc.stdout.strip().splitlines()[-1])


def binaries() -> Path:
    """The directory holding `prometheus` and `promtool`; skips (fails under CI=true) when they cannot be built."""
    built = _built()
    if isinstance(built, Path):
        return built
    if IN_CI:
        pytest.fail(f"Prometheus is needed under CI=true: {built}", pytrace=False)
    pytest.skip(built)
