"""What the builders of one MutatingAdmissionPolicy share: the policy being written, the group it
injects, and the error that says a policy cannot serve it.

The generator (injector.policy.generate) is assembled from parts, the pod spec's lists
(injector.policy.specops) and the pod's metadata (injector.policy.metadataops); each part writes
into the same Build and asks the same `ok` whether a member SidecarSet is injected into the pod.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from injector.policy import cel, params
from sidecarsets.spec.model import SidecarSet

V = cel.VARIABLES


class NeedsWebhook(Exception):
    """The SidecarSet (or group) cannot be served by a policy; the message names the feature."""


@dataclass
class Build:
    """The policy being written: named CEL variables, patch operations, declining conditions."""

    variables: list[tuple[str, str]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    declines: list[str] = field(default_factory=list)
    annotations: list[tuple[str, str, str | None]] = field(default_factory=list)  # key, value, written when
    params: dict[str, str] = field(default_factory=dict)  # the policy's parameter object's values, by name
    param_keys: dict[str, str] = field(default_factory=dict)  # their names -> what each holds

    def var(self, name: str, expr: str) -> str:
        self.variables.append((name, expr))
        return V + name

    def param(self, key: str, value: str) -> str:
        """CEL reading `value` from the policy's parameter object (injector.policy.params), stored under
        a name for `key` (`<SidecarSet>:image:<container>` and the like)."""
        name = params.key_name(key, self.param_keys)
        self.param_keys[name] = key
        self.params[name] = value
        return cel.param(name)


class Part:
    """The state every part of the generator reads: the group (in `injection_order`), the time to record
    and the Build under way."""

    group: list[SidecarSet]
    single: bool  # a group of one: its binding, not CEL, decides which pods it sees
    timestamp: str
    b: Build

    def quoted_hash(self, ss: SidecarSet) -> str:
        """CEL: the SidecarSet's hash as JSON text, from the parameter object (an image changes it)."""
        return self.b.param(f"{ss.name}:hash", json.dumps(ss.hash))

    def ok(self, i: int) -> str:
        """CEL: SidecarSet i is injected into this pod (always true for a group of one: the binding gates it)."""
        return "true" if self.single else V + f"ok{i}"
