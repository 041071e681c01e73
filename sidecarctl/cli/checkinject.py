"""`sidecarctl check-inject`: why a pod was (or was not) injected, and whether its sidecars are
current, like `istioctl x check-inject`.

Reads the pods (one, a label selector's, or a workload's: its spec.selector; its pod template when
it has none), every SidecarSet, the namespaces, our MutatingAdmissionPolicies and, only when a pod
carries an outdated sidecar, the injected pods and ControllerRevisions that place it in its rollout:
GET and LIST only. The verdicts are the product's own (sidecarctl.cli.checkinjectwhy).

Exit status 0 when every SidecarSet that selects a checked pod is in it at its current version, 1
when one is missing or out of date (or the cluster cannot be read, or the object does not exist),
2 for a bad command line. A SidecarSet already in a pod is judged as its controller counts the pod,
even where the injection rules (paused injection, the namespace label, opting out) now say no.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import checkinjectwhy as why
from sidecarctl.cli import clusterread
from sidecarctl.cli.clierror import CliError
from sidecarsets.pods.projection import project
from sidecarsets.rollout.planner import Stage
from sidecarsets.spec import names, selectors
from sidecarsets.spec.model import SidecarSet

if TYPE_CHECKING:
    from kuberuntime import kubeapi
    from sidecarsets.rollout.glance import Glance

_HELP = "say why pods were (not) injected and whether their sidecars are current (like istioctl x check-inject)"
_EPILOG = f"""\
TARGET is a pod (NAME with -n, NAMESPACE/NAME, or pod/NAME) or a workload (deployment/NAME,
statefulset/NAME, daemonset/NAME, replicaset/NAME, job/NAME with -n): its pods, found by its
spec.selector, or its pod template when it has no pods. -l SELECTOR checks the pods of -n's namespace
that match it. Without -n the namespace is "default".

For each pod and each SidecarSet: whether it selects the pod and, if not, the rule that says no (the
namespace label {names.NS_INJECTION_LABEL}={names.NS_INJECTION_ENABLED}, the opt-out label
{names.POD_INJECT_LABEL}="false", a system namespace, paused injection, the namespace scope, the
failing selector term, a canary that replaces it, a container-name conflict); the path that injects
it (a named MutatingAdmissionPolicy, or the webhook and why); whether the pod has it, at which
revision, and why an outdated pod is not upgraded (yet). A SidecarSet in the pod is current or out
of date as its controller counts the pod, whatever the injection rules say of new pods.

