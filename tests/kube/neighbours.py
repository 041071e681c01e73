"""Other admission steps a real cluster runs beside sidecarctl, as real HTTPS webhooks.

- `digest_pinning_app`: what sigstore's policy-controller or Kyverno's verifyImages mutate do: every
  container image without a digest becomes `image@sha256:<digest>`, on CREATE and on UPDATE (so
  the image an in-place upgrade writes is pinned too). `digests` maps an image to its real digest
  (a real node resolves the pinned reference); an image without one gets a digest of its name.
- `second_injector_app`: an Istio-, Linkerd- or OpenTelemetry-like injector: an init container at
  index 0 and a container at the end, once (it checks for its own container first).

`neighbour` serves one over TLS, registers it (for one namespace, or those a selector picks) under
a MutatingWebhookConfiguration whose name sets its place among the webhooks (the API server calls
them in name order: `aa-...` before `sidecarctl-injector`, `zz-...` after), and waits until the
API server calls it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.kube.loop import BackgroundLoop
from tests.kube.webhook import TLSServer, mutating_config, wait_until_called


class WritesObjects(Protocol):
    """Either tier's API client (tests.kube.client.Kube, tests.kube.adminrest.AdminRest)."""

    def create(self, path: str, body: Any) -> Any: ...

    def delete(self, path: str) -> Any: ...


MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
FOREIGN_INIT = "linkerd-init"
FOREIGN_SIDECAR = "otel-agent"


def pinned(image: str, digests: Mapping[str, str] | None = None) -> str:
    """`image` pinned by digest: its real one when known, else one made from its name."""
    if "@" in image:
        return image
    digest = (digests or {}).get(image) or "sha256:" + hashlib.sha256(image.encode()).hexdigest()
    return f"{image}@{digest}"


def _answer(review: dict[str, Any], patch: list[dict[str, Any]]) -> Response:
    response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    review["response"] = response
    return Response(orjson.dumps(review), media_type="application/json")


def digest_pinning_app(
    digests: Mapping[str, str] | None = None, calls: list[tuple[str, str]] | None = None
) -> Starlette:
    """`calls` gets (operation, pod name) of every request, in order."""

    async def mutate(request: Request) -> Response:
        review = orjson.loads(await request.body())
        pod = review["request"]["object"]
        if calls is not None:
            calls.append((review["request"]["operation"], review["request"].get("name") or ""))
        patch = [
            {"op": "replace", "path": f"/spec/{key}/{i}/image", "value": pinned(c["image"], digests)}
            for key in ("initContainers", "containers")
            for i, c in enumerate(pod["spec"].get(key) or [])
            if "@" not in c.get("image", "@")
        ]
        return _answer(review, patch)

    return Starlette(routes=[Route("/mutate", mutate, methods=["POST"])])


def second_injector_app() -> Starlette:
    async def mutate(request: Request) -> Response:
        review = orjson.loads(await request.body())
        spec = review["request"]["object"]["spec"]
        if any(c.get("name") == FOREIGN_SIDECAR for c in spec.get("containers") or []):
            return _answer(review, [])
        init = {"name": FOREIGN_INIT, "image": "linkerd-init:7", "args": ["--redirect", "15001"]}
        agent = {"name": FOREIGN_SIDECAR, "image": "otel-agent:3", "env": [{"name": "OTEL_SERVICE", "value": "x"}]}
        patch = [
            {"op": "add", "path": "/spec/initContainers/0", "value": init}
            if spec.get("initContainers")
            else {"op": "add", "path": "/spec/initContainers", "value": [init]},
            {"op": "add", "path": "/spec/containers/-", "value": agent},
        ]
        return _answer(review, patch)

    return Starlette(routes=[Route("/mutate", mutate, methods=["POST"])])


@contextlib.contextmanager
def neighbour(
    loop: BackgroundLoop,
    kube: WritesObjects,
    app: Starlette,
    *,
    config_name: str,
    namespace: str | None = None,
    namespace_selector: dict[str, Any] | None = None,
    operations: tuple[str, ...],
    probe: Callable[[], dict[str, Any]],
    called: Callable[[dict[str, Any]], bool],
) -> Iterator[None]:
    server = TLSServer(app)
    loop.run(server.start())
    cfg = mutating_config(
        config_name,
        url=f"{server.url}/mutate",
        ca_bundle=server.ca_bundle,
        webhook_name=f"{config_name}.test.sidecarctl.io",
        namespace_selector=namespace_selector or {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    )
    cfg["webhooks"][0]["rules"][0]["operations"] = list(operations)
    kube.create(MWC, cfg)
    try:
        wait_until_called(probe, called)
        yield
    finally:
        kube.delete(f"{MWC}/{config_name}")
        loop.run(server.stop())
