"""The manager's options, grouped by what they configure, each defined once.

Every field carries its help text (and, where the flag name differs from the field name, the
flag); `sidecarctl run` builds its flags and their `SIDECARCTL_*` environment variables from these
definitions (sidecarctl.cli.runcmd), so a default is written in exactly one place. Field names are
unique across groups, so a flat `name=value` set (flags, test settings) routes to one field.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sidecarsets.spec import names

_DEFAULT_IDENTITY = f"{socket.gethostname()}-{os.getpid()}"


def opt(default: Any, help: str, *, flag: str | None = None, parse: Callable[[str], Any] | None = None) -> Any:
    """A field with its flag's help text; `parse` reads a value of a field whose default is None."""
    metadata = {"help": help, "flag": flag, "parse": parse}
    if isinstance(default, list | dict):
        raise TypeError("use a tuple for sequence defaults")
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ServingOptions:
    webhook_bind: str = opt("0.0.0.0:9443", "HTTPS address for /inject and /validate-sidecarset")
    probe_bind: str = opt(
        "0.0.0.0:8080", "plain HTTP address for /healthz, /readyz (and /metrics unless --metrics-bind)"
    )
    metrics_bind: str = opt("", "serve /metrics here instead of on the probe port (with --metrics-secure: over HTTPS)")
    metrics_secure: bool = opt(
        False, "/metrics over HTTPS, callers authenticated and authorized by the API server (TokenReview, SAR)"
    )
    webhook_workers: int = opt(0, "admission worker processes; 0: as many as CPUs this process may use")
    enable_http2: bool = opt(False, "offer HTTP/2 on the webhook port (off: HTTP/1.1 only, as kubebuilder advises)")


@dataclass(frozen=True)
class BudgetOptions:
    """What one admission worker lets clients hold; each bound answers cleanly when hit."""

    max_connections: int = opt(4096, "open webhook connections per worker (beyond: closed at once)")
    max_tls_connections: int = opt(256, "webhook connections in TLS at once per worker (each holds TLS buffers)")
    handshake_timeout: float = opt(10.0, "seconds for a new connection to send its ClientHello and finish TLS")
    header_timeout: float = opt(10.0, "seconds from a request's first byte to its complete headers")
    body_timeout: float = opt(10.0, "seconds from a request's headers to its complete body (then 408)")
    keep_alive_timeout: float = opt(75.0, "seconds an idle keep-alive connection is kept")
    max_json_values: int = opt(100_000, "JSON values an AdmissionReview may hold (checked before parsing; 413)")
    body_budget_mib: int = opt(64, "MiB of request bodies (and their parsed form) a worker holds at once (429)")
    h2_max_streams: int = opt(100, "concurrent HTTP/2 streams per connection (with --enable-http2)")
    max_requests_per_connection: int = opt(10_000, "requests per connection before it is closed")
    namespace_lookup_timeout: float = opt(
        2.0,
        "seconds admission may spend reading the API server: a namespace the watch has not delivered yet, the "
        "running pods a SidecarSet update that tightens spec.overrides may leave outside the bounds (warned about), "
        "or a reconnecting SidecarSet watch a pod waits for (then decided from the snapshot, warned about)",
    )


@dataclass(frozen=True)
class TLSOptions:
    cert_dir: str | None = opt(
        None, "directory with tls.crt, tls.key, ca.crt (cert-manager / Secret volume layout)", parse=str
    )
    self_signed: bool = opt(False, "create and rotate a CA and serving cert, stored in a Secret (no cert-manager)")
    service_name: str = opt("sidecarctl-webhook", "Service name in the self-signed certificate's DNS names")
    secret_name: str = opt("sidecarctl-webhook-certs", "Secret holding the self-signed CA and serving cert")
    extra_dns: tuple[str, ...] = opt((), "extra DNS SAN for the self-signed serving cert (repeatable)")
    extra_ips: tuple[str, ...] = opt((), "extra IP SAN for the self-signed serving cert (repeatable)", flag="extra-ip")
    cert_poll_interval: float = opt(10.0, "seconds between full re-reads of the cert files")
    # Cheap change checks between full polls (stands in for file events); 0 turns them off.
    cert_event_interval: float = opt(0.2, "seconds between cheap cert-dir change checks; 0 turns them off")


