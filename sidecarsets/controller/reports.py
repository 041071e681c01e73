"""The Warning Events a rollout sends on its SidecarSet: a pod whose upgrade keeps being refused,
and a rollout stopped at its progress deadline (`kubectl describe sidecarset` shows both).

Apart from the controller so that what is said, and when, reads in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kuberuntime import events
from sidecarsets.controller.podfailures import PodFailures
from sidecarsets.rollout import deadline, planner
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

log = logging.getLogger("sidecarsets.controller")


async def upgrade_failures(
    recorder: events.EventRecorder, failures: PodFailures, ss: SidecarSet, upgrades: Iterable[planner.PodUpgrade]
) -> None:
    """UpgradeFailed for each pod whose refusals have reached the count worth saying (PodFailures)."""
    for upgrade in upgrades:
        key = f"{upgrade.namespace}/{upgrade.name}"
        failure = failures.to_report(key)
        if failure is None:
            continue
        await recorder.event(
            ss.obj,
            type="Warning",
            reason="UpgradeFailed",
            message=(
                f"pod {key}: the in-place upgrade was refused {failure.count} times ({failure.reason}); "
                "it is retried with backoff while the rollout goes on with other pods"
            ),
        )


async def rollout_stalled(recorder: events.EventRecorder, ss: SidecarSet, progress: deadline.Progress) -> None:
    """The rollout stopped: the pods newly past the progress deadline, in the log and an Event."""
    late = progress.newly_overdue
    shown = ", ".join(f"{o.key} ({o.why})" for o in late[:10]) + (" ..." if len(late) > 10 else "")
    log.warning(
        "rollout stopped: %d upgraded pod(s) not ready within the progress deadline: %s",
        len(late),
        shown,
        extra={"sidecarset": ss.name},
    )
    await recorder.event(
        ss.obj,
        type="Warning",
        reason=names.REASON_DEADLINE_EXCEEDED,
        message=f"rollout stopped: {len(late)} upgraded pod(s) not ready within "
        f"{ss.update_strategy.progress_deadline_seconds}s: {shown}",
    )
