"""Keeping `caBundle` in our webhook configurations, and the CRD's conversion webhook, in step with the local CA.

What the bundle should hold (which CAs, in which order) is `desired_bundle` of cabundle.bundlepolicy.

Writes (`CABundleSyncer`) touch only `/webhooks/<i>/clientConfig/caBundle` of the configurations named
in `configs` (for a CustomResourceDefinition, `/spec/conversion/webhook/clientConfig/caBundle` of its
conversion webhook), via a JSON patch guarded by a `test` of `/metadata/resourceVersion`, and only when the
*set* of certificates differs from the desired one (or the field holds junk). Comparing sets, not bytes,
lets two replicas that merge in a different order agree instead of rewriting each other's ordering.
Optionally (`owner_marker`, default off) an object is touched only if it carries that label or
annotation, e.g. `app.kubernetes.io/managed-by: sidecarctl`, so that a configuration someone else
created under our name is left alone.

Writes per configuration are rate limited by a token bucket: `fast_retries` tokens (a few writes within
about a second, for conflicts and CA changes), refilled at one per `resync_interval`. Two writers that
genuinely disagree (e.g. an old replica that replaces the bundle) therefore cost at most
`fast_retries + minutes * 60 / resync_interval` writes each, not an Istio-style update storm.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from cabundle import metrics
from cabundle.bundlepolicy import bundle_differs, decode_bundle, desired_bundle, local_anchors
from cabundle.writebudget import WriteBudget
from kuberuntime import api as kube
from kuberuntime import backoff
from kuberuntime.clock import first_of, utc_now
from kuberuntime.jsontypes import resolve

log = logging.getLogger(__name__)

ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MANAGED_BY_MARKER = ("app.kubernetes.io/managed-by", "sidecarctl")
_CONVERSION_CLIENT = "/spec/conversion/webhook/clientConfig"


@dataclass(frozen=True)
class WebhookConfigRef:
    """One object we own that calls our webhooks: a webhook configuration (`mutating`, `validating`;
    `webhooks` limits the entries touched, None: all of them), or a CustomResourceDefinition whose
    conversion webhook we serve (`conversion`)."""

    kind: Literal["mutating", "validating", "conversion"]
    name: str
    webhooks: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("mutating", "validating", "conversion"):
            raise ValueError(f"kind: must be 'mutating', 'validating' or 'conversion', got {self.kind!r}")
        if not self.name or "/" in self.name:
            raise ValueError(f"name: must be a non-empty object name, got {self.name!r}")
        if self.kind == "conversion" and self.webhooks is not None:
            raise ValueError("webhooks: a CustomResourceDefinition has one conversion webhook, not named ones")

    @property
    def path(self) -> str:
        if self.kind == "conversion":
            return f"{CRD_API}/{self.name}"
        return f"{ADMISSION_API}/{self.kind}webhookconfigurations/{self.name}"


DEFAULT_CONFIGS = (
    WebhookConfigRef("mutating", "sidecarctl-injector"),
    WebhookConfigRef("validating", "sidecarctl-validator"),
)


class SyncResult(enum.Enum):
    IN_SYNC = "in_sync"
    WRITTEN = "written"
    CONFLICT = "conflict"
    THROTTLED = "throttled"
    MISSING = "missing"
    NOT_OWNED = "not_owned"
    INVALID = "invalid"
    NO_LOCAL_CA = "no_local_ca"
    ERROR = "error"


def _marked(obj: dict[str, Any], marker: tuple[str, str]) -> bool:
    meta = obj.get("metadata") or {}
    key, value = marker
    for field in ("labels", "annotations"):
        entries = meta.get(field) or {}
        if isinstance(entries, dict) and entries.get(key) == value:
            return True
    return False


class CABundleSyncer:
    def __init__(
        self,
        api: kube.Client,
        *,
        configs: Sequence[WebhookConfigRef] = DEFAULT_CONFIGS,
        local_ca_pem: bytes = b"",
        resync_interval: float = 30.0,
        owner_marker: tuple[str, str] | None = None,
        keep_existing: bool = True,
        fast_retries: int = 3,
        fast_retry_delay: float = 0.3,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        source: Callable[[], Awaitable[bytes | None]] | None = None,
    ) -> None:
        if resync_interval <= 0:
            raise ValueError(f"resync_interval: must be > 0, got {resync_interval}")
        if fast_retries < 1:
            raise ValueError(f"fast_retries: must be >= 1, got {fast_retries}")
        if fast_retry_delay < 0:
            raise ValueError(f"fast_retry_delay: must be >= 0, got {fast_retry_delay}")
        names = [c.path for c in configs]
        if len(set(names)) != len(names):
            raise ValueError("configs: the same configuration is listed twice")
        self._api = api
        self.configs = tuple(configs)
        self._local = local_ca_pem
        self.resync_interval = resync_interval
        self.owner_marker = owner_marker
        self.keep_existing = keep_existing
        # Read right before a write: the authoritative CA bundle (the self-signed Secret's ca.crt), so a
        # replica whose files are a moment behind never writes back a CA that was withdrawn.
        self._source = source
        self.fast_retry_delay = fast_retry_delay
        self._clock = clock
        self._mono = monotonic
        self._rng = rng or random.Random()
        start = monotonic()
        self._budgets = {
            ref: WriteBudget(burst=fast_retries, refill_interval=resync_interval, now=start) for ref in self.configs
        }
        self._wake = asyncio.Event()
        self._logged: set[tuple[str, str]] = set()
        self._error_streak: dict[WebhookConfigRef, int] = {}
        self.writes: dict[str, int] = {ref.name: 0 for ref in self.configs}
        self.conflicts: dict[str, int] = {ref.name: 0 for ref in self.configs}

    @property
    def write_count(self) -> int:
        return sum(self.writes.values())

    @property
    def local_ca_pem(self) -> bytes:
        return self._local

    def set_local_ca(self, ca_pem: bytes) -> None:
        """Called on every CA change (e.g. from `CertReloader(on_reload=...)`); wakes the loop."""
        if ca_pem != self._local:
            self._local = ca_pem
            self._wake.set()

    def notify(self) -> None:
        """Ask for a reconcile soon, e.g. on a watch event for one of the configurations."""
        self._wake.set()

    async def reconcile_once(self) -> dict[str, SyncResult]:
        """One pass over every configuration (no retries here; `run` schedules those)."""
        return {ref.name: await self._sync_safely(ref) for ref in self.configs}

    async def run(self, stop: asyncio.Event) -> None:
        inf = float("inf")
        next_resync = self._mono()
        retry_at: dict[WebhookConfigRef, float] = {}
        while not stop.is_set():
            now = self._mono()
            woken = self._wake.is_set()
            self._wake.clear()
            resync = now >= next_resync
            for ref in self.configs:
                if woken or resync or retry_at.get(ref, inf) <= now:
                    result = await self._sync_safely(ref)
                    delay = self._retry_delay(ref, result)
                    retry_at[ref] = inf if delay is None else self._mono() + delay
            if resync:
                next_resync = now + self.resync_interval
            deadline = min([next_resync, *retry_at.values()])
            await self._sleep(stop, deadline - self._mono())

    async def _sleep(self, stop: asyncio.Event, timeout: float) -> None:
        await first_of(stop.wait(), self._wake.wait(), timeout=timeout)

    def _retry_delay(self, ref: WebhookConfigRef, result: SyncResult) -> float | None:
        now = self._mono()
        budget = self._budgets[ref]
        if result is SyncResult.ERROR:
            streak = self._error_streak.get(ref, 0) + 1
            self._error_streak[ref] = streak
            base = max(self.fast_retry_delay, 0.1)
            return backoff.delay(streak, base=base, cap=self.resync_interval, jitter=(0.8, 1.2), rand=self._rng.random)
        self._error_streak.pop(ref, None)
        if result is SyncResult.CONFLICT:
            if budget.available(now):
                return self.fast_retry_delay * self._rng.uniform(0.5, 1.5)
            return budget.wait(now) * self._rng.uniform(1.0, 1.2)
        if result is SyncResult.THROTTLED:
            return budget.wait(now) * self._rng.uniform(1.0, 1.2)
        return None

    def _once(self, ref: WebhookConfigRef, what: str, message: str, *args: object) -> None:
        key = (ref.name, what)
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    def _clear_logged(self, ref: WebhookConfigRef) -> None:
        self._logged = {k for k in self._logged if k[0] != ref.name}

    async def _sync_safely(self, ref: WebhookConfigRef) -> SyncResult:
        try:
            return await self._sync(ref)
        except Exception as exc:
            self._once(ref, f"error:{type(exc).__name__}", "caBundle sync of %s failed: %s", ref.path, exc)
            return SyncResult.ERROR

    async def _sync(self, ref: WebhookConfigRef) -> SyncResult:
        now = self._clock()
        if not local_anchors(self._local, now):
            self._once(ref, "no-ca", "caBundle sync: no valid CA in the local ca.crt yet; not touching %s", ref.path)
            return SyncResult.NO_LOCAL_CA
        try:
            obj = await self._api.get(ref.path)
        except kube.NotFound:
            self._once(ref, "missing", "caBundle sync: %s does not exist; will look again", ref.path)
            return SyncResult.MISSING
        meta = obj.get("metadata")
        if not isinstance(meta, dict) or meta.get("name") != ref.name:
            self._once(ref, "invalid", "caBundle sync: %s answered with another object; skipped", ref.path)
            return SyncResult.INVALID
        if self.owner_marker is not None and not _marked(obj, self.owner_marker):
            self._once(
                ref,
                "not-owned",
                "caBundle sync: %s lacks the %s=%s label/annotation; not touching it",
                ref.path,
                *self.owner_marker,
            )
            return SyncResult.NOT_OWNED
        clients = self._clients(ref, obj)
        if clients is None:
            return SyncResult.INVALID
        ops = self._ops(clients, now)
        if ops and self._source is not None:
            latest = await self._source()
            if latest is not None and latest != self._local:
                self._local = latest  # our files are behind the Secret: publish what it says
                ops = self._ops(clients, now)
        if not ops:
            self._clear_logged(ref)
            return SyncResult.IN_SYNC
        if not self._budgets[ref].take(self._mono()):
            self._once(ref, "throttled", "caBundle sync: write budget for %s spent; retrying slowly", ref.path)
            return SyncResult.THROTTLED
        rv = meta.get("resourceVersion")
        guard = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] if rv else []
        try:
            await self._api.patch(ref.path, guard + ops, patch_type="json")
        except (kube.Conflict, kube.Invalid):  # a failed `test` of resourceVersion comes back as 422 Invalid
            self.conflicts[ref.name] += 1
            metrics.CABUNDLE_CONFLICTS.labels(configuration=ref.name).inc()
            log.info("caBundle sync: %s changed underneath (resourceVersion %s); will retry", ref.path, rv)
            return SyncResult.CONFLICT
        self.writes[ref.name] += 1
        metrics.CABUNDLE_WRITES.labels(configuration=ref.name).inc()
        log.info("caBundle sync: updated %d webhook(s) in %s", len(ops), ref.path)
        return SyncResult.WRITTEN

    def _clients(self, ref: WebhookConfigRef, obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]] | None:
        """(JSON pointer, clientConfig) of every webhook of `ref` to keep; None: the object is unusable."""
        if ref.kind == "conversion":
            conversion = resolve(obj, "spec", "conversion")
            if not isinstance(conversion, dict) or conversion.get("strategy") != "Webhook":
                self._once(ref, "invalid", "caBundle sync: %s has no conversion webhook; skipped", ref.path)
                return None
            client = resolve(conversion, "webhook", "clientConfig")
            if not isinstance(client, dict):
                self._once(ref, "noclient", "caBundle sync: %s has no conversion webhook clientConfig", ref.path)
                return []
            return [(_CONVERSION_CLIENT, client)]
        webhooks = obj.get("webhooks")
        if webhooks is None:
            webhooks = []
        if not isinstance(webhooks, list):
            self._once(ref, "invalid", "caBundle sync: %s .webhooks is not a list; skipped", ref.path)
            return None
        out: list[tuple[str, dict[str, Any]]] = []
        for i, hook in enumerate(webhooks):
            if not isinstance(hook, dict):
                continue
            if ref.webhooks is not None and hook.get("name") not in ref.webhooks:
                continue
            client = hook.get("clientConfig")
            if not isinstance(client, dict):
                self._once(ref, f"noclient:{i}", "caBundle sync: %s webhooks[%d] has no clientConfig", ref.path, i)
                continue
            out.append((f"/webhooks/{i}/clientConfig", client))
        return out

    def _ops(self, clients: list[tuple[str, dict[str, Any]]], now: datetime) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = []
        for pointer, client in clients:
            current = decode_bundle(client.get("caBundle"))
            desired = desired_bundle(current or b"", self._local, now=now, keep_existing=self.keep_existing)
            if current is not None and not bundle_differs(current, desired):
                continue
            ops.append(
                {
                    "op": "replace" if "caBundle" in client else "add",
                    "path": f"{pointer}/caBundle",
                    "value": base64.b64encode(desired).decode("ascii"),
                }
            )
        return ops
