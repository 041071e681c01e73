"""Serve an ASGI app over TLS on 127.0.0.1 and register it with the API server by URL.

The envtest webhook pattern: `clientConfig.url` pointing at a loopback port plus a caBundle,
so the real API server calls the real HTTP stack during admission. Registration is only done
when the API server has actually called the webhook (a dry-run create loop), because the
apiserver's admission configuration informer lags behind the object's creation.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.certutil import KeyPair, make_ca, make_leaf
from tests.kube.client import Kube
from tests.kube.controlplane import free_port
from tests.kube.loop import BackgroundLoop


class TLSServer:
    """hypercorn serving `app` with a certificate for 127.0.0.1 from a throwaway CA."""

    def __init__(self, app: Any, *, ca: KeyPair | None = None) -> None:
        self.app = app
        self.ca = ca or make_ca("sidecarctl-test-webhook-ca")
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="sidecarctl-wh-"))
        leaf = make_leaf(self.ca, dns=("localhost",), ips=("127.0.0.1",), cn="webhook")
        (self._dir / "tls.crt").write_bytes(leaf.cert_pem)
        (self._dir / "tls.key").write_bytes(leaf.key_pem)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca.cert_pem).decode()

    async def start(self) -> None:
        config = Config()
        config.bind = [f"127.0.0.1:{self.port}"]
        config.certfile = str(self._dir / "tls.crt")
        config.keyfile = str(self._dir / "tls.key")
        config.accesslog = None
        config.errorlog = None
        config.graceful_timeout = 1.0
        # hypercorn ends an HTTP/2 connection after 1,000 requests with a GOAWAY that also fails the
        # request in flight (the API server: "server sent GOAWAY and closed the connection"); the
        # API server sends a whole tier's pods over one connection, so a run would fail at about its
        # 1,000th call, or not, as the number of probes varies.
        config.keep_alive_max_requests = 1_000_000_000
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(serve(self.app, config, shutdown_trigger=self._stop.wait))
        for _ in range(100):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError(f"webhook server on {self.url} did not start")

    async def stop(self) -> None:
        self._stop.set()
        try:
            if self._task is not None:
                await asyncio.wait_for(self._task, timeout=10)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


def labeling_app(label: str, value: str) -> Starlette:
    """A throwaway mutating webhook at /mutate that adds `label: value` to objects lacking it."""

    async def mutate(request: Request) -> Response:
        review = orjson.loads(await request.body())
        obj = review["request"]["object"]
        response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
        if label not in (obj.get("metadata", {}).get("labels") or {}):
            patch = [{"op": "add", "path": f"/metadata/labels/{label.replace('/', '~1')}", "value": value}]
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
        review["response"] = response
        return Response(orjson.dumps(review), media_type="application/json")

    return Starlette(routes=[Route("/mutate", mutate, methods=["POST"])])


def mutating_config(
    name: str,
    *,
    url: str,
    ca_bundle: str,
    webhook_name: str = "inject.sidecarctl.io",
    namespace_selector: dict[str, Any] | None = None,
    object_selector: dict[str, Any] | None = None,
    failure_policy: str = "Fail",
    reinvocation: str = "IfNeeded",
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": webhook_name,
                "clientConfig": {"url": url, "caBundle": ca_bundle},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": namespace_selector or {},
                "objectSelector": object_selector or {},
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1", "v1beta1"],
                "reinvocationPolicy": reinvocation,
                "timeoutSeconds": 10,
            }
        ],
    }


def wait_until_called(
    create_dry_run: Callable[[], dict[str, Any]],
    mutated: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 20.0,
) -> dict[str, Any]:
    """Repeat a dry-run create until its result shows the webhook's mutation."""

    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = create_dry_run()
        if mutated(last):
            return last
        time.sleep(0.1)
    raise AssertionError(f"API server did not call the webhook within {timeout}s; last object: {last}")


@contextlib.contextmanager
def labeling_webhook(
    loop: BackgroundLoop,
    kube: Kube,
    *,
    config_name: str,
    namespace: str,
    label: str,
    value: str,
    probe: Callable[[], dict[str, Any]],
) -> Iterator[None]:
    """A `labeling_app` served over TLS and registered for pods of `namespace`, live when entered:
    `probe` (a dry-run create) already shows the label. Removed again on exit."""
    server = TLSServer(labeling_app(label, value))
    loop.run(server.start())
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    cfg = mutating_config(
        config_name,
        url=f"{server.url}/mutate",
        ca_bundle=server.ca_bundle,
        webhook_name=f"{config_name}.test.sidecarctl.io",
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    )
    kube.create(path, cfg)
    try:
        wait_until_called(probe, lambda p: (p["metadata"].get("labels") or {}).get(label) == value)
        yield
    finally:
        kube.delete(f"{path}/{config_name}")
        loop.run(server.stop())