@dataclass(frozen=True)
class CABundleOptions:
    sync_ca_bundle: bool = opt(True, "keep caBundle in sync (turn off when cert-manager's cainjector does it)")
    ca_bundle_resync: float = opt(30.0, "seconds between caBundle checks (repairs foreign writes)")
    ca_bundle_policy: str = opt(
        "auto",
        "exact: caBundle holds exactly our ca.crt (a CA removed from it is withdrawn); merge: valid CAs already "
        "in caBundle stay until they expire (for issuers whose ca.crt drops the old CA on rotation); "
        "auto: exact with --self-signed, merge with --cert-dir",
    )
    mutating_config: str = opt(names.MUTATING_WEBHOOK_CONFIG, "MutatingWebhookConfiguration whose caBundle is kept")
    validating_config: str = opt(
        names.VALIDATING_WEBHOOK_CONFIG, "ValidatingWebhookConfiguration whose caBundle is kept"
    )
    conversion_crd: str = opt(
        names.CRD_NAME, "CustomResourceDefinition whose conversion webhook caBundle is kept; empty: none"
    )


@dataclass(frozen=True)
class LeaderOptions:
    leader_elect: bool = opt(True, "run the controller only while holding the Lease")
    lease_name: str = opt("sidecarctl-controller", "Lease name for leader election")
    lease_duration: int = opt(15, "Lease duration in seconds")
    renew_deadline: float | None = opt(
        None, "seconds a leader keeps trying to renew; default 2/3 of the lease, at most 10", parse=float
    )
    retry_period: float | None = opt(None, "seconds between Lease attempts; default lease/5, at most 2", parse=float)
    identity: str | None = opt(None, "leader election identity; default hostname-pid", parse=str)

    # Derived defaults: client-go's ratio of renew deadline and retry period to the lease.
    @property
    def effective_renew_deadline(self) -> float:
        return self.renew_deadline if self.renew_deadline is not None else min(10.0, self.lease_duration * 2 / 3)

    @property
    def effective_retry_period(self) -> float:
        return self.retry_period if self.retry_period is not None else min(2.0, self.lease_duration / 5)

    @property
    def effective_identity(self) -> str:
        return self.identity or _DEFAULT_IDENTITY


@dataclass(frozen=True)
class WatchOptions:
    """Every watch of the manager's caches (kuberuntime.informer): how long one stream is held open.

    A stream silent STALL_MARGIN (10) seconds past its own timeout is taken as stalled and restarted,
    so the default notices a stream that stops delivering without closing within 40 + 8 + 10 = 58 s.
    """

    watch_timeout: int = opt(
        40,
        "seconds each watch asks the API server to hold it open (plus up to a fifth, jittered); "
        "a stream silent 10 s past that is restarted",
    )

    discovery_interval: float = opt(
        30.0,
        "seconds between reads of the API server's discovery: an API it starts serving (an upgraded "
        "control plane, a beta turned on) is used, and one it stops serving is left, within this time",
    )

    def __post_init__(self) -> None:
        if self.watch_timeout < 1:
            raise ValueError(f"--watch-timeout {self.watch_timeout}: at least 1 second")
        if self.discovery_interval <= 0:
            raise ValueError(f"--discovery-interval {self.discovery_interval}: more than 0 seconds")


@dataclass(frozen=True)
class ControllerOptions:
    workers: int = opt(3, "SidecarSet reconcile workers")


@dataclass(frozen=True)
class MissedOptions:
    """Pods that run without the sidecars their SidecarSets select (sidecarsets.controller.missedscan)."""

    missed_scan_interval: float = opt(
        60.0, "seconds between looks for running pods that lack their sidecars; 0: never look"
    )
    recreate_missed: bool = opt(
        False,
        "evict such pods that a controller owns (PodDisruptionBudgets honoured), so they come back injected; "
        "needs the pods/eviction rule of config/components/recreate-missed",
    )
    recreate_missed_per_minute: float = opt(6.0, "at most this many evictions per minute with --recreate-missed")


INJECTION_MODES = ("auto", "webhook", "policy")


