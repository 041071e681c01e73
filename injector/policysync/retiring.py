"""Objects the policy sync deletes only `settle` seconds after they stopped being needed.

Each kube-apiserver follows our policies, bindings, parameter objects and the webhook's
configuration by watches of its own, and applies a changed policy or binding at its next recompile
(up to a second later). Deleting the next object of a hand-over at once would let a server that
sees that deletion first, and the one before it late, admit or refuse pods wrongly:
- `HandOver`: a policy whose SidecarSets moved to the webhook goes `settle` seconds after the
  condition that widened the webhook for them was written; a server that dropped the policy before
  it had the widened condition would admit those pods through neither path;
- `UnusedParams`: a parameter object goes `settle` seconds after its policy and binding were seen
  gone; a server still holding the binding without the object refuses the binding's pods
  (`parameterNotFoundAction: Deny`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from injector.policy import params
from injector.policy import plan as planning
from injector.policysync.stored import members
from kuberuntime.jsontypes import JsonObj


class HandOver:
    """`keep(...)`: of the stale policies handed over to the webhook, those to keep for now; `at`: when next to look."""

    def __init__(self, settle: float, monotonic: Callable[[], float]) -> None:
        self.settle = settle
        self.monotonic = monotonic
        self.at: float | None = None

    @staticmethod
    def handed(
        stale: Iterable[str], policies: Mapping[str, JsonObj], routes: Mapping[str, planning.Route]
    ) -> frozenset[str]:
        """Stale policies with a SidecarSet the webhook serves now (a paused or deleted one's has none)."""
        return frozenset(
            n
            for n in stale
            if any((r := routes.get(m)) and r.path is planning.Path.WEBHOOK for m in members(policies.get(n) or {}))
        )

    def keep(self, handed: frozenset[str], widened: bool) -> frozenset[str]:
        """`handed` until `settle` seconds after the condition that widened the webhook for them was
        written (`widened`: this pass wrote it)."""
        if not handed:
            self.at = None
            return handed
        if self.at is None:
            if not widened:  # the condition write failed (dirty is set): the wait starts once it is written
                return handed
            self.at = self.monotonic() + self.settle
        if self.monotonic() < self.at:
            return handed
        self.at = None
        return frozenset()


class UnusedParams:
    """`due(unused)`: of the parameter objects whose policy and binding the watches no longer hold,
    those that may go now; `times()`: when the others may."""

    def __init__(self, settle: float, monotonic: Callable[[], float]) -> None:
        self.settle = settle
        self.monotonic = monotonic
        self.gone: dict[str, float] = {}  # name -> when it may go

    def due(self, unused: Iterable[str]) -> list[str]:
        now = self.monotonic()
        self.gone = {n: self.gone.get(n, now + self.settle) for n in unused}
        return [n for n, at in self.gone.items() if now >= at]

    def times(self) -> list[float]:
        return list(self.gone.values())


class OldKeys:
    """Keys of our parameter objects that the versions of the policies being stored no longer read.

    A kube-apiserver enforces the CEL it compiled last, a second or more after a policy is written (its
    next refresh, then the compile), but reads the parameter object as it is now: each version of a
    group's CEL reads keys of its own (injector.policy.generate), and the keys of the version before
    stay in the object while a server may still enforce it (without them it would refuse those pods:
    a missing key is an error, and the policies fail closed). So they go only once nothing is settling
    (the sync's estimate of when every written policy is enforced) and `settle` seconds after they
    stopped being read.
    """

    def __init__(self, settle: float, monotonic: Callable[[], float]) -> None:
        self.settle = settle
        self.monotonic = monotonic
        self.since: dict[tuple[str, str], float] = {}  # (object, key) -> when it stopped being read

    def kept(self, desired: Mapping[str, JsonObj], stored: Mapping[str, JsonObj], settling: bool) -> dict[str, JsonObj]:
        """`desired` (name -> parameter object) with the stored objects' other keys added back while
        they may still be read."""
        now = self.monotonic()
        since: dict[tuple[str, str], float] = {}
        out: dict[str, JsonObj] = {}
        for name, obj in desired.items():
            want, have = params.values(obj), params.values(stored.get(name))
            keep = {}
            for key, value in have.items():
                if key in want:
                    continue
                since[(name, key)] = at = self.since.get((name, key), now)
                if settling or now < at + self.settle:
                    keep[key] = value
            out[name] = params.with_values(obj, {**want, **keep}) if keep else obj
        self.since = since
        return out

    def times(self) -> list[float]:
        return [at + self.settle for at in self.since.values()]
