"""A failed test's logs are copied out of pytest's base directory, and only the newest are kept."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from tests.kube import keptlogs


def test_logs_written_since_the_start_are_copied_and_older_ones_are_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "tmp"
    (root / "run").mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    old = root / "sidecarctl-old.log"
    old.write_text("before the test\n")
    os.utime(old, (time.time() - 60, time.time() - 60))
    (root / "sidecarctl-audit.log").write_text("manager\n")
    (root / "run" / "webhook.log").write_text("worker\n")
    (root / "tls.crt").write_text("not a log\n")

    kept = keptlogs.keep("tests/e2e/test_x.py::test_y[a b]", time.time() - 5, into=tmp_path / "kept")

    assert kept is not None and kept.parent == tmp_path / "kept"
    assert kept.name.endswith("-tests_e2e_test_x.py_test_y_a_b_")
    assert sorted(p.name for p in kept.iterdir()) == ["run__webhook.log", "sidecarctl-audit.log"]
    assert (kept / "sidecarctl-audit.log").read_text() == "manager\n"


def test_nothing_written_keeps_nothing_and_only_the_newest_failures_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    into = tmp_path / "kept"
    assert keptlogs.keep("t::quiet", time.time()) is None
    for i in range(keptlogs.KEPT + 3):
        (into / f"20260101T0000{i:02d}Z-t__{i}").mkdir(parents=True)
    (root / "m.log").write_text("x\n")
    kept = keptlogs.keep("t::last", time.time() - 5, into=into)
    left = sorted(p.name for p in into.iterdir())
    assert len(left) == keptlogs.KEPT and kept is not None and kept.name in left
    assert "20260101T000000Z-t__0" not in left
