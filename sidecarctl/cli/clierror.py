"""The one error every command shows as it is: one line naming what and why, and a non-zero exit.

Raised by the input readers, the cluster reads and the output writers of every command, and caught
by each command's runner, so it lives apart from any of them.
"""

from __future__ import annotations


class CliError(Exception):
    """Bad input: the message (one line, naming the file and the reason) is shown as is."""