@dataclass(frozen=True)
class InjectionOptions:
    injection: str = opt(
        "auto",
        "auto: MutatingAdmissionPolicies inject every SidecarSet they can express and the webhook the rest; "
        "webhook: the webhook injects every pod; policy: policies only (a SidecarSet a policy cannot serve is refused)",
    )
    policy_settle: float = opt(
        2.0,
        "seconds a new or changed policy is given to be compiled before the canary's barrier asks whether every "
        "kube-apiserver enforces it; the webhook stops taking its pods only once one does",
    )
    policy_pace: float = opt(
        1.0,
        "after a policy write that took T seconds (kube-apiserver compiling its CEL), the next waits this "
        "times T; the webhook serves the SidecarSets waiting meanwhile",
    )
    policy_quiet: float = opt(
        1.0,
        "a policy write waits until no SidecarSet was created or changed for this many seconds "
        "(at most 10 s), so a burst is written once",
    )
    namespaced_sidecarsets: bool = opt(
        True,
        "serve NamespacedSidecarSets (tenant sidecars); off: every one is refused at admission and none is "
        "injected, status-kept or rolled out, in every namespace",
    )

    def __post_init__(self) -> None:
        if self.injection not in INJECTION_MODES:
            raise ValueError(f"--injection {self.injection!r}: use auto, webhook or policy")


@dataclass(frozen=True)
class LogOptions:
    log_level: str = opt("info", "debug, info, warning, error")
    log_format: str = opt("json", "json or text")


GROUPS: dict[str, type[Any]] = {
    "serving": ServingOptions,
    "budgets": BudgetOptions,
    "tls": TLSOptions,
    "ca_bundle": CABundleOptions,
    "leader": LeaderOptions,
    "controller": ControllerOptions,
    "watches": WatchOptions,
    "injection": InjectionOptions,
    "missed": MissedOptions,
}


@dataclass(frozen=True)
class ManagerOptions:
    kubeconfig: str | None = opt(
        None,
        "kubeconfig file; default: $KUBECONFIG, else the in-cluster service account, else ~/.kube/config",
        parse=str,
    )
    namespace: str = opt(
        names.DEFAULT_MANAGER_NAMESPACE,
        "the manager's own namespace (Lease, ControllerRevisions, Events, self-signed Secret; never injected); "
        "default $POD_NAMESPACE",
    )
    serving: ServingOptions = field(default_factory=ServingOptions)
    budgets: BudgetOptions = field(default_factory=BudgetOptions)
    tls: TLSOptions = field(default_factory=TLSOptions)
    ca_bundle: CABundleOptions = field(default_factory=CABundleOptions)
    leader: LeaderOptions = field(default_factory=LeaderOptions)
    controller: ControllerOptions = field(default_factory=ControllerOptions)
    watches: WatchOptions = field(default_factory=WatchOptions)
    injection: InjectionOptions = field(default_factory=InjectionOptions)
    missed: MissedOptions = field(default_factory=MissedOptions)

    @classmethod
    def build(cls, **flat: Any) -> ManagerOptions:
        """Options from flat `field=value` pairs (the flags, or test settings); unknown names raise."""
        groups: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
        top: dict[str, Any] = {}
        owner = {f.name: group for group, kind in GROUPS.items() for f in dataclasses.fields(kind)}
        for key, value in flat.items():
            value = tuple(value) if isinstance(value, list) else value  # argparse's repeatable flags
            if key in owner:
                groups[owner[key]][key] = value
            elif key in ("kubeconfig", "namespace"):
                top[key] = value
            else:
                raise TypeError(f"unknown manager option {key!r}")
        return cls(**top, **{group: GROUPS[group](**values) for group, values in groups.items()})

    def flat(self) -> dict[str, Any]:
        """The inverse of `build`: every option by its field name (JSON-friendly)."""
        out: dict[str, Any] = {"kubeconfig": self.kubeconfig, "namespace": self.namespace}
        for group in GROUPS:
            for f in dataclasses.fields(getattr(self, group)):
                value = getattr(getattr(self, group), f.name)
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def option_fields() -> Iterator[dataclasses.Field[Any]]:
    """Every leaf option of `sidecarctl run`, in help order."""
    for f in dataclasses.fields(ManagerOptions):
        if f.name not in GROUPS:
            yield f
    for kind in (*GROUPS.values(), LogOptions):
        yield from dataclasses.fields(kind)
