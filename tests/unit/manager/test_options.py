"""The manager's options: one definition per option, flags and env vars derived from it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from kuberuntime.kubeapi import STALL_MARGIN
from sidecarctl.cli import runcmd
from sidecarctl.manager.options import GROUPS, LeaderOptions, ManagerOptions, option_fields


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sidecarctl")
    runcmd.add_run(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["run", *argv])


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for var in [v for v in os.environ if v.startswith(runcmd.ENV_PREFIX) or v == "POD_NAMESPACE"]:
        monkeypatch.delenv(var)


def test_every_option_has_help_and_a_unique_name() -> None:
    fields = list(option_fields())
    names = [f.name for f in fields]
    assert len(names) == len(set(names)), "a flat name must route to exactly one group"
    assert all(f.metadata.get("help") for f in fields)
    flags = [runcmd.flag_name(f) for f in fields]
    assert len(flags) == len(set(flags))


def test_defaults_of_flags_are_the_defaults_of_the_options() -> None:
    args = parse([])
    built = ManagerOptions.build(**{f.name: getattr(args, f.name) for f in option_fields() if f.name in _flat()})
    assert built == ManagerOptions()


def _flat() -> set[str]:
    return {f.name for kind in GROUPS.values() for f in dataclasses.fields(kind)} | {"kubeconfig", "namespace"}


def test_flags_env_vars_and_the_downward_api_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECARCTL_LEASE_DURATION", "6")
    monkeypatch.setenv("SIDECARCTL_SYNC_CA_BUNDLE", "false")
    monkeypatch.setenv("SIDECARCTL_EXTRA_IP", "10.0.0.1,10.0.0.2")
    monkeypatch.setenv("POD_NAMESPACE", "mesh-system")
    args = parse(["--cert-dir", "/certs", "--workers", "5", "--extra-dns", "a.example"])
    assert (args.lease_duration, args.sync_ca_bundle, args.extra_ips) == (6, False, ["10.0.0.1", "10.0.0.2"])
    assert (args.cert_dir, args.workers, args.extra_dns, args.namespace) == ("/certs", 5, ["a.example"], "mesh-system")


def test_the_command_line_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECARCTL_WORKERS", "9")
    assert parse(["--workers", "2"]).workers == 2


def test_a_bad_env_value_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECARCTL_LEASE_DURATION", "soon")
    with pytest.raises(SystemExit, match="SIDECARCTL_LEASE_DURATION='soon' is not a valid value"):
        parse([])


def test_build_routes_flat_names_to_their_groups_and_refuses_unknown_ones() -> None:
    opts = ManagerOptions.build(cert_dir="/c", lease_duration=6, workers=1, namespace="x", webhook_bind="1.2.3.4:1")
    assert (opts.tls.cert_dir, opts.leader.lease_duration, opts.controller.workers) == ("/c", 6, 1)
    assert (opts.namespace, opts.serving.webhook_bind) == ("x", "1.2.3.4:1")
    with pytest.raises(TypeError, match="unknown manager option 'bogus'"):
        ManagerOptions.build(bogus=1)


@pytest.mark.parametrize(("lease", "renew", "retry"), [(15, 10.0, 2.0), (3, 2.0, 0.6), (6, 4.0, 1.2)])
def test_lease_timings_default_to_client_go_ratios(lease: int, renew: float, retry: float) -> None:
    leader = LeaderOptions(lease_duration=lease)
    assert leader.effective_renew_deadline == pytest.approx(renew)
    assert leader.effective_retry_period == pytest.approx(retry)
    assert LeaderOptions(renew_deadline=3.0).effective_renew_deadline == 3.0
    assert leader.effective_identity and LeaderOptions(identity="me").effective_identity == "me"


def test_a_stalled_watch_is_noticed_within_a_minute_by_default_and_the_timeout_is_a_flag() -> None:
    default = ManagerOptions().watches.watch_timeout
    # The longest a silent stream is trusted: its timeout, the jitter (up to a fifth), the margin.
    assert default + default // 5 + STALL_MARGIN <= 60
    assert parse(["--watch-timeout", "10"]).watch_timeout == 10
    with pytest.raises(ValueError, match="--watch-timeout 0: at least 1 second"):
        ManagerOptions.build(watch_timeout=0)
