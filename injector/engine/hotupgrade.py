"""HotUpgrade at injection: a hot sidecar `<n>` enters the pod as the pair `<n>-1` / `<n>-2`.

This is Kruise's webhook (injectHotUpgradeContainers, generateHotUpgradeContainers,
setSidecarContainerVersionEnv). The container is first built exactly as a cold one (shared
mounts, IS_INJECTED, transferred env), then copied: `<n>-1` keeps the SidecarSet's image and
serves, `<n>-2` gets `upgradeStrategy.hotUpgradeEmptyImage` verbatim (an unset one is "", which
the API server refuses, as it refuses Kruise's). Each copy then gets, after every other var and
without dedupe, SIDECARSET_VERSION and SIDECARSET_VERSION_ALT read from its own version
annotations, which is how the two processes tell which of them is the newer one during a swap.

The pod is annotated with `-1` at version "1" (partner "0") and `-2` at "0" (partner "1"), and the
working annotation maps `<n>` to `<n>-1`, merged into the map the pod already carries, so that
several hot sidecars (of one SidecarSet or several) end up in one object.

Which sidecars become pairs (hot containers, and hot native-sidecar init containers; a plain init
container runs once and is injected whole) and their empty images come from
sidecarsets.rollout.hotupgrade, the controller's reading of the same SidecarSet: the pods injected here
are the pods it upgrades.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import orjson

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names, podmeta
from sidecarsets.spec.hotsidecars import HotSidecar, hot_sidecars
from sidecarsets.spec.model import SidecarSet
from sidecarsets.spec.sidecar import hot_pair

# The version the pair's containers start at: `-1` is the first one injected, `-2` the empty one.
FIRST_VERSION = "1"
EMPTY_VERSION = "0"


def pairs_of(ss: SidecarSet) -> dict[tuple[bool, str], HotSidecar]:
    """(is an init container, name) → the pair that sidecar of `ss` becomes; {} when none is hot."""
    if not any(sc.hot for sc in (*ss.containers, *ss.init_containers)):
        return {}
    return {(h.init, h.name): h for h in hot_sidecars(ss)}


def split(container: JsonObj, pair: HotSidecar) -> tuple[JsonObj, JsonObj]:
    """`container`, built as a cold sidecar, turned into `<n>-1` (in place) and `<n>-2` (a copy
    sharing nothing with it); both keep every other field, in the same key order."""
    first_name, second_name = pair.pair
    second: JsonObj = copy.deepcopy(container)
    first = container
    first["name"] = first_name
    second["name"] = second_name
    second["image"] = pair.empty_image
    for c in (first, second):
        c["env"] = [*(c.get("env") or []), *_version_env(str(c["name"]))]
    return first, second


def _version_env(container: str) -> list[JsonObj]:
    # No apiVersion in the fieldRef, as Kruise leaves it: the API server defaults it to v1.
    return [
        {"name": env, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{prefix}{container}']"}}}
        for env, prefix in (
            (names.ENV_SIDECARSET_VERSION, names.ANN_VERSION_PREFIX),
            (names.ENV_SIDECARSET_VERSION_ALT, names.ANN_VERSION_ALT_PREFIX),
        )
    ]


def pod_annotations(current_working: str | None, sidecars: Iterable[str], warnings: list[str]) -> dict[str, str]:
    """The pod annotations injecting the hot `sidecars` (logical names) writes; {} for none.

    `current_working` is the pod's working annotation as it came: its entries are kept (Kruise
    reads an unreadable one as empty; here that also gives a warning).
    """
    out: dict[str, str] = {}
    working: dict[str, str] = {}
    for name in sidecars:
        first, second = hot_pair(name)
        out[names.ANN_VERSION_PREFIX + first] = FIRST_VERSION
        out[names.ANN_VERSION_ALT_PREFIX + first] = EMPTY_VERSION
        out[names.ANN_VERSION_PREFIX + second] = EMPTY_VERSION
        out[names.ANN_VERSION_ALT_PREFIX + second] = FIRST_VERSION
        working[name] = first
    if not working:
        return out
    merged = _working(current_working, warnings)
    merged.update(working)
    # Go's json.Marshal of a map: compact, keys sorted.
    out[names.ANN_WORKING_HOT] = podmeta.dumps(merged, sort_keys=True)
    return out


def _working(raw: str | None, warnings: list[str]) -> dict[str, str]:
    """The pod's working map: its string entries (as Go decodes a map[string]string, which keeps
    the entries it can), or {} when the annotation is absent or not a JSON object."""
    if not raw:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = ()
    if value is None:  # `null` decodes into an empty map
        return {}
    if not isinstance(value, dict):
        warnings.append(f"{names.ANN_WORKING_HOT}: annotation is not a JSON object; it is rewritten")
        return {}
    kept = {k: v for k, v in value.items() if isinstance(v, str)}
    if len(kept) != len(value):
        warnings.append(f"{names.ANN_WORKING_HOT}: entries that are not strings are dropped")
    return kept
