"""The audit log is read in whole lines while kube-apiserver appends to it."""

from __future__ import annotations

from pathlib import Path

from tests.kube.audit import audit_lines


def test_a_line_cut_at_the_start_and_one_still_being_written_are_left_out(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_bytes(b'{"n":1}\n{"n":2}\n{"n":3}\n{"n":')
    cut = len(b'{"n":1}\n{"n"')  # a size taken while line 2 was written
    assert list(audit_lines(log, cut)) == [b'{"n":3}']
    assert list(audit_lines(log, len(b'{"n":1}\n'))) == [b'{"n":2}', b'{"n":3}']  # at a boundary: from there
    assert list(audit_lines(log)) == [b'{"n":1}', b'{"n":2}', b'{"n":3}']
    with log.open("ab") as f:
        f.write(b"4}\n\n")
    assert list(audit_lines(log, cut)) == [b'{"n":3}', b'{"n":4}']
    assert list(audit_lines(log, log.stat().st_size)) == []
