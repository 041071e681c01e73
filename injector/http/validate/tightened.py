"""Running pods whose overrides a SidecarSet's tightened bounds no longer allow, for the warnings
/validate-sidecarset returns with the update.

The SidecarSet owner narrows `spec.overrides` (a lower maximum, an env name dropped); pods already
running with overrides outside the new bounds are left as they are and counted not upgradable
(sidecarsets.rollout.podoverrides) until their owners change the annotation. The owner should hear
it when making the change, so the webhook reads the SidecarSet's injected pods once, with the
SidecarSet's own selector as a label selector and a bound on time and pages (a SidecarSet update is
rare; admission never waits long), and warns with their number and up to 10 of them by name. Only
an update that allows less than before reads anything. A read that fails or stops at its bound says
so; the update itself is never refused for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from kuberuntime import api
from kuberuntime.jsontypes import JsonObj, mapping, resolve
from sidecarsets.overrides import merge
from sidecarsets.spec import names
from sidecarsets.spec.model import ModelError, SidecarSet

MAX_NAMED = 10
PAGE = 500


class PodLister:
    """Injected pods by label selector, page by page, within `timeout` seconds and `max_pages` pages."""

    def __init__(self, client: api.Reader, *, timeout: float = 2.0, max_pages: int = 20) -> None:
        self.client = client
        self.timeout = timeout
        self.max_pages = max_pages

    async def __call__(self, selector: str) -> tuple[list[JsonObj], str | None]:
        """(the pods read, why the list is incomplete or None)."""
        pods: list[JsonObj] = []
        params: dict[str, str | int] = {"labelSelector": selector, "limit": PAGE}
        deadline = time.monotonic() + self.timeout
        try:
            for _ in range(self.max_pages):
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    page = await self.client.get("/api/v1/pods", params=params)
                pods += [p for p in page.get("items") or [] if isinstance(p, dict)]
                token = resolve(page, "metadata", "continue")
                if not token:
                    return pods, None
                params["continue"] = str(token)
            return pods, f"stopped after {len(pods)} pods"
        except (TimeoutError, api.ApiError, OSError) as e:
            return pods, f"reading the pods failed after {len(pods)} ({type(e).__name__})"


def label_selector(selector: Mapping[str, Any] | None) -> str | None:
    """A LabelSelector as the API's labelSelector parameter, injected pods only; None when it cannot
    be written so (the SidecarSet selects nothing then anyway)."""
    terms = [f"{names.POD_INJECTED_LABEL}=true"]
    terms += [f"{k}={v}" for k, v in mapping(selector, "matchLabels").items()]
    for expr in resolve(selector, "matchExpressions") or []:
        key, op, values = resolve(expr, "key"), resolve(expr, "operator"), resolve(expr, "values") or []
        if op in ("In", "NotIn") and values:
            terms.append(f"{key} {op.lower()} ({','.join(map(str, values))})")
        elif op in ("Exists", "DoesNotExist"):
            terms.append(str(key) if op == "Exists" else f"!{key}")
        else:
            return None
    return ",".join(terms)


async def warnings(obj: Any, old: Any, lister: PodLister | None) -> list[str]:
    """The warnings for an update of SidecarSet `old` to `obj` (none unless it allows less)."""
    try:
        new, before = SidecarSet.from_object(obj, tolerant=True), SidecarSet.from_object(old, tolerant=True)
    except ModelError:
        return []
    if lister is None or not merge.tightened(before, new):
        return []
    selector = label_selector(new.selector)
    if selector is None:
        return []
    pods, incomplete = await lister(selector)
    outside: list[tuple[str, str]] = []
    for pod in pods:
        anns = mapping(pod, "metadata", "annotations")
        injected = str(anns.get(names.ANN_INJECTED_LIST) or "").split(",")
        why = merge.outside(new, anns.get(names.ANN_OVERRIDES)) if new.name in injected else None
        if why is not None:
            outside.append((f"{resolve(pod, 'metadata', 'namespace')}/{resolve(pod, 'metadata', 'name')}", why))
    out: list[str] = []
    if outside:
        shown = f"; the first {MAX_NAMED} follow" if len(outside) > MAX_NAMED else ""
        out.append(
            f"spec.overrides: {len(outside)} running pod(s) carry overrides outside the new bounds; they are left "
            f"as they are and counted not upgradable until their owners change {names.ANN_OVERRIDES}{shown}"
        )
        out += [f"spec.overrides: pod {key}: {why}" for key, why in outside[:MAX_NAMED]]
    if incomplete is not None:
        out.append(f"spec.overrides: the running pods were not all checked against the new bounds ({incomplete})")
    return out
