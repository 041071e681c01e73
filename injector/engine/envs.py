"""Env vars a sidecar receives at injection, and how they merge.

Kruise's rule is "first name wins": the sidecar's own env, then `IS_INJECTED=true`, then the
vars copied from app containers (transferEnv, then the vars that shared `subPathExpr` mounts
refer to). A var is never listed twice, so a sidecar's own setting always beats a copied one.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.sidecar import TransferEnv

_VAR_REF = re.compile(r"\$\(([^()]+)\)")
_NAME_OF = operator.itemgetter("name")


def _same(env: JsonObj) -> JsonObj:
    return env


def is_injected(container: Mapping[str, Any]) -> bool:
    """Whether a pod container is a sidecar (carries IS_INJECTED=true); such containers are never sources."""
    env_list = container.get("env") or []
    try:
        # App containers carry dozens of vars and this runs for each of them on every admission:
        # look for the name without a Python-level loop, and only then check the entry exactly.
        if names.ENV_IS_INJECTED not in map(_NAME_OF, env_list):
            return False
    except (LookupError, TypeError):  # an entry that is not an object or has no name: the exact scan decides
        pass
    return any(
        isinstance(env, Mapping) and env.get("name") == names.ENV_IS_INJECTED and env.get("value") == "true"
        for env in env_list
    )


def referenced_vars(sub_path_expr: str) -> set[str]:
    """Names used as `$(NAME)` in a subPathExpr."""
    return set(_VAR_REF.findall(sub_path_expr))


def transferred(
    transfer: Sequence[TransferEnv], *, pod_metadata: Mapping[str, Any], pod_containers: Sequence[JsonObj]
) -> tuple[list[JsonObj], list[str]]:
    """Env vars copied from the pod's containers, plus a warning per missing source.

    As Kruise's GetSidecarTransferEnvs: entry by entry, and within an entry in the order of its
    (sorted) names; a var the source defines twice is taken as its last definition.
    """
    by_name = {c.get("name"): c for c in pod_containers}
    out: list[JsonObj] = []
    warnings: list[str] = []
    for entry in transfer:
        source = entry.source_in(pod_metadata)
        if source is None:
            warnings.append(
                f"transferEnv: the pod gives no source container name at {entry.source_field_path}; skipped"
            )
            continue
        container = by_name.get(source)
        if container is None:
            warnings.append(f"transferEnv: source container {source!r} is not in the pod; skipped")
            continue
        wanted = entry.env_name_set
        found = {env.get("name"): env for env in container.get("env") or [] if env.get("name") in wanted}
        out.extend([found[name] for name in entry.env_names if name in found])
    return out, warnings


def merged(
    own: Iterable[JsonObj], *additional: Iterable[JsonObj], copy_added: Callable[[JsonObj], JsonObj] = _same
) -> list[JsonObj]:
    """The sidecar's env: own vars (minus any IS_INJECTED), IS_INJECTED=true, then additions; first name wins.

    Additions kept are passed through `copy_added`, so that the result need not share the app's objects.
    """
    out: list[JsonObj] = [env for env in own if env.get("name") != names.ENV_IS_INJECTED]
    out.append({"name": names.ENV_IS_INJECTED, "value": "true"})
    seen = {env.get("name") for env in out}
    for group in additional:
        for env in group:
            if env.get("name") not in seen:
                out.append(copy_added(env))
                seen.add(env.get("name"))
    return out
