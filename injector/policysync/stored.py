"""Our stored policies as the sync reads them back: their names, the SidecarSets they hold, which of
two versions of one is the newer, and which of our writes put back someone else's change."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import orjson
from prometheus_client import Counter

from injector.policy import params
from injector.policy.generate import ANN_MEMBERS, covers
from injector.policysync.desired import ANN_GENERATED_AT, STAMP
from kuberuntime import api
from kuberuntime.jsontypes import JsonObj


def name_of(obj: JsonObj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("name") or "")


def older(obj: JsonObj, than: JsonObj | None) -> bool:
    """`obj` is an older version than `than` (resourceVersions compared as the numbers etcd gives)."""
    try:
        return than is not None and int(obj["metadata"]["resourceVersion"]) < int(than["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False


def members(policy: JsonObj) -> list[str]:
    """The SidecarSets a stored policy of ours injects (its groups joined by ";", members by ",")."""
    text = str((((policy.get("metadata") or {}).get("annotations")) or {}).get(ANN_MEMBERS) or "")
    return [m for group in text.split(";") for m in group.split(",") if m]


def params_current(want: JsonObj, have: JsonObj | None) -> bool:
    """The stored parameter object holds exactly the values wanted (a key left over is dropped)."""
    return covers(want, have) and params.values(want) == params.values(have)


def changed_members(stored: JsonObj | None, digests: Mapping[str, str], annotation: str) -> list[str]:
    """The members of the groups whose CEL differs from what the stored policy holds (its group
    digests in `annotation`; all of a new policy's): only their pods need the webhook until the API
    server enforces the new one."""
    annotations = ((stored or {}).get("metadata") or {}).get("annotations") or {}
    try:
        held = orjson.loads(annotations.get(annotation) or "{}")
    except orjson.JSONDecodeError:
        held = {}
    if not isinstance(held, dict):
        held = {}
    return [m for key, digest in digests.items() if held.get(key) != digest for m in key.split(",")]


REPAIRS = Counter(
    "sidecarctl_policy_repairs_total",
    "Our MutatingAdmissionPolicies, bindings and their parameter objects written back after someone else changed or "
    "deleted them, by kind.",
    ["kind"],
)
for _kind in ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings", params.PLURAL):
    REPAIRS.labels(_kind)  # from 0, so that the first repair is an increase a rate sees


class LastWritten:
    """The body last written to each object: asked to write the same body again, the sync is putting
    back someone else's change (a hand edit, a delete), which `sidecarctl_policy_repairs_total`
    counts; a changed SidecarSet gives a new body and is not counted. The generation time is left
    out of the comparison: a deleted policy is written back with a new one. One write is counted
    that is not someone else's: a binding the garbage collector deleted while our update to it was
    in flight (its owners changed at that moment), written again by the next pass."""

    def __init__(self) -> None:
        self._bodies: dict[str, bytes] = {}

    def write(self, path: str, body: JsonObj) -> None:
        """Note a write of `body` to `path`/its name; count it when it repeats the last one."""
        key, text = f"{path}/{name_of(body)}", _timeless(body)
        if self._bodies.get(key) == text:
            REPAIRS.labels(path.rsplit("/", 1)[-1]).inc()
        self._bodies[key] = text


def _timeless(body: JsonObj) -> bytes:
    text = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    stamp = (((body.get("metadata") or {}).get("annotations")) or {}).get(ANN_GENERATED_AT)
    return text.replace(stamp.encode(), STAMP.encode()) if isinstance(stamp, str) and stamp else text


async def put(client: api.Client, path: str, body: JsonObj, into: dict[str, JsonObj], written: LastWritten) -> None:
    """Create or replace the object (`into` holds the stored ones by name), and keep the answer there:
    the next pass compares with what was written, not with a watch that may not have delivered it yet
    (a large policy takes seconds to store; comparing with the older one would write again, with a
    new time, for ever). That answer can outlive the object (the garbage collector deletes a binding
    whose owners are gone while our update adding one is in flight; the watch's DELETED comes before
    the answer), so a replace that finds nothing creates: every pass used to fail on the same 404."""
    name = name_of(body)
    stored = into.get(name)
    answer: JsonObj | None = None
    if stored is not None:
        with contextlib.suppress(api.NotFound):
            answer = await _replace(client, f"{path}/{name}", body, stored)
    if answer is None:
        try:
            answer = await client.create(path, body)
        except api.Conflict:  # there already (our watch is behind): replace it
            answer = await _replace(client, f"{path}/{name}", body, await client.get(f"{path}/{name}"))
    if not older(answer, into.get(name)):
        into[name] = answer
    written.write(path, body)


async def _replace(client: api.Client, path: str, body: JsonObj, stored: JsonObj) -> JsonObj:
    version = {"resourceVersion": stored["metadata"]["resourceVersion"]}
    answer: JsonObj = await client.update(path, {**body, "metadata": {**body["metadata"], **version}})
    return answer
