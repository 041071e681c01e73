"""Where injected containers go in the pod's lists, as Kruise's mergeSidecarContainers places them.

A sidecar whose name is already in the pod replaces that container at its index; the others go
before the app containers (BeforeAppContainer, as one block in SidecarSet order) or after them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec.enums import InjectPolicy


def duplicate_name(
    placements: Iterable[tuple[Sequence[JsonObj], dict[int, JsonObj], list[JsonObj], list[JsonObj]]],
) -> str | None:
    """A name that an added container shares with any other container of the resulting pod."""
    placements = list(placements)
    every = [
        c["name"] for original, _, before, after in placements for group in (original, before, after) for c in group
    ]
    if len(set(every)) == len(every):
        return None
    counts: dict[str, int] = {}
    added: list[str] = []
    for original, _, before, after in placements:
        for c in [*original, *before, *after]:
            counts[c["name"]] = counts.get(c["name"], 0) + 1
        added += [c["name"] for c in [*before, *after]]
    return next((n for n in added if counts[n] > 1), None)


def placement(
    original: Sequence[JsonObj], items: Sequence[tuple[str, JsonObj]]
) -> tuple[dict[int, JsonObj], list[JsonObj], list[JsonObj]]:
    """Kruise's mergeSidecarContainers: same name → replaced at its index; else before or after the app."""
    index = {c["name"]: i for i, c in enumerate(original)}
    replace: dict[int, JsonObj] = {}
    before: list[JsonObj] = []
    after: list[JsonObj] = []
    for inject_policy, container in items:
        i = index.get(container["name"])
        if i is not None:
            replace[i] = container
        elif inject_policy == InjectPolicy.BEFORE_APP:
            before.append(container)
        else:
            after.append(container)
    return replace, before, after
