"""The process that tests/node/test_cleanup_node.py kills: a control plane and a real node of its
own, with a running pod (so there are shims, containers, mounts and network namespaces to leak).

    python -m tests.node.own_node LOG_DIR

Prints one JSON line once the pod is Ready (what it made, for the test to look for afterwards), then
waits to be killed. It never stops the node itself: the reaper alone must clean up.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from tests.kube import images
from tests.kube.adminrest import AdminRest, ApiError
from tests.kube.client import eventually
from tests.kube.node import node_cluster
from tests.node.pods import app_container, create_and_wait_ready, pod, sidecar_container


def main() -> None:
    with node_cluster(log_dir=Path(sys.argv[1])) as (cp, node):
        api = AdminRest(cp)
        eventually(
            lambda: api.get_or_none("/api/v1/namespaces/default/serviceaccounts/default"),
            timeout=30,
            retrying=(ApiError,),
        )
        body = pod("leak-me", [app_container(), sidecar_container(images.stubborn_image("v1"))])
        created, _ = create_and_wait_ready(api, "default", body)
        made = {
            "node_workdir": str(node.workdir),
            "cp_workdir": str(cp.workdir),
            "bridge": node.bridge,
            "cgroup_root": node.cgroup_root,
            "socket": str(node.socket),
            "pod_ip": created["status"]["podIP"],
        }
        print(json.dumps(made), flush=True)
        signal.pause()


if __name__ == "__main__":
    main()
