"""Whether a SidecarSet can be served by a MutatingAdmissionPolicy, asked before it is stored.

With `--injection=policy` there is no pod webhook to fall back on, so the SidecarSet webhook
refuses a SidecarSet that the plan would leave to the webhook, naming the feature; the manager
refuses to start while one exists (sidecarctl.manager.preflight).
"""

from __future__ import annotations

from collections.abc import Iterable

from injector.policy import plan
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec.model import ModelError, SidecarSet

# Policies are generated only to be checked here; their timestamp is never stored.
_STAMP = "1970-01-01T00:00:00Z"


def unservable(sidecarsets: Iterable[SidecarSet], *, manager_namespace: str) -> dict[str, str]:
    """SidecarSet name -> why no policy can serve it, for every one that needs the webhook."""
    p = plan.plan(sidecarsets, mode=plan.Mode.POLICY, manager_namespace=manager_namespace, timestamp=_STAMP)
    return {name: route.message for name, route in p.routes.items() if route.path is plan.Path.WEBHOOK}


def why_not(obj: JsonObj, others: Iterable[SidecarSet], *, manager_namespace: str) -> str | None:
    """Why `obj` (a SidecarSet about to be stored beside `others`) could not be served by a policy."""
    try:
        ss = SidecarSet.from_object(obj)
    except ModelError as e:
        return str(e)
    rest = [o for o in others if o.name != ss.name]
    return unservable([*rest, ss], manager_namespace=manager_namespace).get(ss.name)


def policy_only_refusal(obj: JsonObj, others: Iterable[SidecarSet], *, manager_namespace: str) -> str | None:
    """The admission error for `obj` under `--injection=policy` (a SidecarSet or a NamespacedSidecarSet
    alike), or None when a policy can serve it."""
    why = why_not(obj, others, manager_namespace=manager_namespace)
    if why is None:
        return None
    return f"the manager runs with --injection=policy and no MutatingAdmissionPolicy can serve it: {why}"
