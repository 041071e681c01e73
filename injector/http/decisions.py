"""What each admission webhook decides for a parsed AdmissionReview; no HTTP here.

The pod webhook takes the current store snapshot (once its SidecarSet watches are current,
injector.http.snapshotwait), resolves revision pins (sidecarsets.pins) and
calls the pure engine; the SidecarSet webhook runs validation against the other SidecarSets and
the stored revisions. Each returns a `Decision`: the metrics label, the AdmissionReview response
body, and whether the same request may be answered again from the replay cache.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from injector.engine import engine
from injector.http import admission
from injector.http.metrics import OVERRIDE_REFUSALS, POD_DENIALS
from injector.http.namespaces import LookupFailed
from injector.http.replay import ReplayCache
from injector.http.snapshotwait import BEHIND_WARNING
from injector.http.validate import advice, tenants
from injector.http.validate.tightened import PodLister
from injector.http.validate.tightened import warnings as tightened_warnings
from injector.policy import servable
from kuberuntime.clock import now_rfc3339
from kuberuntime.jsontypes import mapping, resolve
from sidecarsets import pins, validation
from sidecarsets.spec import names
from sidecarsets.spec.model import ModelError, SidecarSet
from sidecarsets.store import Snapshot, TemplateStore
from sidecarsets.validation import podsecurity

# Partial revision pins draw per pod; from a generator of our own, not the shared `random` state.
_DRAWS = random.Random()


@dataclass(frozen=True, slots=True)
class Decision:
    result: str  # metrics label: injected, skipped, allowed, denied
    body: bytes  # the AdmissionReview response
    replayable: bool = False


Lookup = Callable[[str], Awaitable[Mapping[str, str] | None]]


@dataclass
class WebhookSettings:
    manager_namespace: str = names.DEFAULT_MANAGER_NAMESPACE
    # Reads a namespace the snapshot does not know (injector.http.namespaces); None: such pods are refused.
    namespace_lookup: Lookup | None = None
    clock: Callable[[], str] = field(default=now_rfc3339)
    # Identical pods admitted within a second are answered from a cache (None turns it off).
    replay: ReplayCache | None = field(default_factory=ReplayCache)
    # --injection=policy: there is no pod webhook, so a SidecarSet no policy can serve is refused.
    policy_only: bool = False
    # --namespaced-sidecarsets; and the SubjectAccessReview a NamespacedSidecarSet's writer must pass
    # (injector.http.access; None: every such write is refused, to be retried).
    namespaced_sidecarsets: bool = True
    access_review: tenants.AccessReview | None = None
    # Reads a SidecarSet's injected pods when an update tightens its overrides' bounds
    # (injector.http.validate.tightened).
    pod_lister: PodLister | None = None
    # Waits for reconnecting SidecarSet watches before a pod is decided (injector.http.snapshotwait);
    # None: the snapshot is taken as it is.
    snapshot_wait: Callable[[], Awaitable[bool]] | None = None


class NamespaceUnknown(Exception):
    """The labels of the pod's namespace cannot be known now; the pod is refused, to be retried."""


async def _namespace_labels(
    store: TemplateStore, namespace: str, settings: WebhookSettings
) -> Mapping[str, str] | None:
    """The namespace's labels: from the watch, or read once when the watch may be behind.

    The API server only calls this webhook for namespaces its selector matched, so a snapshot
    without the namespace, or without its injection label, is read again rather than trusted.
    None: the namespace does not exist. NamespaceUnknown: it could not be found out.
    """
    labels = store.snapshot.namespaces.get(namespace)
    enabled = labels is not None and labels.get(names.NS_INJECTION_LABEL) == names.NS_INJECTION_ENABLED
    if enabled or namespace in names.SYSTEM_NAMESPACES or namespace == settings.manager_namespace:
        return labels
    if settings.namespace_lookup is None:
        if labels is not None:
            return labels
        raise NamespaceUnknown("the watch has not delivered it yet")
    try:
        return await settings.namespace_lookup(namespace)
    except LookupFailed as e:
        raise NamespaceUnknown(f"the watch has not delivered it yet and {e}") from None


