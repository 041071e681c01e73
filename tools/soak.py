"""Fuzz soak of the real manager: `sidecarctl run` on a throwaway control plane, many AdmissionReviews.

    .venv/bin/python tools/soak.py --count 100000     # about 1-2 minutes on 2 cores
    .venv/bin/python tools/soak.py --count 5000 --seed 7

Starts etcd + kube-apiserver (tests/kube/controlplane.py; binaries from tools/build-control-plane.sh),
installs the SidecarSet CRD, a SidecarSet, a labelled and an unlabelled namespace, then runs
`sidecarctl run` (supervisor, control process, two admission workers) and sends it `--count`
requests from tests/kube/soak.py's seeded generator (valid reviews, reviews with damaged structure,
damaged bytes, wrong methods, paths and content types) over keep-alive TLS connections, straight to
the webhook port. Fails (exit 1) on any answer >= 500, a 200 that is not an AdmissionReview for the
request's uid, a manager child that was restarted, a traceback in the manager's log, or RSS of the
process tree that grew more than `--max-growth-mib` after the warm-up (the first 20%).
The reliability tier (tests/reliability/test_admission_budgets.py) runs the same with a smaller count.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sidecarsets.spec import names  # noqa: E402
from tests.kube import builders, soak  # noqa: E402
from tests.kube.adminrest import AdminRest, ApiError  # noqa: E402
from tests.kube.client import eventually  # noqa: E402
from tests.kube.controlplane import ControlPlane, ControlPlaneError, binaries_dir  # noqa: E402
from tests.kube.managerharness import start_process, wait_ready, write_cert_dir  # noqa: E402
from tests.kube.measure import MIB, WebhookClient, injected_names, pod_review  # noqa: E402

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"


def _namespace(rest: AdminRest, name: str, labels: dict[str, str]) -> None:
    rest.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    )


def _prepare(rest: AdminRest) -> None:
    crd = yaml.safe_load((REPO / "config/crd/sidecarctl.io_sidecarsets.yaml").read_text())
    rest.create(CRD_PATH, crd)

    def served() -> bool:
        try:
            rest.get(SS_PATH)
            return True
        except ApiError:
            return False

    eventually(served, timeout=30, what="SidecarSets served", retrying=(ApiError,))
    _namespace(rest, names.DEFAULT_MANAGER_NAMESPACE, {})
    _namespace(rest, "soak-shop", {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED})
    _namespace(rest, "soak-plain", {})
    sidecarset = builders.sidecarset(
        "mesh", containers=[builders.container("proxy", "proxy:1")], selector={"matchLabels": {"app": "web"}}
    )
    rest.create(SS_PATH, sidecarset)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=100_000, help="AdmissionReviews to send")
    parser.add_argument("--seed", type=int, default=1, help="request i is a function of (seed, i)")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive TLS connections")
    parser.add_argument("--workers", type=int, default=2, help="--webhook-workers of the manager")
    parser.add_argument("--max-growth-mib", type=float, default=30.0, help="allowed RSS growth after the warm-up")
    args = parser.parse_args(argv)

    print("starting a control plane (etcd + kube-apiserver) ...", flush=True)
    try:
        cp = ControlPlane(bin_dir=binaries_dir(), controller_manager=False).start()
    except ControlPlaneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    manager = None
    try:
        rest = AdminRest(cp)
        _prepare(rest)
        cert_dir = Path(tempfile.mkdtemp(prefix="sidecarctl-soak-certs-"))
        write_cert_dir(cert_dir)
        manager = start_process(
            cp, cert_dir, identity="soak", extra=(f"--webhook-workers={args.workers}", "--log-format=text")
        )
        wait_ready(manager, timeout=60)
        client = WebhookClient(manager.webhook_url, cert_dir / "ca.crt")
        eventually(
            lambda: "proxy" in injected_names(client.post(names.INJECT_PATH, pod_review("soak-shop", "warm"))[1]),
            timeout=30,
            what="the manager injects",
            retrying=(ApiError,),
        )
        client.close()
        print(
            f"manager pid {manager.proc.pid}, log {manager.log_path}; sending {args.count:,} requests ...", flush=True
        )
        started = time.monotonic()

        def progress(sent: int, rss: int) -> None:
            if sent % 10_000 == 0:
                print(f"   {sent:>9,} sent, {time.monotonic() - started:6.1f} s, RSS {rss / MIB:.1f} MiB", flush=True)

        generator = soak.Generator(seed=args.seed, labelled="soak-shop", plain="soak-plain", app="web")
        result = soak.soak_manager(
            manager.webhook_url,
            str(cert_dir / "ca.crt"),
            manager.proc.pid,
            generator,
            count=args.count,
            connections=args.connections,
            progress=progress,
        )
        problems = result.problems(max_growth=int(args.max_growth_mib * MIB))
        log = manager.log_path.read_text(errors="replace")
        if "Traceback" in log:
            problems.append(f"{log.count('Traceback')} tracebacks in the manager's log ({manager.log_path})")
        restarts = [line for line in log.splitlines() if "exited with" in line]
        problems.extend(f"child restarted: {line}" for line in restarts)
        print()
        for key, value in result.rows().items():
            print(f"{key}: {value}")
        print(f"verdict: {'FAILED' if problems else 'passed'}")
        for p in problems:
            print(f"   {p}")
        return 1 if problems else 0
    finally:
        if manager is not None:
            manager.terminate()
        cp.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
