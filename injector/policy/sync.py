"""Keeps the plan in the API server: the policies and bindings, and the webhook's narrowing condition.

Run by the leader only. Every change (a SidecarSet, one of our policies or bindings, the
MutatingWebhookConfiguration) marks the state dirty; one pass then makes the API server match the
plan, so a hand-edited or deleted policy is put back, and a hand-edited condition too.

Make before break. A policy is enforced only after the API server's next recompile (up to about a
second, more for a large policy) and nothing says when; the webhook's condition takes effect at
once. So a pass that creates or changes a policy first widens the webhook to every pod that
policy's SidecarSets select, writes the policy, and narrows the webhook again only once the policy
has had time to be enforced (`settle` seconds, plus five per MB of policy). In between, those
pods go through the webhook as well; it finds them either injected by the policy at the current
hash (and leaves them) or not, or at an older hash (and injects the current one), so every pod gets
one complete set. The same order moves a SidecarSet from a policy to the webhook: the webhook is
widened before the policy goes.

Until support is known (injector.policy.support) nothing is narrowed: the webhook serves all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
import orjson

from injector.policy import plan as planning
from injector.policy import selecting
from injector.policy.generate import ANN_MEMBERS, Generated, covers
from injector.policy.support import BINDINGS, CANARY, POLICIES, Probe, SupportProbe
from kuberuntime import api
from kuberuntime.clock import first_of, now_rfc3339
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.model import ModelError, SidecarSet

log = logging.getLogger(__name__)

MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
CONDITION_NAME = "sidecarctl-needs-webhook"
ANN_GENERATED_AT = "sidecarctl.io/generated-at"
ANN_SOURCE = "sidecarctl.io/source-hash"
ANN_DIGESTS = "sidecarctl.io/group-digests"  # each group's digest: a rewrite widens the webhook for changed groups only
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=sidecarctl"
# The API server refuses a matchCondition longer than 100,000 characters; past this the webhook is
# left un-narrowed (it serves every pod: slower, never wrong).
MAX_CONDITION_CHARS = selecting.MAX_CONDITION_CHARS
# Stands in for the generation time while the policies are compared with the stored ones.
_STAMP = "0000-00-00T00:00:00Z"
_SS_API = "sidecarctl.io/v1alpha1"
RECHECK_SECONDS = 600.0
# A large policy takes longer to compile: 200 containers (1.2 MB) were enforced 5.8 s after they were
# stored, 100 (0.8 MB) after 4.3 s, on kube-apiserver 1.37 here. Five seconds per MB on top of `settle`.
SETTLE_PER_BYTE = 5.0 / 1_000_000


def _name(obj: JsonObj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("name") or "")


def _older(obj: JsonObj, than: JsonObj | None) -> bool:
    """`obj` is an older version than `than` (resourceVersions compared as the numbers etcd gives)."""
    try:
        return than is not None and int(obj["metadata"]["resourceVersion"]) < int(than["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False


def _members(policy: JsonObj) -> list[str]:
    """The SidecarSets a stored policy of ours injects (its groups joined by ";", members by ",")."""
    text = str((((policy.get("metadata") or {}).get("annotations")) or {}).get(ANN_MEMBERS) or "")
    return [m for group in text.split(";") for m in group.split(",") if m]


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
        probe: Probe | None = None,
        on_routes: Callable[[set[str]], None] | None = None,
        may_write: Callable[[], Awaitable[bool]] | None = None,
        clock: Callable[[], str] = now_rfc3339,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.mode = mode
        self.manager_namespace = manager_namespace
        self.webhook_config = webhook_config
        self.webhook_name = webhook_name
        self.settle = settle
        self.probe: Probe = probe or SupportProbe(client, namespace=manager_namespace)
        self.on_routes = on_routes
        self.may_write = may_write
        self.clock = clock
        self.monotonic = monotonic
        self.models: dict[str, SidecarSet] = {}  # the last version of each SidecarSet that could be read
        self.cache = planning.PartsCache()  # groups generated by earlier passes
        self.policies: dict[str, JsonObj] = {}  # our stored policies and bindings, as the watches see them
        self.bindings: dict[str, JsonObj] = {}
        self.mwc: JsonObj | None = None
        self.unsupported: str | None = None
        self.supported_known = mode is planning.Mode.WEBHOOK
        self.routes: dict[str, planning.Route] = {}
        self.refused: dict[tuple[str, str], str] = {}  # (SidecarSet, hash) -> the API server's refusal
        self.narrow_at: float | None = None  # when the widened webhook may be narrowed again
        self.settling: set[str] = set()  # SidecarSets whose policy was just written: the webhook takes their pods too
        self.dirty = asyncio.Event()
        self.passes = 0
        self.bad_conditions = 0

    # -- informer handlers ---------------------------------------------------------------------------
    def on_sidecarset(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        name = _name(new or old)
        if kind == "DELETED" or new is None:
            self.models.pop(name, None)
        else:
            try:
                self.models[name] = SidecarSet.from_object(new)
            except ModelError as e:  # as the webhook's store: keep serving the last good version
                log.error("SidecarSet %s is unusable, its policy keeps the previous version: %s", name, e)
        self.dirty.set()

    def _keep(self, into: dict[str, JsonObj], kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        name = _name(new or old)
        if kind == "DELETED" or new is None:
            into.pop(name, None)
        elif not _older(new, into.get(name)):  # our own write's answer may have been kept already
            into[name] = new
        self.dirty.set()

    def on_policy(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        self._keep(self.policies, kind, old, new)

    def on_binding(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        self._keep(self.bindings, kind, old, new)

    def on_webhook_config(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> None:
        if _name(new or old) == self.webhook_config:
            self.mwc = None if kind == "DELETED" else new
            self.dirty.set()

    # -- the loop --------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        checked = -RECHECK_SECONDS
        while not stop.is_set():
            if self.mode is not planning.Mode.WEBHOOK and self.monotonic() - checked >= RECHECK_SECONDS:
                await self._check_support()
                checked = self.monotonic()
            self.dirty.clear()
            try:
                await self.sync_once()
            except (api.ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
                if stop.is_set():
                    return
                log.warning("policy sync: %s; retrying", e or type(e).__name__)
                self.dirty.set()
                await asyncio.sleep(1.0)
            except Exception:  # a bug must not end the leader's term: say so and keep the last state
                log.exception("policy sync failed; retrying")
                self.dirty.set()
                await asyncio.sleep(5.0)
            timeout = RECHECK_SECONDS if self.narrow_at is None else self.narrow_at - self.monotonic()
            await first_of(self.dirty.wait(), stop.wait(), timeout=timeout)

    async def _check_support(self) -> None:
        try:
            why = await self.probe.check()
        except api.ApiError as e:
            why = f"the MutatingAdmissionPolicy probe failed: {e.message or e}"
        if why != self.unsupported or not self.supported_known:
            if why is None:
                log.info("MutatingAdmissionPolicy is enforced by this API server: SidecarSets are served by policies")
            else:
                log.warning("not using MutatingAdmissionPolicies, the webhook serves every SidecarSet: %s", why)
        self.unsupported, self.supported_known = why, True

    def plan(self) -> planning.Plan:
        refused = {name: msg for (name, h), msg in self.refused.items() if (m := self.models.get(name)) and m.hash == h}
        return planning.plan(
            self.models.values(),
            mode=self.mode,
            manager_namespace=self.manager_namespace,
            timestamp=_STAMP,
            unsupported=self.unsupported,
            refused=refused,
            previous={m: name for name, stored in self.policies.items() for m in _members(stored)},
            cache=self.cache,
        )

    async def sync_once(self) -> None:
        """One pass: make the stored policies, bindings and webhook condition match the plan."""
        self.passes += 1
        if not self.supported_known:
            pending = planning.Route(planning.Path.WEBHOOK, planning.Why.PENDING, "detecting policy support")
            self._publish(dict.fromkeys(self.models, pending))
            return
        p = self.plan()
        policies, bindings = self._desired(p.policies)
        changed = [g for g in p.policies if not self._current(g, policies, bindings)]
        stale_policies = [n for n in self.policies if n not in policies and n != CANARY]
        stale_bindings = [n for n in self.bindings if n not in bindings and n != CANARY]
        if not await self._writable():
            return
        now = self.monotonic()
        if changed:
            self.settling |= {m for g in changed for m in self._changed_members(g)}
            size = sum(len(orjson.dumps(policies[g.name])) for g in changed)
            self.narrow_at = max(self.narrow_at or 0.0, now + self.settle + size * SETTLE_PER_BYTE)
        elif self.narrow_at is not None and now >= self.narrow_at:
            self.narrow_at = None
            self.settling.clear()
        condition = p.webhook_condition
        settling = [ss for name, ss in self.models.items() if name in self.settling]
        if settling:  # widened: the webhook also takes every pod a not-yet-enforced policy would serve
            condition = f"({condition}) || ({selecting.pods_selected(settling, approximate=True)})"
        await self._set_condition(condition)
        refused = False
        for g in changed:
            refused |= not await self._write(g, policies[g.name], bindings[g.name])
        for name in stale_bindings:
            await self._delete(f"{BINDINGS}/{name}")
        for name in stale_policies:
            await self._delete(f"{POLICIES}/{name}")
        if refused:
            self.dirty.set()  # plan again with those SidecarSets on the webhook
            return
        self._publish(p.routes)

    def _publish(self, routes: Mapping[str, planning.Route]) -> None:
        changed = {n for n in set(routes) | set(self.routes) if routes.get(n) != self.routes.get(n)}
        self.routes = dict(routes)
        if changed and self.on_routes is not None:
            self.on_routes(changed)

    async def _writable(self) -> bool:
        return self.may_write is None or await self.may_write()

    # -- desired objects -------------------------------------------------------------------------------
    def _desired(self, generated: tuple[Generated, ...]) -> tuple[dict[str, JsonObj], dict[str, JsonObj]]:
        """The policies and bindings to store, by name, with their generation time settled."""
        policies: dict[str, JsonObj] = {}
        bindings: dict[str, JsonObj] = {}
        for g in generated:
            text = orjson.dumps(g.policy).decode()
            source = hashlib.sha256(text.encode()).hexdigest()[:16]
            stored = ((self.policies.get(g.name) or {}).get("metadata") or {}).get("annotations") or {}
            # Restoring a hand edit keeps the time; a changed SidecarSet gets a new one.
            stamp = stored.get(ANN_GENERATED_AT) if stored.get(ANN_SOURCE) == source else None
            stamp = stamp or self.clock()
            policy: JsonObj = orjson.loads(text.replace(_STAMP, stamp))
            meta = policy["metadata"]
            meta["annotations"] = {
                **meta["annotations"],
                ANN_GENERATED_AT: stamp,
                ANN_SOURCE: source,
                ANN_DIGESTS: orjson.dumps(g.digests, option=orjson.OPT_SORT_KEYS).decode(),
            }
            owners = self._owners(g)
            meta["ownerReferences"] = owners
            binding = dict(g.binding)
            binding["metadata"] = {**g.binding["metadata"], "ownerReferences": owners}
            policies[g.name], bindings[g.name] = policy, binding
        return policies, bindings

    def _changed_members(self, g: Generated) -> list[str]:
        """The members of the groups whose CEL differs from what the stored policy holds (all of a
        new policy's): only their pods need the webhook until the API server enforces the new one."""
        annotations = ((self.policies.get(g.name) or {}).get("metadata") or {}).get("annotations") or {}
        try:
            stored = orjson.loads(annotations.get(ANN_DIGESTS) or "{}")
        except orjson.JSONDecodeError:
            stored = {}
        if not isinstance(stored, dict):
            stored = {}
        return [m for key, digest in g.digests.items() if stored.get(key) != digest for m in key.split(",")]

    def _owners(self, g: Generated) -> list[JsonObj]:
        """Every member owns the objects: deleting the last one lets the garbage collector remove them."""
        owners = []
        for name in g.members:
            ss = self.models.get(name)
            if ss is not None and ss.uid:
                owners.append({"apiVersion": _SS_API, "kind": "SidecarSet", "name": name, "uid": ss.uid})
        return owners

    def _current(self, g: Generated, policies: dict[str, JsonObj], bindings: dict[str, JsonObj]) -> bool:
        return covers(policies[g.name], self.policies.get(g.name)) and covers(
            bindings[g.name], self.bindings.get(g.name)
        )

    # -- writes ----------------------------------------------------------------------------------------
    async def _write(self, g: Generated, policy: JsonObj, binding: JsonObj) -> bool:
        """Store the pair (policy first: a binding to a missing policy matches nothing); False if refused."""
        try:
            if not covers(policy, self.policies.get(g.name)):
                await self._put(POLICIES, policy, self.policies.get(g.name), self.policies)
            if not covers(binding, self.bindings.get(g.name)):
                await self._put(BINDINGS, binding, self.bindings.get(g.name), self.bindings)
        except api.Invalid as e:
            message = f"the API server refused its MutatingAdmissionPolicy: {e.message[:300]}"
            log.warning("policy %s refused, its SidecarSets stay on the webhook: %s", g.name, e.message[:300])
            for name in g.members:
                ss = self.models.get(name)
                if ss is not None:
                    self.refused[(name, ss.hash)] = message
            return False
        log.info("policy %s stored", g.name, extra={"object": ",".join(g.members)})
        return True

    async def _put(self, path: str, body: JsonObj, stored: JsonObj | None, into: dict[str, JsonObj]) -> None:
        """Create or replace the object, and keep the answer: the next pass compares with what was
        written, not with a watch that may not have delivered it yet (a large policy takes seconds
        to store; comparing with the older one would write again, with a new time, for ever)."""
        name = _name(body)
        written: JsonObj | None = None
        if stored is None:
            try:
                written = await self.client.create(path, body)
            except api.Conflict:  # there already (our watch is behind): replace it
                stored = await self.client.get(f"{path}/{name}")
        if written is None:
            assert stored is not None
            replacement = {
                **body,
                "metadata": {**body["metadata"], "resourceVersion": stored["metadata"]["resourceVersion"]},
            }
            written = await self.client.update(f"{path}/{name}", replacement)
        if not _older(written, into.get(name)):
            into[name] = written

    async def _delete(self, path: str) -> None:
        with contextlib.suppress(api.NotFound):
            await self.client.delete(path)

    async def _set_condition(self, expression: str) -> None:
        """Our matchCondition on the pod webhook (others' conditions are kept); None removes it."""
        if self.mwc is None:
            return
        hooks = self.mwc.get("webhooks") or []
        index = next((i for i, h in enumerate(hooks) if h.get("name") == self.webhook_name), None)
        if index is None:
            return
        if self.mode is planning.Mode.WEBHOOK or not self.supported_known or self.unsupported is not None:
            wanted = None
        elif len(expression) > MAX_CONDITION_CHARS:
            log.warning("the webhook's condition would be %d characters; the webhook is not narrowed", len(expression))
            wanted = None
        else:
            wanted = {"name": CONDITION_NAME, "expression": expression}
        conditions = list(hooks[index].get("matchConditions") or [])
        others = [c for c in conditions if c.get("name") != CONDITION_NAME]
        new = others + ([wanted] if wanted else [])
        if new == conditions:
            return
        rv = (self.mwc.get("metadata") or {}).get("resourceVersion")
        ops: list[JsonObj] = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] if rv else []
        ops.append({"op": "add", "path": f"/webhooks/{index}/matchConditions", "value": new})
        try:
            self.mwc = await self.client.patch(f"{MWC_PATH}/{self.webhook_config}", ops, patch_type="json")
        except api.Conflict:
            self.dirty.set()  # written underneath (the caBundle sync shares the object): again on the next pass
            return
        except api.Invalid as e:
            self.dirty.set()
            if "test" in e.message or "resourceVersion" in e.message:
                return  # the resourceVersion test failed: as a conflict
            if wanted is None:
                raise
            # A condition the API server will not take (it should not happen): never narrow on a guess.
            log.error("the API server refused the webhook condition (%s); the webhook is not narrowed", e.message[:300])
            self.bad_conditions += 1
            await self._set_condition_to(index, others, conditions)
            return
        log.info("webhook %s condition %s", self.webhook_name, "removed" if wanted is None else "set")

    async def _set_condition_to(self, index: int, new: list[JsonObj], conditions: list[JsonObj]) -> None:
        if new == conditions or self.mwc is None:
            return
        rv = (self.mwc.get("metadata") or {}).get("resourceVersion")
        ops: list[JsonObj] = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] if rv else []
        ops.append({"op": "add", "path": f"/webhooks/{index}/matchConditions", "value": new})
        self.mwc = await self.client.patch(f"{MWC_PATH}/{self.webhook_config}", ops, patch_type="json")
