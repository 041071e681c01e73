"""The text form of `sidecarctl preview`'s document, for people (`-o json` prints the document itself).

Apart from sidecarctl.cli.previewcmd, which reads the cluster and builds the document: the text is
drawn from the document alone, section by section, so both outputs always say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarctl.cli import clusterread


def _container_line(c: Mapping[str, Any]) -> str:
    label = f"{'init container' if c['kind'] == 'initContainer' else 'container'} {c['name']}"
    old, new = c["image"]["old"], c["image"]["new"]
    if c["change"] == "added":
        return f"{label}: added ({new})"
    if c["change"] == "removed":
        return f"{label}: removed (was {old})"
    parts = []
    if old != new:
        parts.append(f"image {old} -> {new}")
    if c["fields"]:
        parts.append(f"{', '.join(c['fields'])} changed")
    return f"{label}: {'; '.join(parts) or 'unchanged'}"


def _pod_keys(doc: Mapping[str, Any]) -> list[str]:
    r = doc["rollout"] or {}
    keys = [k for b in r.get("batches") or [] for k in b["pods"]] + list(r.get("kept") or [])
    keys += [i["pod"] for i in [*(r.get("waitingOn") or []), *(r.get("notReadyBefore") or [])]]
    keys += [i["pod"] for i in [*doc["notUpgradable"], *doc["noLongerMatched"], *doc["neverInjected"]]]
    keys += list(doc["excludedByUpdateSelector"])
    keys += [f"{p['namespace']}/{p['example'] or '-'}" for p in doc["newPods"]]
    return keys


def render(doc: Mapping[str, Any]) -> str:
    short = clusterread.PodNames(_pod_keys(doc))
    lines = [
        *_title(doc, short),
        *_changes(doc),
        *_rollout(doc["rollout"], short),
        *_left_behind(doc, short),
        *_new_pods(doc, short),
    ]
    return "\n".join(lines) + "\n"


def _title(doc: Mapping[str, Any], short: clusterread.PodNames) -> list[str]:
    lines: list[str] = []
    add = lines.append
    gen = doc["generation"]
    if doc["new"]:
        add(f"SidecarSet {doc['sidecarSet']} is new: nothing is rolled out, only new pods get it.")
    else:
        bump = "unchanged" if gen["applied"] == gen["stored"] else f"{gen['stored']} -> {gen['applied']}"
        add(f"SidecarSet {doc['sidecarSet']} (generation {bump})")
    if short.namespace is not None:
        add(f"Pods of namespace {short.namespace}.")
    return lines


def _changes(doc: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    add = lines.append
    add("")
    add("Changes:")
    changes = [c for c in doc["changes"]["containers"] if c["change"] != "unchanged" or doc["new"]]
    for c in changes:
        add(f"  {_container_line(c)}")
    if doc["changes"]["otherFields"]:
        add(f"  spec: {', '.join(doc['changes']['otherFields'])} changed")
    if not changes and not doc["changes"]["otherFields"]:
        add("  none")
    if not doc["new"]:
        if doc["inPlace"]:
            add("  only images change: matched pods are upgraded in place")
        elif doc.get("resizedInPlace"):
            add("  only images and resources change: matched pods are upgraded and resized in place (pods/resize)")
        else:
            add(
                "  more than images and resources change: pods injected before cannot be upgraded in place "
                "(recreate them)"
            )
    return lines


def _rollout(r: Mapping[str, Any] | None, short: clusterread.PodNames) -> list[str]:
    lines: list[str] = []
    add = lines.append
    if r is not None:
        add("")
        add(
            f"Rollout to revision {r['revision']}: {r['matched']} pod(s) matched, {r['alreadyUpdated']} already "
            f"updated; maxUnavailable {r['maxUnavailable']}, partition {r['partition']}"
        )
        for item in r["notReadyBefore"]:
            add(f"  not ready now: {short(item['pod'])} ({item['reason']})")
        resized = set(r.get("resized") or ())
        for b in r["batches"]:
            step = " resize" if resized and resized >= set(b["pods"]) else ""
            add(f"  batch {b['batch']} ({len(b['pods'])}){step}: {short.join(b['pods'])}")
        if not r["batches"]:
            add("  no batch: nothing is upgraded")
        end = r["end"]
        add(f"  then: {end['reason']} ({r['upgraded']} pod(s) upgraded in {len(r['batches'])} batch(es))")
        if r["kept"]:
            add(f"  kept on the old revision by the partition ({len(r['kept'])}): {short.join(r['kept'])}")
        for item in r["waitingOn"]:
            add(f"  waits for: {short(item['pod'])} ({item['reason']})")
    return lines


def _left_behind(doc: Mapping[str, Any], short: clusterread.PodNames) -> list[str]:
    lines: list[str] = []
    add = lines.append
    if doc["notUpgradable"]:
        add("")
        add(f"Not upgradable in place ({len(doc['notUpgradable'])}); recreate them to pick up the change:")
        for b in doc["notUpgradable"]:
            add(f"  {short(b['pod'])}: {'; '.join(b['fields'])} (compared with {b['comparedWith']})")
    if doc["excludedByUpdateSelector"]:
        add("")
        add(f"Outside updateStrategy.selector ({len(doc['excludedByUpdateSelector'])}):")
        add(f"  {short.join(doc['excludedByUpdateSelector'])}")
    for key, title in (
        ("noLongerMatched", "Injected by it but no longer matched"),
        ("neverInjected", "Selected but never injected by it (not upgraded)"),
    ):
        if doc[key]:
            add("")
            add(f"{title} ({len(doc[key])}):")
            for u in doc[key]:
                add(f"  {short(u['pod'])}: {u['reason']}")
    return lines


def _new_pods(doc: Mapping[str, Any], short: clusterread.PodNames) -> list[str]:
    lines = ["", "New pods:"]
    if not doc["newPods"]:
        lines.append("  no running pod (and no selector matchLabels) to show a new pod from")
    for p in doc["newPods"]:
        lines += _new_pod(p, doc["sidecarSet"], short)
    return lines


def _new_pod(p: Mapping[str, Any], sidecarset: str, short: clusterread.PodNames) -> list[str]:
    lines: list[str] = []
    add = lines.append
    labels = ",".join(f"{k}={v}" for k, v in sorted(p["labels"].items()))
    like = f"{p['pods']} pod(s) like {short(p['example'])}" if p["example"] else "an example pod"
    owner = f", {p['owner']}" if p["owner"] else ""
    where = "" if p["namespace"] == short.namespace else f"namespace {p['namespace']}, "
    add(f"  {where}labels {labels or '(none)'} ({like}{owner}):")
    if p["denied"]:
        add(f"    refused: {p['denied']}")
        return lines
    if p["skipped"]:
        add(f"    not injected: {p['skipped']}")
    if p["pinnedRevision"]:
        add(f"    pinned by injectionStrategy.revision: gets {p['pinnedRevision']}")
    for key, title in (("initContainers", "init containers"), ("containers", "containers")):
        if p[key]:
            shown = ", ".join(
                f"+{c['name']} ({c['image']})"
                if c["sidecarSet"] == sidecarset
                else f"{c['name']}" + (f" [{c['sidecarSet']}]" if c["sidecarSet"] else "")
                for c in p[key]
            )
            add(f"    {title}: {shown}")
    for w in p["warnings"]:
        add(f"    warning: {w}")
    return lines