Exit status: 0 every SidecarSet that selects a pod or that the controller counts in it is present
and current, 1 one is missing or out of date (or the cluster cannot be read, or the object does not
exist), 2 bad command line.
"""

APPS = "/apis/apps/v1/namespaces/{ns}/{plural}/{name}"
WORKLOADS = {
    "deployment": APPS.replace("{plural}", "deployments"),
    "statefulset": APPS.replace("{plural}", "statefulsets"),
    "daemonset": APPS.replace("{plural}", "daemonsets"),
    "replicaset": APPS.replace("{plural}", "replicasets"),
    "job": "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
}
ALIASES = {"deploy": "deployment", "sts": "statefulset", "ds": "daemonset", "rs": "replicaset", "po": "pod"}
POLICIES = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def add_check_inject(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "check-inject",
        help=_HELP,
        description=_HELP,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", nargs="?", metavar="TARGET", help="NAME, NAMESPACE/NAME, pod/NAME or KIND/NAME")
    parser.add_argument("-n", "--namespace", metavar="NS", help='the namespace (default "default")')
    parser.add_argument("-l", "--selector", metavar="SELECTOR", help="check the pods matching this label selector")
    clusterread.add_cluster_flags(parser)
    parser.set_defaults(func=run_check_inject, parser=parser)


@dataclass(frozen=True)
class Target:
    kind: str  # "pod", "selector", or a key of WORKLOADS
    namespace: str
    name: str  # the label selector for "selector"


def parse_target(target: str | None, namespace: str | None, selector: str | None) -> Target:
    """The object the command line names; ValueError with what is wrong (argparse makes it status 2)."""
    if namespace is not None and not _valid(namespace, label=True):
        raise ValueError(f"-n {namespace!r} is not a namespace name")
    ns = namespace or "default"
    if target is not None and selector is not None:
        raise ValueError("give a pod, a workload or -l SELECTOR, not both")
    if selector is not None:
        if not selector.strip():
            raise ValueError("-l needs a label selector such as app=web")
        return Target("selector", ns, selector)
    if target is None:
        raise ValueError("give a pod (NAME or NAMESPACE/NAME), a workload (KIND/NAME) or -l SELECTOR")
    parts = target.split("/")
    if len(parts) > 2:
        raise ValueError(f"{target!r}: use NAME, NAMESPACE/NAME or KIND/NAME")
    if len(parts) == 1:
        kind, name = "pod", parts[0]
    else:
        word = parts[0].lower().removesuffix("s") if parts[0].lower() not in ALIASES else parts[0].lower()
        word = ALIASES.get(word, word)
        if word == "pod" or word in WORKLOADS:
            kind, name = word, parts[1]
        elif namespace is not None and namespace != parts[0]:
            raise ValueError(f"{target!r} names namespace {parts[0]}, but -n says {namespace}")
        elif _valid(parts[0], label=True):
            kind, ns, name = "pod", parts[0], parts[1]
        else:
            raise ValueError(f"{parts[0]!r} is neither a namespace nor one of pod, {', '.join(WORKLOADS)}")
    if not _valid(name):
        raise ValueError(f"{name!r} is not a valid object name")
    return Target(kind, ns, name)


def _valid(name: str, *, label: bool = False) -> bool:
    return bool(_NAME.match(name)) and (not label or (len(name) <= 63 and "." not in name))


# ---------------------------------------------------------------------------------------------
# Reading


async def _pods(client: kubeapi.KubeClient, target: Target) -> list[tuple[JsonObj, str | None]]:
    """(pod, None) for each pod to check, or the workload's template as (would-be pod, "kind/name")."""
    ns, name = target.namespace, target.name
    if target.kind == "pod":
        pod = await clusterread.get_or_none(client, f"/api/v1/namespaces/{ns}/pods/{name}")
        if pod is None:
            raise CliError(f"pod {ns}/{name} not found")
        return [(pod, None)]
    if target.kind == "selector":
        found = await clusterread.list_all(client, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": name})
        if not found:
            raise CliError(f"no pod in namespace {ns} matches -l {name}")
        return [(p, None) for p in sorted(found, key=lambda p: str(p["metadata"].get("name")))]
    workload = await clusterread.get_or_none(client, WORKLOADS[target.kind].format(ns=ns, name=name))
    if workload is None:
        raise CliError(f"{target.kind} {ns}/{name} not found")
    spec = workload.get("spec") or {}
    selector = spec.get("selector")
    labels = (selector or {}).get("matchLabels") or {}
    params: dict[str, str | int] = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else {}
    listed = await clusterread.list_all(client, f"/api/v1/namespaces/{ns}/pods", params)
    mine = [p for p in listed if selectors.matches(selector, (p.get("metadata") or {}).get("labels") or {})]
    if mine:
        return [(p, None) for p in sorted(mine, key=lambda p: str(p["metadata"].get("name")))]
    template = spec.get("template") or (spec.get("jobTemplate") or {}).get("spec", {}).get("template") or {}
    meta = template.get("metadata") or {}
    would_be: JsonObj = {
        "metadata": {**meta, "namespace": ns, "name": f"{target.kind}/{name}"},
        "spec": template.get("spec") or {"containers": []},
    }
    return [(would_be, f"{target.kind}/{name}")]


async def gather(
    client: kubeapi.KubeClient, target: Target, *, manager_namespace: str, now: str
) -> tuple[list[tuple[JsonObj, str | None]], why.Cluster]:
    import asyncio

    pods, sets, namespaces, policies = await asyncio.gather(
        _pods(client, target),
        clusterread.list_all(client, clusterread.SS_PATH),
        clusterread.list_all(client, "/api/v1/namespaces"),
        clusterread.list_optional(client, POLICIES, {"labelSelector": "app.kubernetes.io/managed-by=sidecarctl"}),
    )
    models = sorted((SidecarSet.from_object(o, tolerant=True) for o in sets), key=lambda s: s.name)
    members = policy_members(policies or [])
    cluster = why.Cluster(models, namespaces, manager_namespace, {ss.name: route_of(ss, members) for ss in models})
    projected = [project(p) for p, template in pods if template is None]
    late = {ss.name: [p for p in projected if why.outdated(ss, p, cluster.labels.get(p.namespace))] for ss in models}
    if any(late.values()):
        injected, revs = await asyncio.gather(
            clusterread.list_optional(client, "/api/v1/pods", {"labelSelector": f"{names.POD_INJECTED_LABEL}=true"}),
            clusterread.revisions(client, manager_namespace),
        )
        rollout = None if injected is None else _RolloutInputs(injected, cluster.labels, revs, now)
        for ss in models:
            if late[ss.name] and rollout is not None:
                glance = rollout.glance(ss)
                for p in late[ss.name]:
                    key = f"{p.namespace}/{p.name}"
                    cluster.held[(ss.name, key)] = why_outdated(key, glance)
    return pods, cluster


def policy_members(policies: list[JsonObj]) -> dict[str, str]:
    """SidecarSet -> the MutatingAdmissionPolicy of ours that holds it (injector.policy.stored)."""
    from injector.policy import stored

    return {member: stored.name_of(p) for p in reversed(policies) for member in stored.members(p)}


def route_of(ss: SidecarSet, members: dict[str, str]) -> why.Route:
    """The path the manager reports for `ss` (its PolicyInjection condition, the policy that holds
    it); without a report, what the spec alone says (injector.policy.generate.check_servable)."""
    from injector.policy.build import NeedsWebhook
    from injector.policy.generate import check_servable

    if ss.injection_paused or selectors.is_empty(ss.selector):
        return why.Route("none", None, "injection paused or no selector: nothing is injected")
    conditions = [c for c in ss.status.get("conditions") or [] if isinstance(c, dict)]
    cond = next((c for c in conditions if c.get("type") == names.CONDITION_POLICY_INJECTION), None)
    holder = members.get(ss.name)
    if cond is not None:
        message = str(cond.get("message") or "")
        if cond.get("status") == "True":
            named = message.split()[-1] if message.startswith("MutatingAdmissionPolicy ") else None
            return why.Route("policy", holder or named, message or "PolicyServed")
        return why.Route("webhook", None, f"{cond.get('reason') or 'NeedsWebhook'}: {message}".rstrip(": "))
    if holder is not None:
        return why.Route("policy", holder, f"MutatingAdmissionPolicy {holder}")
    try:
        check_servable(ss)
    except NeedsWebhook as e:
        return why.Route("webhook", None, f"NeedsWebhook: {e}")
    return why.Route("unknown", None, f"no {names.CONDITION_POLICY_INJECTION} condition yet (is the manager running?)")


class _RolloutInputs:
    """The cluster's injected pods, projected once, and what `sidecarctl status` needs beside them."""

    def __init__(
        self, injected: list[JsonObj], ns_labels: dict[str, dict[str, str]], revs: list[JsonObj], now: str
    ) -> None:
        from sidecarsets.pods.podkeys import pod_key

        self.raw = {pod_key(p): p for p in injected}
        self.projections = [project(p) for p in injected]
        self.ns_labels = ns_labels
        self.revs, self.now = revs, now

    def glance(self, ss: SidecarSet) -> Glance:
        """The SidecarSet's rollout as `sidecarctl status` shows it."""
        from sidecarsets.rollout import glance

        return glance.of(
            ss, self.projections, self.raw, self.ns_labels, stored_revisions=self.revs, missing=[], now=self.now
        )


_STAGES = {
    Stage.PAUSED: "updates are paused (spec.updateStrategy.paused: true)",
    Stage.NOT_UPDATE: "spec.updateStrategy.type is NotUpdate: images are not rolled into running pods",
}


def why_outdated(key: str, glance: Glance) -> str:
    """Why the controller has not upgraded the pod (yet), in the words of its rollout glance."""
    not_ready = dict(glance.not_ready).get(key)
    suffix = f"; the pod is not ready ({not_ready})" if not_ready else ""
    blocked = next((b for b in glance.not_upgradable if b.pod == key), None)
    if glance.stopped:
        found = f"rollout stopped: {glance.reason}"
    elif blocked is not None:
        fields = "; ".join(blocked.fields)
        found = f"not upgradable in place: {fields} (compared with {blocked.compared_with}); recreate the pod"
    elif key in glance.excluded_by_selector:
        found = "outside spec.updateStrategy.selector"
    elif key in dict(glance.upgrading):
        found = f"being upgraded: {dict(glance.upgrading)[key]}"
    elif glance.stage in _STAGES:
        found = _STAGES[glance.stage]
    elif glance.stage is Stage.PARTITION:
        found = f"kept on the old revision by spec.updateStrategy.partition ({glance.reason})"
    elif glance.stage is Stage.WAITING:
        found = f"waiting for its turn: {glance.reason} (spec.updateStrategy.maxUnavailable)"
    else:
        found = f"rollout: {glance.reason}"
    return found + suffix


# ---------------------------------------------------------------------------------------------
# Output


def run_check_inject(args: argparse.Namespace) -> int:
    from kuberuntime.clock import now_rfc3339

    try:
        target = parse_target(args.target, args.namespace, args.selector)
    except ValueError as e:
        args.parser.error(str(e))
    try:
        pods, cluster = clusterread.run_against(
            args,
            "check-inject",
            lambda c: gather(c, target, manager_namespace=args.manager_namespace, now=now_rfc3339()),
        )
        reports = [why.report(p, cluster, template_of=template) for p, template in pods]
        ok = all(r.ok for r in reports)
        if args.output == "json":
            text = clusterread.to_json({"pods": [report_json(r) for r in reports], "ok": ok})
        else:
            text = render(reports)
        clusterread.write_stdout(text)
    except CliError as e:
        clusterread.stderr(f"sidecarctl check-inject: error: {e}")
        return 1
    return 0 if ok else 1


def report_json(r: why.PodReport) -> JsonObj:
    """One pod's report as `-o json` shows it."""
    verdicts = [
        {
            "name": v.sidecarset,
            "selects": v.selects,
            "reasons": [x.as_json() for x in v.reasons],
            "path": v.route.as_json(),
            "state": v.state,
            "revision": v.revision,
            "currentRevision": v.current_revision,
            "detail": v.detail,
        }
        for v in r.verdicts
    ]
    gate = None if r.gate is None else r.gate.as_json()
    return {
        "namespace": r.namespace,
        "name": r.name,
        "template": r.template_of,
        "phase": r.phase or None,
        "injectedBy": r.injected_by,
        "gate": gate,
        "path": r.route.as_json(),
        "sidecarSets": verdicts,
        "ok": r.ok,
    }


def _via(route: why.Route) -> str:
    if route.path == "policy":
        return f"via MutatingAdmissionPolicy {route.policy or '?'}"
    if route.path == "webhook":
        return f"via the webhook ({route.reason})"
    return f"path {route.path} ({route.reason})"


def _line(v: why.Verdict) -> str:
    detail = f": {v.detail}" if v.detail else ""
    at = v.revision or "an unrecorded revision"
    reasons = "; ".join(r.message for r in v.reasons)
    # In the pod and counted by the controller, though new pods would not get it: say why not.
    new = f"; not injected into new pods: {reasons}" if reasons else ""
    if v.state == why.CURRENT:
        via = f"; {_via(v.route)}" if not reasons else new
        return f"injected, current at revision {at}{'; ' + v.detail if v.detail else ''}{via}"
    if v.state == why.OUTDATED:
        return f"OUT OF DATE at revision {at} (current {v.current_revision or '?'}){detail}{new}"
    if v.state == why.UPGRADING:
        return f"UPGRADING to revision {at}{detail}{new}"
    if v.state == why.MISSING:
        return f"MISSING: selects the pod, its sidecars are not in it{detail}; new pods get it {_via(v.route)}"
    if v.state == why.WOULD_INJECT:
        return f"would be injected, {_via(v.route)}"
    if v.state == why.PRESENT:
        return f"in the pod, but does not select it now and the controller does not count it: {reasons}"
    return f"not selected: {reasons}"


def render(reports: list[why.PodReport]) -> str:
    lines: list[str] = []
    for r in reports:
        if r.template_of is not None:
            lines.append(f"Pod template of {r.template_of} in namespace {r.namespace} (no pods: checked as a new pod)")
        else:
            facts = [r.phase or "phase unknown"] + ([f"injected by {r.injected_by}"] if r.injected_by else [])
            lines.append(f"Pod {r.namespace}/{r.name} ({', '.join(facts)})")
        if r.gate is not None:
            lines.append(f"  no injection: {r.gate.message}")
        if r.route.path != "none":
            lines.append(f"  path: {r.route.path}: {r.route.reason}")
        if not r.verdicts:
            lines.append("  no SidecarSets in the cluster")
        width = max((len(v.sidecarset) for v in r.verdicts), default=0)
        lines += [f"  {v.sidecarset.ljust(width)}  {_line(v)}" for v in r.verdicts]
    bad = [
        f"{r.namespace}/{r.name}: {v.sidecarset} {v.state}"
        for r in reports
        for v in r.verdicts
        if v.state in why.FAILING
    ]
    lines.append(
        f"Not present or not current ({len(bad)}): {', '.join(bad)}"
        if bad
        else "OK: every SidecarSet that selects the pods is present and current"
    )
    return "\n".join(lines) + "\n"
