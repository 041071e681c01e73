"""Pieces of CEL that several groups of one policy write alike, defined once as policy variables.

Why: kube-apiserver type-checks every group's CEL when the policy is written and again to enforce
it, in time that grows faster than each expression's length (injector.policy.bundle), and that
compile is what a burst of SidecarSets costs every other client of the API server. SidecarSets
stamped from one template give their groups identical pieces: the env vars a sidecar takes from
the app container (`transferEnv`: a kilobyte of field-by-field copying each, injector.policy.
podfields), the shared volume mounts. Such a piece becomes one policy variable, checked once and,
since variables are lazy and cached for an evaluation, evaluated at most once per pod.

Two pieces are alike when their text is, once the group's own variables they read are named by
their content too, so a piece reading a piece of its group is hoisted only with it. Small pieces
stay in their groups: each policy variable costs every evaluation an entry (about 1.3 µs), and a
short expression costs little to check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from injector.policy.cel import VARIABLE_READ, renamed_variables

# Shorter pieces stay where they are (a piece a hoisted one reads goes with it, whatever its size).
MIN_CHARS = 200


def common(groups: Sequence[Sequence[tuple[str, str]]]) -> tuple[list[tuple[str, str]], list[dict[str, str]]]:
    """`groups`: each group's own variables (name, expression), in the order they are defined.
    Returns the policy variables to define (name, expression; each after those it reads) and, per
    group, which of its own variables each replaces (its name -> the policy variable's name)."""
    keys: list[dict[str, str]] = []  # per group: its variable -> the name of its content
    texts: dict[str, str] = {}  # content name -> expression (reading other content names), in first-seen order
    seen_in: dict[str, int] = {}  # content name -> how many groups define it
    for own in groups:
        named: dict[str, str] = {}
        for name, expression in own:
            text = renamed_variables(expression, named)
            key = "h" + hashlib.sha256(text.encode()).hexdigest()[:16]
            named[name] = key
            texts.setdefault(key, text)
        for key in set(named.values()):
            seen_in[key] = seen_in.get(key, 0) + 1
        keys.append(named)
    hoisted: set[str] = set()
    todo = [k for k, t in texts.items() if seen_in[k] > 1 and len(t) >= MIN_CHARS]
    while todo:  # with everything each reads: alike too, since its text names their content
        key = todo.pop()
        if key not in hoisted:
            hoisted.add(key)
            todo.extend(m.group(1) for m in VARIABLE_READ.finditer(texts[key]) if m.group(1) in texts)
    defined = [(k, t) for k, t in texts.items() if k in hoisted]
    return defined, [{name: key for name, key in named.items() if key in hoisted} for named in keys]
