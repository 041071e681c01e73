"""ControllerRevision I/O: list a SidecarSet's history, create revisions, carry out a history plan.

The decisions are made by the pure `sidecarsets.spec.revisions.plan_history`; this module only talks to
the API server, and copes with what a watch cache a moment behind can make it see (a create that
finds AlreadyExists adopts an equal revision, a delete of one already gone is ignored).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kuberuntime import api
from kuberuntime.jsontypes import JsonObj, resolve
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.names import REVISION_LABEL_SIDECARSET, SS_LABEL_CUSTOM_VERSION
from sidecarsets.spec.revisions import (
    MAX_COLLISIONS,
    RevisionError,
    owner_name,
    plan_history,
    revision_hash,
    revision_name,
    sort_revisions,
)

log = logging.getLogger("sidecarsets.history")


def revisions_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/apps/v1/namespaces/{namespace}/controllerrevisions"
    return f"{base}/{name}" if name else base


def _owned_by(revision: Mapping[str, Any], uid: str) -> bool:
    """Owned by this SidecarSet, or by no controller (an orphan it may adopt), as client-go lists history."""
    refs = resolve(revision, "metadata", "ownerReferences") or []
    controller = next((r for r in refs if isinstance(r, Mapping) and r.get("controller")), None)
    return controller is None or not uid or controller.get("uid") == uid


async def list_revisions(client: api.Client, ss: SidecarSet, *, namespace: str) -> list[JsonObj]:
    """The SidecarSet's revisions in `namespace`, oldest first."""
    listed = await client.get(
        revisions_path(namespace), params={"labelSelector": f"{REVISION_LABEL_SIDECARSET}={owner_name(ss)}"}
    )
    return _owned_revisions(ss, listed.get("items") or [])


def _owned_revisions(ss: SidecarSet, items: Iterable[Mapping[str, Any]]) -> list[JsonObj]:
    name, uid = owner_name(ss), ss.uid
    return sort_revisions(
        dict(r)
        for r in items
        if ((r.get("metadata") or {}).get("labels") or {}).get(REVISION_LABEL_SIDECARSET) == name and _owned_by(r, uid)
    )


async def _create(
    client: api.Client, ss: SidecarSet, body: JsonObj, *, namespace: str, collisions: int
) -> tuple[str, int]:
    uid = ss.uid
    body = {**body, "metadata": {**body["metadata"], "namespace": namespace}}
    for _ in range(MAX_COLLISIONS):
        try:
            created = await client.create(revisions_path(namespace), body)
            return str(created["metadata"]["name"]), collisions
        except api.Conflict as e:
            if e.reason != "AlreadyExists":
                raise
            name = body["metadata"]["name"]
            existing = await client.get(revisions_path(namespace, name))
            if existing.get("data") == body["data"] and _owned_by(existing, uid):
                return name, collisions
            collisions += 1
            new_name = revision_name(owner_name(ss), revision_hash(body["data"], collisions))
            body = {**body, "metadata": {**body["metadata"], "name": new_name}}
    raise RevisionError(f"SidecarSet {ss.name}: no free revision name after {MAX_COLLISIONS} tries")


def revisions_namespace(ss: SidecarSet, manager_namespace: str) -> str:
    """Where a SidecarSet's ControllerRevisions live: the manager's namespace for a cluster SidecarSet,
    its own namespace for a NamespacedSidecarSet (owned by it there, and readable by its owners)."""
    return ss.namespace or manager_namespace


async def sync_history(
    client: api.Client,
    ss: SidecarSet,
    *,
    namespace: str,
    in_use: set[str],
    cached: Iterable[Mapping[str, Any]] | None = None,
) -> tuple[str, int]:
    """Bring the SidecarSet's ControllerRevisions in `namespace` in line with its spec.

    `cached` is the controller's watch cache of revisions, which saves a LIST per reconcile; a
    cache a moment behind is safe (a create finds AlreadyExists and adopts the equal revision, a
    delete of one already gone is ignored). Without it the revisions are listed.
    Returns (latest revision name, collisionCount) for the SidecarSet's status. API errors on the
    latest revision propagate (the reconcile is retried); failed deletions are only logged.
    """
    if cached is None:
        revisions = await list_revisions(client, ss, namespace=namespace)
    else:
        revisions = _owned_revisions(ss, cached)
    plan = plan_history(ss, revisions, in_use=in_use)
    latest, collisions = plan.latest_name, plan.collision_count
    if plan.create is not None:
        latest, collisions = await _create(client, ss, plan.create, namespace=namespace, collisions=collisions)
    elif plan.renumber:
        await client.patch(revisions_path(namespace, plan.renumber), {"revision": plan.latest_number})
    if plan.custom_version:
        await client.patch(
            revisions_path(namespace, latest), {"metadata": {"labels": {SS_LABEL_CUSTOM_VERSION: plan.custom_version}}}
        )
    for name in plan.delete:
        try:
            await client.delete(revisions_path(namespace, name))
        except api.NotFound:
            pass
        except Exception as e:
            log.warning("SidecarSet %s: deleting old revision %s failed: %s", ss.name, name, e)
    if plan.over_limit:
        log.info(
            "SidecarSet %s keeps %d revisions over its history limit: they are still in use",
            ss.name,
            plan.over_limit,
        )
    return latest, collisions
