"""`sidecarctl run`: flags (each with an environment variable) for the manager process.

Every flag can also come from `SIDECARCTL_<FLAG>` (upper case, dashes as underscores), so a
Deployment can be configured with env vars alone; a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from sidecarctl import logs
from sidecarsets import names

ENV_PREFIX = "SIDECARCTL_"


def _env(flag: str, default: Any) -> Any:
    value = os.environ.get(ENV_PREFIX + flag.upper().replace("-", "_"))
    if value is None:
        return default
    if isinstance(default, bool):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    if isinstance(default, list):
        return [v for v in value.split(",") if v]
    return value


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

    def opt(flag: str, default: Any, help: str, **kw: Any) -> None:
        env = ENV_PREFIX + flag.upper().replace("-", "_")
        p.add_argument(f"--{flag}", default=_env(flag, default), help=f"{help} [env {env}]", **kw)

    def switch(flag: str, default: bool, help: str) -> None:
        env = ENV_PREFIX + flag.upper().replace("-", "_")
        p.add_argument(
            f"--{flag}", default=_env(flag, default), action=argparse.BooleanOptionalAction, help=f"{help} [env {env}]"
        )

    opt("kubeconfig", None, "kubeconfig file; default: in-cluster service account, else $KUBECONFIG")
    opt(
        "namespace",
        os.environ.get("POD_NAMESPACE", names.DEFAULT_MANAGER_NAMESPACE),
        "the manager's own namespace (Lease, ControllerRevisions, Events, self-signed Secret; never injected)",
    )
    opt("webhook-bind", "0.0.0.0:9443", "HTTPS address for /inject and /validate-sidecarset")
    opt("probe-bind", "0.0.0.0:8080", "plain HTTP address for /metrics, /healthz, /readyz")
    opt("cert-dir", None, "directory with tls.crt, tls.key, ca.crt (cert-manager / Secret volume layout)")
    switch("self-signed", False, "create and rotate a CA and serving cert, stored in a Secret (no cert-manager)")
    opt("service-name", "sidecarctl-webhook", "Service name in the self-signed certificate's DNS names")
    opt("secret-name", "sidecarctl-webhook-certs", "Secret holding the self-signed CA and serving cert")
    opt("extra-dns", [], "extra DNS SAN for the self-signed serving cert (repeatable)", action="append")
    opt("extra-ip", [], "extra IP SAN for the self-signed serving cert (repeatable)", action="append")
    opt("mutating-config", names.MUTATING_WEBHOOK_CONFIG, "MutatingWebhookConfiguration whose caBundle is kept")
    opt("validating-config", names.VALIDATING_WEBHOOK_CONFIG, "ValidatingWebhookConfiguration whose caBundle is kept")
    switch("sync-ca-bundle", True, "keep caBundle in sync (turn off when cert-manager's cainjector does it)")
    opt("ca-bundle-resync", 30.0, "seconds between caBundle checks (repairs foreign writes)", type=float)
    opt("cert-poll-interval", 10.0, "seconds between full re-reads of the cert files", type=float)
    opt("cert-event-interval", 0.2, "seconds between cheap cert-dir change checks; 0 turns them off", type=float)
    switch("leader-elect", True, "run the controller only while holding the Lease")
    opt("lease-name", "sidecarctl-controller", "Lease name for leader election")
    opt("lease-duration", 15, "Lease duration in seconds", type=int)
    opt("renew-deadline", None, "seconds a leader keeps trying to renew; default 2/3 of the lease", type=float)
    opt("retry-period", None, "seconds between Lease attempts; default min(2, lease/5)", type=float)
    opt("identity", None, "leader election identity; default hostname-pid")
    opt("workers", 3, "SidecarSet reconcile workers", type=int)
    opt("log-level", "info", "debug, info, warning, error")
    opt("log-format", "json", "json or text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sidecarctl.manager import ManagerOptions, run_forever  # heavy imports only for this command

    logs.setup(args.log_level, args.log_format)
    if not args.cert_dir and not args.self_signed:
        raise SystemExit("sidecarctl run: error: one of --cert-dir DIR or --self-signed is required")
    # Every flag is named after the ManagerOptions field it sets (--extra-ip fills extra_ips).
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ManagerOptions) if hasattr(args, f.name)}
    given = {k: v for k, v in given.items() if v is not None}
    given["extra_dns"] = tuple(args.extra_dns)
    given["extra_ips"] = tuple(args.extra_ip)
    given.setdefault("renew_deadline", min(10.0, args.lease_duration * 2 / 3))
    given.setdefault("retry_period", min(2.0, args.lease_duration / 5))
    opts = ManagerOptions(**given)
    try:
        return run_forever(opts)
    except ValueError as e:  # a bad option combination, found while wiring the manager
        print(f"sidecarctl run: error: {e}", file=sys.stderr)
        return 2
