"""The `sidecarctl` command line.

Each subcommand is registered by a small `add_<name>` function of its own module
(`sidecarctl.cli.injectcmd`, `sidecarctl.cli.runcmd`, `sidecarctl.cli.previewcmd`, `sidecarctl.cli.statuscmd`,
`sidecarctl.cli.checkinject`), so commands stay independent and `main` only parses and dispatches.
Bad input ends with one line on stderr and exit status 1, a bad command line with argparse's usage
message and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from sidecarctl.cli.checkinject.command import add_check_inject
from sidecarctl.cli.injectcmd import add_inject
from sidecarctl.cli.previewcmd import add_preview
from sidecarctl.cli.runcmd import add_run
from sidecarctl.cli.statuscmd import add_status
from sidecarctl.manager import version

_COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    add_inject,
    add_run,
    add_preview,
    add_status,
    add_check_inject,
]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line, every subcommand included (also what docs/reference/cli.md is generated from)."""
    parser = argparse.ArgumentParser(
        prog="sidecarctl", description="Kubernetes sidecar injector and SidecarSet manager."
    )
    parser.add_argument("--version", action="version", version=f"sidecarctl {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `sidecarctl`; return the exit status (argparse usage errors exit 2 on their own)."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print(f"sidecarctl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
