"""`injectionStrategy.revision` at admission: which SidecarSet version a new pod gets.

Why this is domain logic and not HTTP: the pin rules (Kruise's getSuitableRevisionSidecarSet)
decide what goes into a pod, so the webhook, the CLI and the policy path must agree on them; the
webhook only carries the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sidecarsets.spec import revisions
from sidecarsets.spec.model import ModelError, SidecarSet
from sidecarsets.store import Snapshot

_PIN = "spec.injectionStrategy.revision"


def pinned_sidecarsets(
    snapshot: Snapshot,
    pod_labels: Mapping[str, str],
    *,
    namespace: str,
    namespace_labels: Mapping[str, str] | None,
    rand: Callable[[], float],
) -> tuple[list[SidecarSet], str | None]:
    """The SidecarSets to inject, with pins resolved from history; or a reason to refuse the pod.

    Only the SidecarSets that may select the pod are returned (the snapshot's index), and of those
    only the ones that select it are resolved. A pin that names no existing revision
    fails the pod (as in Kruise): injecting the latest spec instead would silently break the
    pinning the user asked for.
    """
    result: list[SidecarSet] = []
    for ss in snapshot.sidecarsets_for(namespace, pod_labels):
        try:
            use_pin = (
                (ss.injection_revision is not None or ss.problem(_PIN) is not None)
                and ss.matches_pod(pod_labels)
                and ss.matches_namespace(namespace, namespace_labels)
                and revisions.should_use_pinned(ss, pod_labels=pod_labels, rand=rand())
            )
            if not use_pin:
                result.append(ss)
                continue
            pinned = revisions.resolve_pinned(ss, snapshot.revisions.values())
            result.append(ss if pinned is None else SidecarSet.from_object(revisions.apply_revision(ss, pinned)))
        except revisions.PinnedRevisionNotFound as e:
            return [], f"SidecarSet {ss.name}: {e}"
        except (revisions.RevisionError, ModelError) as e:
            return [], f"SidecarSet {ss.name}: pinned revision is unusable: {e}"
    return result, None


def answer_is_replayable(snapshot: Snapshot, namespace_labels: Mapping[str, str] | None) -> bool:
    """Whether the answer for a pod depends on nothing but its body and this snapshot.

    Not while the namespace is still unknown (its labels may arrive), nor while any SidecarSet
    pins a revision (Partial pins draw at random per pod).
    """
    return namespace_labels is not None and not snapshot.pinning


def pin_problem(obj: Any, stored_revisions: Iterable[Mapping[str, Any]]) -> str | None:
    """At validation: why the SidecarSet object's pin names no usable revision, or None."""
    ss = SidecarSet.from_object(obj, tolerant=True)
    if ss.injection_revision is None and ss.problem(f"{_PIN}.revisionName", f"{_PIN}.customVersion") is None:
        return None
    try:
        revisions.resolve_pinned(ss, stored_revisions)
    except revisions.RevisionError as e:
        return f"spec.injectionStrategy.revision: {e}"
    return None
