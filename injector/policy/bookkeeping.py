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


def canonical() -> str:
    """Both hash annotations absent, empty, or in the exact form the policies can rewrite."""
    terms = []
    anns = cel.ANNOTATIONS
    for key in (names.ANN_HASH, names.ANN_HASH_WITHOUT_IMAGE):
        k = cel.string(key)
        rewritten = f'"{{" + {anns}[{k}].findAll({cel.string(ENTRY_RE)}).join(",") + "}}"'
        terms.append(f'(!({k} in {anns}) || {anns}[{k}] == "" || {anns}[{k}] == {rewritten})')
    return " && ".join(terms)


def recorded_test(ss: SidecarSet, entry: str = "e") -> str:
    """CEL over one entry text: it records this SidecarSet at its current hash."""
    key = json.dumps(ss.name) + ":"
    middle = ',"hash":' + json.dumps(ss.hash) + ","
    legacy = key + json.dumps(ss.hash)
    return (
        f"{entry}.startsWith({cel.string(key)}) && ({entry}.contains({cel.string(middle)}) || "
        f"{entry} == {cel.string(legacy)})"
    )


def recorded(ss: SidecarSet) -> str:
    """CEL: the pod's hash annotation already records this SidecarSet at its current hash."""
    k = cel.string(names.ANN_HASH)
    value = f"{cel.ANNOTATIONS}[{k}]"
    return f"{k} in {cel.ANNOTATIONS} && {value}.findAll({cel.string(ENTRY_RE)}).exists(e, {recorded_test(ss)})"


def overrides_asked() -> str:
    """CEL: the pod carries the per-pod overrides annotation, or the record of the env they applied."""
    anns = cel.ANNOTATIONS
    return " || ".join(f"({cel.string(k)} in {anns})" for k in (names.ANN_OVERRIDES, names.ANN_OVERRIDES_ENV_APPLIED))