async def inject(review: admission.Review, store: TemplateStore, settings: WebhookSettings) -> Decision:
    admission.require_kind(review, group="", kind="Pod", what="pods")
    if review.operation != "CREATE" or review.sub_resource:
        return Decision("skipped", admission.response(review))
    if review.object is None:
        raise admission.ReviewError(400, "request.object is required for CREATE")
    namespace = review.namespace or "default"
    try:
        labels = await _namespace_labels(store, namespace, settings)
    except NamespaceUnknown as e:
        message = f"sidecarctl: the labels of namespace {namespace} are not known ({e}); retry the request"
        POD_DENIALS.labels("namespace_unknown").inc()
        return Decision("denied", admission.response(review, denied=message, code=503))
    behind = settings.snapshot_wait is not None and not await settings.snapshot_wait()
    snapshot = store.snapshot
    candidates, denied = pins.pinned_sidecarsets(
        snapshot,
        mapping(review.object, "metadata", "labels"),  # malformed ones: none (the engine names the field)
        namespace=namespace,
        namespace_labels=labels,
        rand=_DRAWS.random,
    )
    if denied is not None:
        POD_DENIALS.labels("pinned_revision").inc()
        return Decision("denied", admission.response(review, denied=denied))
    outcome = engine.inject(
        review.object,
        namespace=namespace,
        namespace_labels=labels,
        sidecarsets=candidates,
        now=settings.clock(),
        operation=review.operation,
        manager_namespace=settings.manager_namespace,
    )
    if outcome.refusal is not None and outcome.denied is not None:
        # Refused like a LimitRange refuses a pod: Forbidden, naming the override and its bounds.
        POD_DENIALS.labels("overrides").inc()
        OVERRIDE_REFUSALS.labels(outcome.refusal).inc()
        body = admission.response(review, denied=outcome.denied, code=403, warnings=outcome.warnings)
        return Decision("denied", body)
    if outcome.denied is not None:
        POD_DENIALS.labels("cannot_inject").inc()
        return Decision("denied", admission.response(review, denied=outcome.denied, code=400))
    warnings = [BEHIND_WARNING, *outcome.warnings] if behind else outcome.warnings
    body = admission.response(review, patch=outcome.patch, warnings=warnings)
    replayable = not behind and pins.answer_is_replayable(snapshot, labels)
    return Decision("injected" if outcome.patch else "skipped", body, replayable)


async def validate(review: admission.Review, store: TemplateStore, settings: WebhookSettings | None = None) -> Decision:
    if review.kind.get("group") == names.GROUP and review.kind.get("kind") == names.NAMESPACED_KIND:
        return await _validate_namespaced(review, store, settings or WebhookSettings())
    admission.require_kind(review, group=names.GROUP, kind=names.KIND, what="SidecarSets and NamespacedSidecarSets")
    if review.operation not in ("CREATE", "UPDATE"):
        return Decision("allowed", admission.response(review))
    if review.object is None:
        raise admission.ReviewError(400, f"request.object is required for {review.operation}")
    size = len(orjson.dumps(review.object))
    if size > validation.MAX_SIDECARSET_BYTES:
        message = (
            f"SidecarSet rejected: {size} bytes is larger than the {validation.MAX_SIDECARSET_BYTES} bytes etcd stores"
        )
        return Decision("denied", admission.response(review, denied=message, code=413))
    snapshot = store.snapshot
    errors = [
        str(e)
        for e in validation.validate_sidecarset(
            review.object, old=review.old_object, others=_cluster_objects(snapshot), models=snapshot.by_name
        )
    ]
    problem = pins.pin_problem(review.object, snapshot.revisions.values())
    if problem is not None:
        errors.append(problem)
    if not errors and settings is not None and settings.policy_only:
        refusal = servable.policy_only_refusal(
            review.object, snapshot.sidecarsets, manager_namespace=settings.manager_namespace
        )
        if refusal is not None:
            errors.append(refusal)
    if errors:
        message = "SidecarSet rejected: " + "; ".join(errors)
        return Decision("denied", admission.response(review, denied=message, code=422))
    found = _pod_security(review.object, snapshot, settings)
    if any(f.mode == "enforce" for f in found) and _annotation(review.object, names.ANN_POD_SECURITY) == "enforce":
        refused = [f for f in found if f.mode == "enforce"]
        message = f"SidecarSet rejected ({names.ANN_POD_SECURITY}=enforce): " + " ".join(podsecurity.warnings(refused))
        return Decision("denied", admission.response(review, denied=message, code=422))
    warnings = podsecurity.warnings(found) + advice.warnings(review.object)
    if review.old_object is not None and settings is not None:
        warnings += await tightened_warnings(review.object, review.old_object, settings.pod_lister)
    return Decision("allowed", admission.response(review, warnings=warnings))


async def _validate_namespaced(review: admission.Review, store: TemplateStore, settings: WebhookSettings) -> Decision:
    if review.operation not in ("CREATE", "UPDATE"):
        return Decision("allowed", admission.response(review))
    if review.object is None:
        raise admission.ReviewError(400, f"request.object is required for {review.operation}")
    result, body = await tenants.validate(
        review,
        store.snapshot,
        enabled=settings.namespaced_sidecarsets,
        policy_only=settings.policy_only,
        manager_namespace=settings.manager_namespace,
        lookup=settings.namespace_lookup,
        access_review=settings.access_review,
    )
    return Decision(result, body)


def _cluster_objects(snapshot: Snapshot) -> list[Any]:
    """The SidecarSets a SidecarSet's names are checked against: a tenant's NamespacedSidecarSet never
    blocks one (in the pods both select, the cluster's sidecar wins)."""
    return [obj for key, obj in snapshot.objects.items() if "/" not in key]


def _annotation(obj: Any, key: str) -> str | None:
    value = resolve(obj, "metadata", "annotations", key)
    return value if isinstance(value, str) else None


def _pod_security(obj: Any, snapshot: Snapshot, settings: WebhookSettings | None) -> list[podsecurity.Finding]:
    """What the SidecarSet's sidecars would meet in the namespaces it selects now (the snapshot's)."""
    try:
        ss = SidecarSet.from_object(obj, tolerant=True)
    except ModelError:
        return []
    manager = settings.manager_namespace if settings is not None else names.DEFAULT_MANAGER_NAMESPACE
    return podsecurity.findings(ss, snapshot.namespaces, skip=(*names.SYSTEM_NAMESPACES, manager))
