"""The SidecarSet bookkeeping annotations, as CEL: recognising, testing and rewriting them.

CEL cannot parse JSON, so a policy only works on hash annotations in the exact compact form the
engine (and the policies) write: each entry matched by `ENTRY_RE`, the whole annotation being
`{` + entries joined by `,` + `}`. A pod whose annotation has any other form is left to the
webhook (which parses it), so the two paths always write the same text. An entry's key is a
SidecarSet's name or a NamespacedSidecarSet's `<namespace>/<name>` (names.sidecarset_key). A pod
that asks for per-pod overrides (or carries their record) is the webhook's too: the overrides are
read, checked and merged there (sidecarsets.overrides), once.
"""

from __future__ import annotations

import json

from injector.engine import metadata
from injector.policy import cel
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

_QUOTED = r'"[^"\\]*"'
ENTRY_RE = (
    r'"[a-zA-Z0-9._/-]+":(?:\{"updateTimestamp":(?:' + _QUOTED + r'|null),"hash":' + _QUOTED
    + r',"sidecarSetName":' + _QUOTED
    + r',"sidecarList":\[(?:' + _QUOTED + r"(?:," + _QUOTED + r")*)?\]"
    + r'(?:,"controllerRevision":' + _QUOTED + r")?\}|" + _QUOTED + ")"
)  # fmt: skip


def entry_text(ss: SidecarSet, *, timestamp: str, without_image: bool) -> str:
    """The entry this SidecarSet writes, exactly as the engine writes it."""
    head, tail = metadata.entry_text(ss, without_image=without_image)
    return head + json.dumps(timestamp) + tail


def entry(ss: SidecarSet, *, without_image: bool, time: str, quoted_hash: str, revision: str) -> str:
    """CEL: the entry this SidecarSet writes, exactly as the engine writes it, with the parts a new image
    changes read from CEL expressions: `time` (the time as JSON text), and in the entry with the image
    `quoted_hash` (its hash as JSON text) and `revision` (`,"controllerRevision":"<name>"`, or empty)."""
    head, tail = metadata.entry_text(ss, without_image=without_image)
    if without_image:
        return f"{cel.string(head)} + {time} + {cel.string(tail)}"
    hashed = ',"hash":' + json.dumps(ss.hash)
    closing = revision_text(ss) + "}"
    if not (tail.startswith(hashed) and tail.endswith(closing)):
        raise ValueError(f"unexpected bookkeeping entry of {ss.name}: {tail}")
    middle = tail[len(hashed) : len(tail) - len(closing)]
    key = cel.string(',"hash":')
    return f'{cel.string(head)} + {time} + {key} + {quoted_hash} + {cel.string(middle)} + {revision} + "}}"'


def revision_text(ss: SidecarSet) -> str:
    """What `entry` reads as `revision`: the SidecarSet's revision as the entry writes it, or nothing."""
    return ',"controllerRevision":' + json.dumps(ss.latest_revision) if ss.latest_revision else ""


def canonical() -> str:
    """Both hash annotations absent, empty, or in the exact form the policies can rewrite."""
    terms = []
    anns = cel.ANNOTATIONS
    for key in (names.ANN_HASH, names.ANN_HASH_WITHOUT_IMAGE):
        k = cel.string(key)
        rewritten = f'"{{" + {anns}[{k}].findAll({cel.string(ENTRY_RE)}).join(",") + "}}"'
        terms.append(f'(!({k} in {anns}) || {anns}[{k}] == "" || {anns}[{k}] == {rewritten})')
    return " && ".join(terms)


def recorded_test(ss: SidecarSet, quoted_hash: str, entry: str = "e") -> str:
    """CEL over one entry text: it records this SidecarSet at the hash `quoted_hash` (CEL giving the
    hash as JSON text: the policy reads it from its parameter object)."""
    key = cel.string(json.dumps(ss.name) + ":")
    before, after = cel.string(',"hash":'), cel.string(",")
    return (
        f"{entry}.startsWith({key}) && ({entry}.contains({before} + {quoted_hash} + {after}) || "
        f"{entry} == {key} + {quoted_hash})"
    )


def overrides_asked() -> str:
    """CEL: the pod carries the per-pod overrides annotation, or the record of the env they applied."""
    anns = cel.ANNOTATIONS
    return " || ".join(f"({cel.string(k)} in {anns})" for k in (names.ANN_OVERRIDES, names.ANN_OVERRIDES_ENV_APPLIED))
