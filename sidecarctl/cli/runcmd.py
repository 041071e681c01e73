"""`sidecarctl run`: the manager's flags, derived from the option definitions (sidecarctl.manager.options).

Every flag can also come from `SIDECARCTL_<FLAG>` (upper case, dashes as underscores), so a
Deployment can be configured with env vars alone; a flag on the command line wins. A flag's type,
default and help come from its field, so they are written once.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from sidecarctl.manager import logs
from sidecarctl.manager.options import ManagerOptions, option_fields

ENV_PREFIX = "SIDECARCTL_"
# Defaults a Deployment provides through the downward API rather than a flag.
_ENV_DEFAULTS = {"namespace": "POD_NAMESPACE"}


def flag_name(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("flag") or f.name.replace("_", "-"))


def env_name(f: dataclasses.Field[Any]) -> str:
    return ENV_PREFIX + flag_name(f).upper().replace("-", "_")


def _parse_bool(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


def _parser(f: dataclasses.Field[Any]) -> Callable[[str], Any]:
    """How to read one value of the field from a string: its `parse`, else its default's type."""
    parse: Callable[[str], Any] = f.metadata.get("parse") or type(f.default)
    return parse


def _from_env(f: dataclasses.Field[Any], raw: str) -> Any:
    if isinstance(f.default, bool):
        return _parse_bool(raw)
    if isinstance(f.default, tuple):
        return [v for v in raw.split(",") if v]
    return _parser(f)(raw)


def _default(f: dataclasses.Field[Any]) -> Any:
    raw = os.environ.get(env_name(f))
    if raw is not None:
        try:
            return _from_env(f, raw)
        except ValueError:
            raise SystemExit(f"sidecarctl run: error: {env_name(f)}={raw!r} is not a valid value") from None
    fallback = _ENV_DEFAULTS.get(f.name)
    if fallback and os.environ.get(fallback):
        return os.environ[fallback]
    return list(f.default) if isinstance(f.default, tuple) else f.default


def _add(parser: argparse.ArgumentParser, f: dataclasses.Field[Any]) -> None:
    help_text = f"{f.metadata['help']} [env {env_name(f)}]"
    kwargs: dict[str, Any] = {"dest": f.name, "default": _default(f), "help": help_text}
    if isinstance(f.default, bool):
        kwargs["action"] = argparse.BooleanOptionalAction
    elif isinstance(f.default, tuple):
        kwargs["action"] = "append"
    else:
        kwargs["type"] = _parser(f)
    parser.add_argument(f"--{flag_name(f)}", **kwargs)


def add_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the manager: /inject and /validate-sidecarset webhooks, SidecarSet controller, cert watcher",
        description=(
            "Run the manager. Every flag can also be set with an environment variable SIDECARCTL_<FLAG> "
            "(e.g. SIDECARCTL_CERT_DIR); the command line wins."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in option_fields():
        _add(p, f)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sidecarctl.manager import preflight
    from sidecarctl.manager.supervisor import run_forever

    logs.setup(args.log_level, args.log_format)
    os.environ.update(SIDECARCTL_LOG_LEVEL=args.log_level, SIDECARCTL_LOG_FORMAT=args.log_format)  # for the children
    if not args.cert_dir and not args.self_signed:
        raise SystemExit("sidecarctl run: error: one of --cert-dir DIR or --self-signed is required")
    flat = {f.name: getattr(args, f.name) for f in option_fields() if f.name not in ("log_level", "log_format")}
    try:
        opts = ManagerOptions.build(**flat)
        problem = asyncio.run(preflight.policy_mode_problem(opts))
        if problem is not None:
            print(f"sidecarctl run: error: {problem}", file=sys.stderr)
            return 2
        return int(run_forever(opts))
    except ValueError as e:  # a bad option combination, found while wiring the manager
        print(f"sidecarctl run: error: {e}", file=sys.stderr)
        return 2
