"""Our matchCondition on the pod webhook: written, replaced and removed without touching anyone else's.

The policy sync decides what the condition says (injector.policy.plan: the pods only the webhook can
serve, widened while a policy settles); this keeps it on `inject.sidecarctl.io` of the
MutatingWebhookConfiguration, as the watch last saw that object. The caBundle sync writes the same
object, so every patch tests the resourceVersion and a conflict is left for the next pass. A condition
the API server refuses (it should not happen) is never half applied: the webhook is left un-narrowed,
serving every pod, which is slower and never wrong.
"""

from __future__ import annotations

import logging

from injector.policy import selecting
from injector.policysync.stored import name_of, older
from kuberuntime import api
from kuberuntime.jsontypes import JsonObj

log = logging.getLogger(__name__)

MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
CONDITION_NAME = "sidecarctl-needs-webhook"
# The API server refuses a matchCondition longer than 100,000 characters; past this the webhook is
# left un-narrowed (it serves every pod: slower, never wrong).
MAX_CONDITION_CHARS = selecting.MAX_CONDITION_CHARS


def fits(expression: str) -> bool:
    """Whether a condition this long is written (MAX_CONDITION_CHARS); a longer one narrows nothing:
    the webhook keeps every pod of an enabled namespace."""
    return len(expression) <= MAX_CONDITION_CHARS


class Narrowing:
    """`on_webhook_config` is the configuration's informer handler; `write` sets or removes our condition."""

    def __init__(self, client: api.Client, *, config: str, webhook: str) -> None:
        self.client = client
        self.config = config
        self.webhook = webhook
        self.mwc: JsonObj | None = None
        self.bad_conditions = 0

    def on_webhook_config(self, kind: str, old: JsonObj | None, new: JsonObj | None) -> bool:
        """Keep the configuration as watched; True when it is ours (the caller passes again).

        An event older than what is kept is not kept: our patch's answer usually arrives before the
        watch delivers the version it replaced, and keeping that one would make the next `write` of
        the same condition a no-op (it compares with what is kept), leaving the stored one unwritten
        until the watch caught up: a widening that never reached the API server while the pass went
        on to publish the SidecarSets as webhook-served."""
        if name_of(new or old) != self.config:
            return False
        if kind == "DELETED" or new is None:
            self.mwc = None
        elif not older(new, self.mwc):
            self.mwc = new
        return True

    def _hook(self) -> tuple[int, JsonObj] | None:
        """Our webhook in the configuration as watched, and its index; None while there is none."""
        hooks = (self.mwc or {}).get("webhooks") or []
        return next(((i, h) for i, h in enumerate(hooks) if h.get("name") == self.webhook), None)

    def first_narrowing(self, expression: str) -> bool:
        """Whether writing `expression` would narrow a webhook that takes every pod of an enabled namespace
        (it has no condition of ours), those of SidecarSets the policy sync has not seen yet among them."""
        found = self._hook()
        if found is None or not fits(expression):
            return False
        return not any(c.get("name") == CONDITION_NAME for c in found[1].get("matchConditions") or [])

    async def write(self, expression: str | None) -> bool:
        """Our condition as `expression` (None: none, the webhook serves every pod). False when the
        configuration changed underneath (a conflict): the caller tries again on its next pass."""
        found = self._hook()
        if found is None:
            return True
        index, hook = found
        if expression is not None and not fits(expression):
            log.warning("the webhook's condition would be %d characters; the webhook is not narrowed", len(expression))
            expression = None
        wanted = None if expression is None else {"name": CONDITION_NAME, "expression": expression}
        conditions = list(hook.get("matchConditions") or [])
        others = [c for c in conditions if c.get("name") != CONDITION_NAME]
        new = others + ([wanted] if wanted else [])
        if new == conditions:
            return True
        try:
            await self._patch(index, new)
        except api.Conflict:
            return False  # written underneath (the caBundle sync shares the object): again on the next pass
        except api.Invalid as e:
            if "test" in e.message or "resourceVersion" in e.message:
                return False  # the resourceVersion test failed: as a conflict
            if wanted is None:
                raise
            # A condition the API server will not take (it should not happen): never narrow on a guess.
            log.error("the API server refused the webhook condition (%s); the webhook is not narrowed", e.message[:300])
            self.bad_conditions += 1
            if others != conditions:
                await self._patch(index, others)
            return False
        log.info("webhook %s condition %s", self.webhook, "removed" if wanted is None else "set")
        return True

    async def _patch(self, index: int, conditions: list[JsonObj]) -> None:
        assert self.mwc is not None
        rv = (self.mwc.get("metadata") or {}).get("resourceVersion")
        ops: list[JsonObj] = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] if rv else []
        ops.append({"op": "add", "path": f"/webhooks/{index}/matchConditions", "value": conditions})
        self.mwc = await self.client.patch(f"{MWC_PATH}/{self.config}", ops, patch_type="json")
