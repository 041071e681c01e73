"""What `sidecarctl preview` and `sidecarctl status` share: finding the cluster as kubectl does,
reading from it (never writing), and printing without tracebacks.

The kubeconfig is found as kubectl finds it: `--kubeconfig`, else the first file of $KUBECONFIG,
else ~/.kube/config, else the in-cluster service account. Every problem (no credentials, an
unreachable or refusing API server, a closed stdout) becomes a `CliError` with a one-line message.
The session identifies itself as `sidecarctl-<command>` (its User-Agent), so an audit log tells
its requests from the manager's. The client modules are imported only when a command reaches the
cluster: `sidecarctl inject`, which never does, keeps its start-up time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kuberuntime.jsontypes import JsonObj
from sidecarctl.cli import stdout
from sidecarctl.cli.clierror import CliError
from sidecarsets.spec import names

if TYPE_CHECKING:
    from kuberuntime import api, kubeapi, kubeconfig
    from sidecarsets.spec.model import SidecarSet

SS_PATH = f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"
# Every NamespacedSidecarSet, across namespaces (one version: v1beta1).
NSS_PATH = f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/{names.NAMESPACED_PLURAL}"
PAGE = 500
T = TypeVar("T")


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="the kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster service account)",
    )
    parser.add_argument("--context", metavar="NAME", help="the kubeconfig context to use (default: its current one)")
    parser.add_argument(
        "--request-timeout",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="give up on an API request after this long (default 30)",
    )
    parser.add_argument(
        "--manager-namespace",
        default=names.DEFAULT_MANAGER_NAMESPACE,
        metavar="NS",
        help=f"the manager's namespace, where the ControllerRevisions are (default {names.DEFAULT_MANAGER_NAMESPACE})",
    )
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="text for people (default), json for tools"
    )


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of seconds")
    return seconds


def cluster_config(path: str | None, context: str | None) -> kubeconfig.ClusterConfig:
    """The credentials, found in kubectl's order."""
    from kuberuntime import kubeconfig  # only here, as every import of a command that needs no cluster

    if path is None:
        env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        home = Path.home() / ".kube" / "config"
        if env:
            path = next((p for p in env if Path(p).exists()), env[0])
        elif home.exists():
            path = str(home)
        else:
            found = kubeconfig.in_cluster()
            if found is None:
                raise CliError(
                    "no kubeconfig: give --kubeconfig, set $KUBECONFIG or create ~/.kube/config "
                    "(not running in a cluster either)"
                )
            return found
    try:
        return kubeconfig.load_config(path, context=context)
    except kubeconfig.ConfigError as e:
        raise CliError(str(e)) from None
    except OSError as e:  # a certificate or token file that cannot be read
        raise CliError(f"cannot load cluster credentials from {path}: {e.strerror or e}") from None


def run_against(args: argparse.Namespace, command: str, work: Callable[[kubeapi.KubeClient], Awaitable[T]]) -> T:
    """Run `work` with a read-only session on the cluster; API and network failures are CliErrors."""
    import asyncio

    import aiohttp

    from kuberuntime import api, kubeapi

    config = cluster_config(args.kubeconfig, args.context)

    async def session() -> T:
        async with kubeapi.KubeClient(
            config, timeout=args.request_timeout, user_agent=f"sidecarctl-{command}"
        ) as client:
            return await work(client)

    try:
        return asyncio.run(session())
    except api.ApiError as e:
        raise CliError(f"the API server at {config.server} refused a request: {_api_message(e)}") from None
    except TimeoutError:
        raise CliError(f"the API server at {config.server} did not answer within {args.request_timeout:g}s") from None
    except (aiohttp.ClientError, OSError) as e:
        raise CliError(f"cannot reach the API server at {config.server}: {_network_message(e)}") from None


def _api_message(e: api.ApiError) -> str:
    text = f"{e.status} {e.reason}".strip()
    return f"{text}: {e.message}" if e.message else text


def _network_message(e: BaseException) -> str:
    cause = getattr(e, "os_error", None) or e
    text = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
    return " ".join(str(text).split())


async def list_all(client: kubeapi.KubeClient, path: str, params: dict[str, str | int] | None = None) -> list[JsonObj]:
    """Every item of a collection, page by page (limit/continue), as kubectl lists."""
    query: dict[str, str | int] = {**(params or {}), "limit": PAGE}
    out: list[JsonObj] = []
    while True:
        listing = await client.get(path, params=query)
        out += [item for item in listing.get("items") or [] if isinstance(item, dict)]
        token = (listing.get("metadata") or {}).get("continue")
        if not token:
            return out
        query = {**query, "continue": str(token)}


async def get_or_none(client: kubeapi.KubeClient, path: str) -> JsonObj | None:
    from kuberuntime import api

    try:
        return await client.get(path)
    except api.NotFound:
        return None


async def list_optional(
    client: kubeapi.KubeClient, path: str, params: dict[str, str | int] | None = None
) -> list[JsonObj] | None:
    """A list that only refines the output: None when it may not be read (403) or is not served (404)."""
    from kuberuntime import api

    try:
        return await list_all(client, path, params)
    except api.ApiError as e:
        if e.status in (403, 404):
            return None
        raise


