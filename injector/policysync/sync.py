"""Keeps the plan in the API server: the policies, bindings and parameter objects, and the webhook's
narrowing condition.

Run by the leader only. Every change (a SidecarSet, one of our policies or bindings, the
MutatingWebhookConfiguration) marks the state dirty; one pass then makes the API server match the
plan, so a hand-edited or deleted policy is put back, and a hand-edited condition too.

Make before break. A policy is enforced only after the API server's next recompile (about a second, more for a
large policy, much more under load); the webhook's condition takes effect at once. So a pass that creates or changes
a policy first widens the webhook to every pod that policy's SidecarSets select, writes the policy, and narrows the
webhook again once it can have been compiled (`settle` seconds, plus five per MB of policy) and the canary's barrier
shows it enforced (support.SupportProbe.caught_up). Meanwhile those pods also go through the webhook; it finds them
either injected by the policy at the current hash (and leaves them) or not, or at an older hash (and injects the
current one), so every pod gets one complete set. The same order moves a SidecarSet from a policy to the webhook:
the webhook is widened, and the policy is deleted only `settle` seconds later, so a kube-apiserver that sees the
deletion before the widened condition (each follows its own watches) still has one of the two. Until support is
known (injector.policysync.support) nothing is narrowed: the webhook serves all, and the first narrowing waits
for the SidecarSet watches to catch up with a quorum read (`catch_up`; why in injector.policysync.widening).

A change of image alone changes only a policy's parameter object (injector.policy.params), not its CEL: it is
written at once, with no widening and no pace, since the API server compiles nothing for it, and pods created
meanwhile get the previous version whole (image, hash and revision together) until its informer has the new one,
as they would from a webhook whose watch is a moment behind. The parameter object is written before its policy
and deleted `settle` seconds after its policy and binding are gone.

When policies may be used at all (discovery, the support probe, and how often each is asked) is
injector.policysync.adoption's. Whether the API is served at all comes from discovery, which the composition
root reads and reads again (`set_served`): an API server without it (Kubernetes before 1.36) gets no policy, no
watch of policies, and a webhook that serves every pod; one upgraded to serve it is probed and used next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
import orjson

from injector.policy import plan as planning
from injector.policy.generate import Generated, covers
from injector.policy.params import path as params_path
from injector.policy.partscache import PartsCache, plans_alike
from injector.policysync import desired
from injector.policysync.adoption import Adoption
from injector.policysync.narrowing import Narrowing
from injector.policysync.pacing import MAX_QUIET_SECONDS, WritePacing, is_news, routes_so_far, spaced
from injector.policysync.retiring import HandOver, OldKeys, UnusedParams
from injector.policysync.stored import LastWritten, changed_members, members, name_of, older, params_current, put
from injector.policysync.support import CANARY, PolicyApi, Probe, SupportProbe
from injector.policysync.widening import Widening
from kuberuntime import api
from kuberuntime.clock import first_of, now_rfc3339
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.model import ModelError, SidecarSet, object_key

log = logging.getLogger(__name__)

MANAGED_SELECTOR = "app.kubernetes.io/managed-by=sidecarctl"
# A large policy compiles longer: 200 containers (1.2 MB) enforced 5.8 s after stored, 100 (0.8 MB) 4.3 s.
SETTLE_PER_BYTE = 5.0 / 1_000_000


class PolicySync:
    """`on_*` are informer handlers; `run` is the loop; `routes` is what the PolicyInjection condition reports."""

    def __init__(
        self,
        client: api.Client,
        *,
        mode: planning.Mode,
        manager_namespace: str,
        webhook_config: str = names.MUTATING_WEBHOOK_CONFIG,
        webhook_name: str = names.MUTATING_WEBHOOK_NAME,
        settle: float = 2.0,
        pacing: tuple[float, float, float] = (1.0, 1.0, MAX_QUIET_SECONDS),
        probe: Probe | None = None,
        unenforced_recheck: float = 30.0,
        on_routes: Callable[[set[str]], None] | None = None,
        may_write: Callable[[], Awaitable[bool]] | None = None,
        catch_up: Callable[[], Awaitable[object]] | None = None,
        clock: Callable[[], str] = now_rfc3339,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.mode, self.manager_namespace = client, mode, manager_namespace
        self.narrowing = Narrowing(client, config=webhook_config, webhook=webhook_name)
        self.settle = settle
        pace, quiet, max_quiet = pacing  # injector.policysync.pacing: (pace, quiet, max_quiet)
        self.pacing = WritePacing(pace=pace, quiet=quiet, max_quiet=max_quiet, monotonic=monotonic)
        self.write_at: float | None = None  # a policy write held back until then
        self.support = Adoption(
            mode,
            probe or SupportProbe(client, namespace=manager_namespace),
            unenforced_recheck=unenforced_recheck,  # served but not enforced by every kube-apiserver: asked this soon
            monotonic=monotonic,
        )
        self.on_routes = on_routes
        self.may_write = may_write
        self.catch_up = catch_up  # the SidecarSet watches brought up to a quorum read (Widening.with_news)
        self.clock = clock
        self.monotonic = monotonic
        self.models: dict[str, SidecarSet] = {}  # the last version of each SidecarSet that could be read
        self.cache = PartsCache()  # groups generated by earlier passes
        # Our stored policies, bindings and parameter objects, as the watches see them.
        self.policies: dict[str, JsonObj] = {}
        self.bindings: dict[str, JsonObj] = {}
        self.params: dict[str, JsonObj] = {}
        self.written = LastWritten()
        self.routes: dict[str, planning.Route] = {}
        self.refused: dict[tuple[str, str], str] = {}  # (SidecarSet, hash) -> the API server's refusal
        self.narrow_at: float | None = None  # when the widened webhook may be narrowed again
        self.hand_over = HandOver(settle, monotonic)  # policies of SidecarSets moved to the webhook
        self.unused_params = UnusedParams(settle, monotonic)
        self.old_keys = OldKeys(settle, monotonic)
        # SidecarSets whose policy was just written, or new since a pass planned: the webhook takes their pods too
        self.widening = Widening(self.models, self._set_condition, may_write)
        self.dirty = asyncio.Event()
        self.arrivals = asyncio.Event()  # one created, deleted or changed (not a status write): pass at once
        self.passes = 0

    # -- informer handlers ---------------------------------------------------------------------------
    def on_sidecarset(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        name = object_key(new or old)  # a NamespacedSidecarSet as `<namespace>/<name>`
        before = self.models.get(name)
        if kind == "DELETED" or new is None:
            self.models.pop(name, None)
        else:
            try:
                self.models[name] = SidecarSet.from_object(new)
            except ModelError as e:  # as the webhook's store: keep serving the last good version
                log.error("SidecarSet %s is unusable, its policy keeps the previous version: %s", name, e)
        after = self.models.get(name)
        if before is not None and after is not None and plans_alike(before, after):
            return  # a status write: the plan is the same (during a burst, thousands of them)
        if after is None or is_news(before, after):
            self.pacing.arrived()
            self.arrivals.set()
        self.dirty.set()
        self.widening.news.set()

    def _keep(self, into: dict[str, JsonObj], kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        name = name_of(new or old)
        if kind == "DELETED" or new is None:
            into.pop(name, None)
        elif not older(new, into.get(name)):  # our own write's answer may have been kept already
            into[name] = new
        self.dirty.set()

    def on_policy(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        self._keep(self.policies, kind, old, new)

    def on_binding(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        self._keep(self.bindings, kind, old, new)

    def on_params(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        self._keep(self.params, kind, old, new)

    def on_webhook_config(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if self.narrowing.on_webhook_config(kind, old, new):
            self.dirty.set()

    def set_served(self, policy_api: PolicyApi | None, why_not: str = "") -> None:
        """What discovery lists: the policy API to use (its watches already synced into `policies`
        and `bindings`), or None and why. A change is checked on the next pass."""
        if not self.support.served(policy_api, why_not):
            return
        if policy_api is None:  # its watches are gone (or not listed yet): theirs fill these again
            self.policies.clear()
            self.bindings.clear()
            self.params.clear()
        self.dirty.set()

    # -- the loop --------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.support.check_if_due()
            self.dirty.clear()
            self.arrivals.clear()
            started = self.monotonic()
            try:
                await self.sync_once()
            except (api.ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
                if stop.is_set():
                    return
                log.warning("policy sync: %s; retrying", api.reason(e))
                self.dirty.set()
                await asyncio.sleep(1.0)
            except Exception:  # a bug must not end the leader's term: say so and keep the last state
                log.exception("policy sync failed; retrying")
                self.dirty.set()
                await asyncio.sleep(5.0)
            first = self.support.until_recheck() if self.narrow_at is None else self.narrow_at - self.monotonic()
            times = (self.write_at, self.hand_over.at, *self.unused_params.times(), *self.old_keys.times())
            timeout = min([first, *(at - self.monotonic() for at in times if at is not None)])
            try:
                await self.widening.between_passes(first_of(self.dirty.wait(), stop.wait(), timeout=timeout))
            except (api.ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
                log.warning("policy sync: widening for a new SidecarSet: %s; the next pass does", api.reason(e))
            await spaced(self.dirty, self.arrivals, stop, started, self.monotonic)

    def plan(self) -> planning.Plan:
        refused = {name: msg for (name, h), msg in self.refused.items() if (m := self.models.get(name)) and m.hash == h}
        return planning.plan(
            self.models.values(),
            mode=self.mode,
            manager_namespace=self.manager_namespace,
            timestamp=desired.STAMP,
            unsupported=self.support.unsupported,
            refused=refused,
            previous={m: name for name, policy in self.policies.items() for m in members(policy)},
            cache=self.cache,
            await_revisions=True,
        )

    async def sync_once(self) -> None:
        """One pass: make the stored policies, bindings and webhook condition match the plan."""
        self.passes += 1
        self.write_at = None
        self.widening.written = None  # until this pass writes its condition
        if not self.support.known:
            pending = planning.Route(planning.Path.WEBHOOK, planning.Why.PENDING, "detecting policy support")
            self._publish(dict.fromkeys(self.models, pending))
            return
        planned = dict(self.models)
        p = self.plan()
        policies, bindings, params = desired.objects(
            p.policies, stored=self.policies, stored_params=self.params, models=self.models, clock=self.clock
        )
        changed = [g for g in p.policies if not self._current(g, policies, bindings)]
        stale_policies = [n for n in self.policies if n not in policies and n != CANARY]
        stale_bindings = [n for n in self.bindings if n not in bindings and n != CANARY]
        held = {*params, CANARY, *self.policies, *self.bindings}
        stale_params = self.unused_params.due(n for n in self.params if n not in held)
        if self.may_write is not None and not await self.may_write():
            return
        now = self.monotonic()
        sizes = {g.name: len(orjson.dumps(policies[g.name])) for g in changed}  # serialized once a pass
        if changed:
            self.widening.settling |= {
                m for g in changed for m in changed_members(self.policies.get(g.name), g.digests, desired.ANN_DIGESTS)
            }
            self.narrow_at = max(self.narrow_at or 0.0, now + self.settle + sum(sizes.values()) * SETTLE_PER_BYTE)
        elif self.narrow_at is not None and now >= self.narrow_at:
            await self._narrow_once_enforced(p, planned)
        params = self.old_keys.kept(params, self.params, settling=self.narrow_at is not None)
        # Only the values a new image changes: no CEL to compile, so no widening and no pace.
        values_only = [g for g in p.policies if g not in changed and not self._params_current(g, params)]
        # Widened while settling: the webhook also takes every pod a not-yet-enforced policy would serve.
        condition = self._widened(p, self.widening.settling)
        handed = self.hand_over.handed(stale_policies, self.policies, p.routes)  # before any await: watches change it
        if self.catch_up is not None and not self.support.serves_all and self.narrowing.first_narrowing(condition):
            await self.catch_up()  # the first narrowing: every SidecarSet stored by now is widened for below
        condition = self.widening.with_news(condition, planned, new_only=True)
        keep = self.hand_over.keep(handed, await self._set_condition(condition))
        condition = await self.widening.for_news(condition, planned, new_only=True)
        refused = False
        if not changed:
            self.pacing.idle()
        for g in values_only:
            await self._put_params(params[g.name])
        for i, g in enumerate(changed):
            if (due := self.pacing.due(awaiting=bool(p.awaiting))) > self.monotonic():
                self.write_at = due  # the webhook serves the rest meanwhile; planned again then
                await self._delete_stale(stale_policies, stale_bindings, stale_params, orphans_only=True)
                return self._publish(routes_so_far(p.routes, self.routes, {w.name for w in changed[i:]}))
            started = self.monotonic()
            objects = (policies[g.name], bindings[g.name], params[g.name])
            stored, condition = await self.widening.during(self._write(g, *objects), condition, planned)
            refused |= not stored
            done = self.monotonic()
            self.pacing.wrote(started, done)
            # Widened until enforceable: from the write's end, plus as long again as it took (compiled again).
            self.narrow_at = max(
                self.narrow_at or 0, done + self.settle + sizes[g.name] * SETTLE_PER_BYTE + done - started
            )
        await self._delete_stale(stale_policies, stale_bindings, stale_params, keep=keep)
        if refused:
            self.dirty.set()  # plan again with those SidecarSets on the webhook
            return
        self._publish(p.routes)

    def _widened(self, p: planning.Plan, settling: set[str]) -> str:
        """The webhook's condition of plan `p`, widened to every pod the SidecarSets named `settling` select."""
        return p.condition([ss for name, ss in self.models.items() if name in settling])

    async def _narrow_once_enforced(self, p: planning.Plan, planned: dict[str, SidecarSet]) -> None:
        """Stop widening for the SidecarSets settling now once the canary's barrier shows every kube-apiserver
        enforcing what was written (SidecarSets arriving meanwhile are widened for, and settle on); if it does
        not, the webhook keeps their pods and the barrier is asked again `settle` seconds on."""
        before = set(self.widening.settling)
        widened = self._widened(p, before)  # as the pass writes it
        enforced, _ = await self.widening.during(self.support.caught_up(), widened, planned)
        self.widening.settling -= before if enforced else set()
        self.narrow_at = self.monotonic() + self.settle if self.widening.settling else None

    async def _delete_stale(
        self,
        policies: list[str],
        bindings: list[str],
        params: list[str],
        *,
        orphans_only: bool = False,
        keep: frozenset[str] = frozenset(),
    ) -> None:
        """`orphans_only` (writes waiting): only policies whose SidecarSets are all gone (a mass delete has no pace).
        `keep`: policies handed over to the webhook, not settled yet. `params`: those no policy or binding holds."""
        if orphans_only:
            orphan = {n for n, p in self.policies.items() if not any(m in self.models for m in members(p))}
            policies, bindings = [n for n in policies if n in orphan], [n for n in bindings if n in orphan]
        if keep:
            policies, bindings = [n for n in policies if n not in keep], [n for n in bindings if n not in keep]
        for name in bindings:
            await self._delete(f"{self.support.api.bindings}/{name}")
        for name in policies:
            await self._delete(f"{self.support.api.policies}/{name}")
        for name in params:
            await self._delete(f"{params_path(self.manager_namespace)}/{name}")

    def _publish(self, routes: Mapping[str, planning.Route]) -> None:
        changed = {n for n in set(routes) | set(self.routes) if routes.get(n) != self.routes.get(n)}
        self.routes = dict(routes)
        if changed and self.on_routes is not None:
            self.on_routes(changed)

    def _params_current(self, g: Generated, params: dict[str, JsonObj]) -> bool:
        return params_current(params[g.name], self.params.get(g.name))

    def _current(self, g: Generated, policies: dict[str, JsonObj], bindings: dict[str, JsonObj]) -> bool:
        return covers(policies[g.name], self.policies.get(g.name)) and covers(
            bindings[g.name], self.bindings.get(g.name)
        )

    # -- writes ----------------------------------------------------------------------------------------
    async def _write(self, g: Generated, policy: JsonObj, binding: JsonObj, params: JsonObj) -> bool:
        """Store the three: the parameter object first (the policy's CEL may read a new key of it), then the
        policy (a binding to a missing policy matches nothing), then the binding; False if refused."""
        started = self.monotonic()
        try:
            if not params_current(params, self.params.get(g.name)):
                await self._put_params(params)
            if not covers(policy, self.policies.get(g.name)):
                await put(self.client, self.support.api.policies, policy, self.policies, self.written)
            if not covers(binding, self.bindings.get(g.name)):
                await put(self.client, self.support.api.bindings, binding, self.bindings, self.written)
        except api.Invalid as e:
            message = f"the API server refused its MutatingAdmissionPolicy: {e.message[:300]}"
            log.warning("policy %s refused, its SidecarSets stay on the webhook: %s", g.name, e.message[:300])
            for name in g.members:
                ss = self.models.get(name)
                if ss is not None:
                    self.refused[(name, ss.hash)] = message
            return False
        took = self.monotonic() - started  # mostly the API server compiling its CEL: what new SidecarSets wait on
        members = ",".join(g.members)
        log.info("policy %s stored (%d SidecarSets, %.1fs)", g.name, len(g.members), took, extra={"object": members})
        return True

    async def _put_params(self, params: JsonObj) -> None:
        await put(self.client, params_path(self.manager_namespace), params, self.params, self.written)

    async def _delete(self, path: str) -> None:
        with contextlib.suppress(api.NotFound):
            await self.client.delete(path)

    async def _set_condition(self, expression: str) -> bool:
        """Our matchCondition on the pod webhook (others' conditions are kept): none, so the webhook
        serves every pod, unless policies are known to be enforced. False if it could not be written."""
        if not await self.narrowing.write(None if self.support.serves_all else expression):
            self.dirty.set()
            return False
        return True
