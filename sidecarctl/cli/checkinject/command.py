"""`sidecarctl check-inject`: its command line, its run, and its exit status."""

from __future__ import annotations

import argparse

from sidecarctl.cli import clusterread
from sidecarctl.cli.checkinject import render
from sidecarctl.cli.checkinject.reading import gather
from sidecarctl.cli.checkinject.report import pod_report
from sidecarctl.cli.checkinject.target import parse_target
from sidecarctl.cli.clierror import CliError
from sidecarsets.spec import names

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
of date as its controller counts the pod, whatever the injection rules say of new pods. Each per-pod
override the pod asks for ({names.ANN_OVERRIDES}): applied, refused or ignored, and why.

Exit status: 0 every SidecarSet that selects a pod or that the controller counts in it is present
and current, 1 one is missing or out of date (or the cluster cannot be read, or the object does not
exist), 2 bad command line.
"""


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
        reports = [pod_report(p, cluster, template_of=template) for p, template in pods]
        ok = all(r.ok for r in reports)
        if args.output == "json":
            text = clusterread.to_json({"pods": [render.report_json(r) for r in reports], "ok": ok})
        else:
            text = render.render(reports)
        clusterread.write_stdout(text)
    except CliError as e:
        clusterread.stderr(f"sidecarctl check-inject: error: {e}")
        return 1
    return 0 if ok else 1
