"""Checks `sidecarctl run` makes before it starts anything.

With `--injection=policy` the pod webhook is never called for pods a SidecarSet selects, so a
SidecarSet that no MutatingAdmissionPolicy can serve would silently stop being injected. The
SidecarSet webhook refuses new ones; this refuses to start while one is stored (a SidecarSet or a
NamespacedSidecarSet), and on an API server
that does not serve the policy API at all (Kubernetes before 1.36), where nothing could be injected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aiohttp

from injector.policy import servable
from injector.policysync import support
from kuberuntime import api, discovery, kubeapi, kubeconfig
from kuberuntime.backoff import Backoff
from kuberuntime.jsontypes import JsonObj
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.controller.controller import NSS_PATH, SS_PATH
from sidecarsets.spec.model import ModelError, SidecarSet

log = logging.getLogger("sidecarctl.preflight")
T = TypeVar("T")

PATIENCE = 60.0  # seconds to wait out an API server that is starting (429, 5xx, refused connections)


async def _patiently(what: str, read: Callable[[], Awaitable[T]]) -> T | str:
    """`read()`, waiting out an API server that is starting; or why it cannot be done."""
    backoff = Backoff(base=0.2, cap=5.0)
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            return await read()
        except api.ApiError as e:
            if e.status not in (429, 500, 502, 503, 504) or time.monotonic() > deadline:
                return f"--injection=policy: cannot {what}: {e}"
            why = str(e)
        except (OSError, aiohttp.ClientError, TimeoutError) as e:
            if time.monotonic() > deadline:
                return f"--injection=policy: cannot reach the API server to {what}: {e}"
            why = api.reason(e)
        wait = backoff.next()
        log.info("trying to %s failed (%s); retrying in %.1fs", what, why, wait)
        await asyncio.sleep(wait)


async def _problem(kube: api.Reader, opts: ManagerOptions) -> str | None:
    served = await _patiently("read its discovery", lambda: discovery.read(kube, support.GROUP_VERSIONS))
    if isinstance(served, str):
        return served
    if support.served_api(served) is None:
        return f"--injection=policy: {support.not_served(served)}; run with --injection=auto or --injection=webhook"
    listing = await _patiently("list SidecarSets to check them", lambda: kube.get(SS_PATH))
    if isinstance(listing, str):
        return listing
    tenants = await _patiently("list NamespacedSidecarSets to check them", lambda: _served_or_none(kube, NSS_PATH))
    if isinstance(tenants, str):
        return tenants
    models = []
    for obj in [*(listing.get("items") or []), *((tenants or {}).get("items") or [])]:
        try:
            models.append(SidecarSet.from_object(obj))
        except ModelError as e:
            log.warning("SidecarSet %s cannot be read: %s", (obj.get("metadata") or {}).get("name"), e)
    blocked = servable.unservable(models, manager_namespace=opts.namespace)
    if not blocked:
        return None
    listed = "; ".join(f"{name}: {why}" for name, why in sorted(blocked.items()))
    return (
        f"--injection=policy: {len(blocked)} SidecarSet(s) need the pod webhook ({listed}); "
        "change or delete them, or run with --injection=auto"
    )


async def _served_or_none(kube: api.Reader, path: str) -> JsonObj | None:
    """The list, or None where its CRD is not installed (the kind is optional)."""
    try:
        return await kube.get(path)
    except api.NotFound:
        return None


async def policy_mode_problem(opts: ManagerOptions, client: api.Reader | None = None) -> str | None:
    """Why the manager may not start in `--injection=policy` (None: it may, or another mode)."""
    if opts.injection.injection != "policy":
        return None
    if client is not None:
        return await _problem(client, opts)
    own = kubeapi.KubeClient(kubeconfig.load_config(opts.kubeconfig))
    try:
        return await _problem(own, opts)
    finally:
        await own.close()
