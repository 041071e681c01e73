"""Checks `sidecarctl run` makes before it starts anything.

With `--injection=policy` the pod webhook is never called for pods a SidecarSet selects, so a
SidecarSet that no MutatingAdmissionPolicy can serve would silently stop being injected. The
SidecarSet webhook refuses new ones; this refuses to start while one is stored.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from injector.policy import servable
from kuberuntime import api, kubeapi, kubeconfig
from kuberuntime.backoff import Backoff
from kuberuntime.jsontypes import JsonObj
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.controller.controller import SS_PATH
from sidecarsets.spec.model import ModelError, SidecarSet

log = logging.getLogger("sidecarctl.preflight")

PATIENCE = 60.0  # seconds to wait out an API server that is starting (429, 5xx, refused connections)


async def _list_sidecarsets(kube: api.Reader) -> JsonObj | str:
    """The SidecarSet list, or why it cannot be read."""
    backoff = Backoff(base=0.2, cap=5.0)
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            return await kube.get(SS_PATH)
        except api.ApiError as e:
            if e.status not in (429, 500, 502, 503, 504) or time.monotonic() > deadline:
                return f"--injection=policy: cannot list SidecarSets to check them: {e}"
            why = str(e)
        except (OSError, aiohttp.ClientError, TimeoutError) as e:
            if time.monotonic() > deadline:
                return f"--injection=policy: cannot reach the API server to check the SidecarSets: {e}"
            why = api.reason(e)
        wait = backoff.next()
        log.info("listing SidecarSets failed (%s); retrying in %.1fs", why, wait)
        await asyncio.sleep(wait)


async def policy_mode_problem(opts: ManagerOptions, client: api.Reader | None = None) -> str | None:
    """Why the manager may not start in `--injection=policy` (None: it may, or another mode)."""
    if opts.injection.injection != "policy":
        return None
    if client is None:
        own = kubeapi.KubeClient(kubeconfig.load_config(opts.kubeconfig))
        try:
            listing = await _list_sidecarsets(own)
        finally:
            await own.close()
    else:
        listing = await _list_sidecarsets(client)
    if isinstance(listing, str):
        return listing
    models = []
    for obj in listing.get("items") or []:
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
