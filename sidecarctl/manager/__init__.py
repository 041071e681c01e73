"""`sidecarctl run`: the manager's processes and what wires them.

The supervisor over one control process and the admission workers, the child entry point, the
control role (TLS material, caBundle, Lease, controller, policy sync; the watches every replica
keeps warm, and the leadership terms that catch them up and plan from them) and the webhook role
(watches feeding a snapshot, the bounded listener), the health and metrics ports (`healthport`)
and the sockets bound for every port (`listeners`), preflight checks, options
(each flag defined once) and the JSON log format; `inprocess` runs both roles in one asyncio loop,
as the tests and the demo start it. May import every product package except `sidecarctl.cli`.
"""

from importlib import metadata as _metadata

from kuberuntime.kubeapi import KubeClient
from kuberuntime.kubeconfig import ClusterConfig


def version() -> str:
    """pyproject.toml's version, as the installed distribution records it (the one place it is
    written): `sidecarctl --version` prints it, and every process's User-Agent carries it."""
    try:
        return _metadata.version("sidecarctl")
    except _metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


def user_agent(process: str, identity: str) -> str:
    """`sidecarctl/<version> (<process>; <identity>)`, the User-Agent of one process of one replica
    (`control`, `webhook-0`, ...). Every replica reads and writes as the same ServiceAccount, so
    without them an audit log cannot tell a leader's last writes (still arriving as it dies) from
    the first ones of the replica that took over, nor which admission worker's watch fell behind."""
    return f"sidecarctl/{version()} ({process}; {identity})"


def api_client(config: ClusterConfig, *, agent: str = "sidecarctl", fresh_connections: bool = False) -> KubeClient:
    """The API client of a manager process. It decodes pods without their managedFields: half of an
    injected pod's JSON as the API server sends it and most of the cost of decoding it
    (kuberuntime.jsontypes), and no process of the manager reads them."""
    return KubeClient(config, user_agent=agent, fresh_connections=fresh_connections, drop_managed_fields=("pods",))