async def revisions(client: kubeapi.KubeClient, namespace: str) -> list[JsonObj]:
    """The SidecarSets' ControllerRevisions; none when they may not be read (they only refine the output)."""
    path = f"/apis/apps/v1/namespaces/{namespace}/controllerrevisions"
    return await list_optional(client, path, {"labelSelector": names.REVISION_LABEL_SIDECARSET}) or []


def tenant_path(namespace: str) -> str:
    """The NamespacedSidecarSets of one namespace."""
    return f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/namespaces/{namespace}/{names.NAMESPACED_PLURAL}"


async def sidecarsets(client: kubeapi.KubeClient, name: str | None, namespace: str | None) -> list[JsonObj]:
    """What a command names: the SidecarSet `name`, or with `namespace` the NamespacedSidecarSet
    `namespace/name`; without a name, every SidecarSet and NamespacedSidecarSet, or with `namespace`
    that namespace's NamespacedSidecarSets only (what its admins may read). NamespacedSidecarSets are
    left out where the kind is not served or may not be read."""
    import asyncio

    if name is not None:
        path = f"{tenant_path(namespace)}/{name}" if namespace else f"{SS_PATH}/{name}"
        found = await get_or_none(client, path)
        if found is None:
            kind = f"{names.NAMESPACED_KIND} {namespace}/{name}" if namespace else f"{names.KIND} {name}"
            raise CliError(f"{kind} not found")
        return [found]
    if namespace:
        return await list_optional(client, tenant_path(namespace)) or []
    cluster, tenants = await asyncio.gather(list_all(client, SS_PATH), list_optional(client, NSS_PATH))
    return [*cluster, *(tenants or [])]


async def pods_and_namespaces(client: kubeapi.KubeClient, namespace: str | None) -> tuple[list[JsonObj], list[JsonObj]]:
    """The injected pods (as the controller reads them) and the namespaces: every one, or with
    `namespace` that namespace's pods and the namespace itself (what its admins may read)."""
    import asyncio

    injected: dict[str, str | int] = {"labelSelector": f"{names.POD_INJECTED_LABEL}=true"}
    if not namespace:
        pods, every = await asyncio.gather(
            list_all(client, "/api/v1/pods", injected), list_all(client, "/api/v1/namespaces")
        )
        return pods, every
    pods, found = await asyncio.gather(
        list_all(client, f"/api/v1/namespaces/{namespace}/pods", injected),
        get_or_none(client, f"/api/v1/namespaces/{namespace}"),
    )
    return pods, [] if found is None else [found]


async def revisions_of(client: kubeapi.KubeClient, sets: Iterable[JsonObj], manager_namespace: str) -> list[JsonObj]:
    """The ControllerRevisions of `sets`: a SidecarSet's in the manager's namespace, a
    NamespacedSidecarSet's in its own (sidecarsets.controller.history.revisions_namespace)."""
    import asyncio

    from sidecarsets.spec.model import namespace_of

    where = sorted({namespace_of(o) or manager_namespace for o in sets})
    found = await asyncio.gather(*(revisions(client, ns) for ns in where))
    return [r for group in found for r in group]


def revisions_for(ss: SidecarSet, revs: Iterable[JsonObj], manager_namespace: str) -> list[JsonObj]:
    """Of `revs` (`revisions_of`'s), those in the namespace `ss`'s revisions live in: a SidecarSet and a
    NamespacedSidecarSet of one name both label theirs with that name."""
    from sidecarsets.controller.history import revisions_namespace

    where = revisions_namespace(ss, manager_namespace)
    return [r for r in revs if (r.get("metadata") or {}).get("namespace") == where]


def namespace_labels(objs: list[JsonObj]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for obj in objs:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        labels.setdefault(names.NS_NAME_LABEL, name)
        out[name] = labels
    return out


class PodNames:
    """Pods as shown to people: `name` alone when every pod shown is in one namespace (said once)."""

    def __init__(self, keys: Iterable[str]) -> None:
        namespaces = {k.split("/", 1)[0] for k in keys if "/" in k}
        self.namespace = next(iter(namespaces)) if len(namespaces) == 1 else None

    def __call__(self, key: str) -> str:
        if self.namespace is not None and key.startswith(self.namespace + "/"):
            return key[len(self.namespace) + 1 :]
        return key

    def join(self, keys: Iterable[str]) -> str:
        return ", ".join(self(k) for k in keys) or "none"


def to_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def stderr(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def write_stdout(text: str) -> None:
    """Write all of `text` (sidecarctl.cli.stdout: a closed pipe or a full disk is a CliError)."""
    stdout.write_stdout(text.encode("utf-8"))


def main_of(command: str, body: Callable[[argparse.Namespace], str]) -> Callable[[argparse.Namespace], int]:
    """The command's entry point: its text on stdout and status 0, or one line on stderr and 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            write_stdout(body(args))
        except CliError as e:
            stderr(f"sidecarctl {command}: error: {e}")
            return 1
        return 0

    return run
