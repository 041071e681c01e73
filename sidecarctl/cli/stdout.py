"""Writing a command's output to stdout without a traceback, whatever stdout turns out to be.

`sidecarctl inject ... | head` closes the pipe early and `> /dev/full` fails every write; Python
would then print a BrokenPipeError traceback, also from its own final flush at exit. Every command
writes through here: the whole buffer or a `CliError` with one line, and stdout pointed at
/dev/null afterwards so that the interpreter's last flush stays quiet.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

from sidecarctl.cli.clierror import CliError


def write_stdout(data: bytes) -> None:
    """Write all of `data`; a closed pipe or a full disk is a CliError, never a traceback."""
    try:
        stdout = sys.stdout.buffer
        view = memoryview(data)
        while view:
            # A pipe closed halfway through gives a short count first; the next write raises.
            written = stdout.write(view)
            if not written:
                raise OSError(errno.EIO, "nothing could be written")
            view = view[written:]
        stdout.flush()
    except BrokenPipeError:
        discard_stdout()
        raise CliError("stdout was closed before all of the output was written") from None
    except OSError as e:
        discard_stdout()
        raise CliError(f"cannot write to stdout: {e.strerror or e}") from None


def discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush cannot fail with a traceback."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
