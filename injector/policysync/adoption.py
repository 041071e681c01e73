"""Whether the policy sync may use policies: what discovery lists, what the probe finds, and when to ask again.

Discovery says whether the API is served (`served`); the probe (injector.policysync.support) whether every
kube-apiserver enforces it. Until both have answered, the webhook serves every pod.

The probe is asked again every `unenforced_recheck` seconds while the API is served but not enforced by every
kube-apiserver (an upgrade under way), every RECHECK_SECONDS otherwise. One probe misses a single old server of
three with probability (2/3)^21 (0.02 %); asked every 30 s for the length of an upgrade, that adds up to about 2 %
an hour, and one lucky probe would narrow the webhook for pods the old server admits with no policy. So once
the probe has refused, ENFORCED_ROUNDS probes in a row must agree before policies are used (1e-11), whatever
discovery says meanwhile; losing support takes one refusal. Until the probe has refused once, one probe decides:
at start, and when discovery first lists the API after an upgrade (discovery has its own reads in a row).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prometheus_client import Counter

from injector.policy import plan as planning
from injector.policysync.support import V1, PolicyApi, Probe
from kuberuntime import api

log = logging.getLogger(__name__)

RECHECK_SECONDS = 600.0
ENFORCED_ROUNDS = 3

BARRIERS = Counter(
    "sidecarctl_policy_barriers_total",
    "The canary's barrier, asked before the webhook is narrowed for policies just written, by outcome: enforced "
    "(every kube-apiserver enforces them; narrowed) or not_yet (the webhook keeps their pods, asked again later).",
    ["outcome"],
)
for _outcome in ("enforced", "not_yet"):
    BARRIERS.labels(_outcome)  # from 0, so that the first of each is an increase a rate sees


class Adoption:
    """`unsupported` is None once policies may be used, else why not; `known` once anything has been found."""

    def __init__(
        self,
        mode: planning.Mode,
        probe: Probe,
        *,
        unenforced_recheck: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mode = mode
        self.probe = probe
        self.unenforced_recheck = unenforced_recheck
        self.monotonic = monotonic
        self.unsupported: str | None = None
        self.known = mode is planning.Mode.WEBHOOK
        self.refusal: str | None = None  # the probe's last refusal, until ENFORCED_ROUNDS probes in a row agree
        self.enforced_rounds = 0  # probes in a row that found the API enforced since that refusal
        # What discovery says (`served`): the policy API to use, or why there is none. Until it
        # has said anything, support is not checked and the webhook serves every pod.
        self.policy_api: PolicyApi | None = None
        self.not_served = "discovery not read yet"
        self.discovered = False
        self.recheck = False
        self.checked_at = -RECHECK_SECONDS

    @property
    def api(self) -> PolicyApi:
        """Where our policies live; v1 when none is served (then there is nothing to write or delete)."""
        return self.policy_api or V1

    @property
    def serves_all(self) -> bool:
        """The webhook takes every pod: webhook mode, support not known yet, or not there."""
        return self.mode is planning.Mode.WEBHOOK or not self.known or self.unsupported is not None

    def served(self, policy_api: PolicyApi | None, why_not: str) -> bool:
        """What discovery lists; True if that changed (support is probed again on the next pass)."""
        if self.discovered and (policy_api, why_not) == (self.policy_api, self.not_served):
            return False
        self.policy_api, self.not_served, self.discovered = policy_api, why_not, True
        self.recheck = True
        return True

    def _recheck_every(self) -> float:
        waiting = self.policy_api is not None and self.known and self.unsupported is not None
        return self.unenforced_recheck if waiting else RECHECK_SECONDS

    def until_recheck(self) -> float:
        if self.mode is planning.Mode.WEBHOOK or not self.discovered:
            return RECHECK_SECONDS
        return max(0.0, self.checked_at + self._recheck_every() - self.monotonic())

    async def check_if_due(self) -> None:
        """Probe support when discovery changed, or when the recheck interval has passed."""
        if self.mode is planning.Mode.WEBHOOK or not self.discovered:
            return
        if self.recheck or self.monotonic() - self.checked_at >= self._recheck_every():
            self.recheck = False
            await self._check()
            self.checked_at = self.monotonic()

    async def _check(self) -> None:
        if self.policy_api is None:  # said once per process by whoever reads discovery, not per pass here
            self.unsupported, self.known = self.not_served, True
            return
        try:
            why = await self.probe.check()
        except api.ApiError as e:
            why = f"the MutatingAdmissionPolicy probe failed: {e.message or e}"
        why = self._weigh(why)
        if why != self.unsupported or not self.known:
            if why is None:
                log.info("MutatingAdmissionPolicy is enforced by this API server: SidecarSets are served by policies")
            else:
                log.warning("not using MutatingAdmissionPolicies, the webhook serves every SidecarSet: %s", why)
        self.unsupported, self.known = why, True

    async def caught_up(self) -> bool:
        """Whether every kube-apiserver enforces what the sync has written so far (the probe's barrier);
        asked before the webhook is narrowed for policies just written. Always True while the webhook
        serves every pod: nothing is narrowed then."""
        if self.serves_all:
            return True
        try:
            if await self.probe.caught_up():
                BARRIERS.labels("enforced").inc()
                return True
            why = "the canary written after them was not enforced by every kube-apiserver in time"
        except api.ApiError as e:
            why = f"the canary could not be written or probed: {e.message or e}"
        BARRIERS.labels("not_yet").inc()
        log.warning("the webhook stays widened for the policies just written: %s", why)
        return False

    def _weigh(self, why: str | None) -> str | None:
        """The probe's answer as the sync takes it: after a refusal, the refusal stands until
        ENFORCED_ROUNDS probes in a row have found the API enforced."""
        if why is not None:
            self.refusal, self.enforced_rounds = why, 0
            return why
        if self.refusal is None:
            return None
        self.enforced_rounds += 1
        if self.enforced_rounds < ENFORCED_ROUNDS:
            log.info(
                "MutatingAdmissionPolicy enforced in %d of %d probes in a row", self.enforced_rounds, ENFORCED_ROUNDS
            )
            return self.refusal
        self.refusal, self.enforced_rounds = None, 0
        return None
