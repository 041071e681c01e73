"""Credentials from kubeconfig reach the wire, and API errors map to typed exceptions."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberuntime import api, kubeconfig
from kuberuntime.kubeapi import MAX_RETRY_AFTER, KubeClient
from kuberuntime.kubeconfig import ClusterConfig

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _kubeconfig(tmp_path: Path, user: dict[str, object]) -> str:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_bearer_token_is_sent(tmp_path: Path) -> None:
    cfg = kubeconfig.load_config(_kubeconfig(tmp_path, {"token": "s3cret"}))
    assert cfg.server == "https://127.0.0.1:6443"
    assert cfg.headers() == {"Authorization": "Bearer s3cret"}


def test_no_credentials_means_no_authorization_header(tmp_path: Path) -> None:
    cfg = kubeconfig.load_config(_kubeconfig(tmp_path, {}))
    assert "Authorization" not in cfg.headers()


def test_status_codes_map_to_error_types() -> None:
    body = {"kind": "Status", "reason": "AlreadyExists", "message": 'pods "x" already exists'}
    err = api.error_from_status(409, body)
    assert isinstance(err, api.Conflict)
    assert err.reason == "AlreadyExists"
    assert "already exists" in str(err)
    assert isinstance(api.error_from_status(404, {}), api.NotFound)
    assert isinstance(api.error_from_status(410, {}), api.Gone)
    assert isinstance(api.error_from_status(422, {}), api.Invalid)
    plain = api.error_from_status(500, "<html>oops</html>")
    assert type(plain) is api.ApiError
    assert plain.message == "<html>oops</html>"


def test_missing_or_broken_kubeconfig_is_a_clear_config_error(tmp_path: Path) -> None:

    with pytest.raises(kubeconfig.ConfigError, match="/nonexistent"):
        kubeconfig.load_config("/nonexistent")
    broken = tmp_path / "broken"
    broken.write_text("clusters: [oops")
    with pytest.raises(kubeconfig.ConfigError, match="cannot load cluster credentials"):
        kubeconfig.load_config(str(broken))


def test_sidecarctl_run_reports_bad_credentials_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from sidecarctl.cli import main as cli

    assert cli.main(["run", "--kubeconfig", "/nonexistent", "--self-signed", "--log-format", "text"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sidecarctl run: error: cannot load cluster credentials from /nonexistent")
    assert "Traceback" not in err


# -- Retry-After ---------------------------------------------------------------------------------------
class _Answers:
    """A local HTTP server answering each request with the next (status, headers) in turn."""

    def __init__(self, *answers: tuple[int, dict[str, str]]) -> None:
        self.answers = list(answers)
        self.bodies: list[bytes] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        status, headers = self.answers.pop(0) if self.answers else (200, {})
        body = (
            {"kind": "Status", "message": "apiserver is shutting down"} if status >= 400 else {"ok": len(self.bodies)}
        )
        return web.json_response(body, status=status, headers=headers)


@contextlib.asynccontextmanager
async def _client_of(handler: Handler, *, timeout: float = 30.0) -> AsyncIterator[KubeClient]:
    """A KubeClient of a local HTTP server that answers every request with `handler`."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = KubeClient(ClusterConfig(server=f"http://127.0.0.1:{port}", ssl_context=None), timeout=timeout)
    try:
        yield client
    finally:
        await client.close()
        await runner.cleanup()


async def _send(answers: _Answers, *, timeout: float = 30.0) -> Any:
    async with _client_of(answers.handle, timeout=timeout) as client:
        return await client.create("/api/v1/namespaces/x/configmaps", {"a": 1})


def test_a_503_or_429_with_retry_after_is_sent_again_with_the_same_body() -> None:
    """kube-apiserver answers 503 "apiserver is shutting down" with Retry-After: 1 while a CRD's
    storage is replaced, and API Priority and Fairness 429 with Retry-After: as client-go, send again."""
    answers = _Answers((503, {"Retry-After": "0"}), (429, {"Retry-After": "0"}))
    got = asyncio.run(_send(answers))
    assert got == {"ok": 3}
    assert answers.bodies == [b'{"a":1}'] * 3


def test_an_error_without_retry_after_or_a_4xx_is_raised_at_once() -> None:
    for status, headers in ((503, {}), (500, {"Retry-After": "x"}), (409, {"Retry-After": "0"})):
        answers = _Answers((status, headers))
        with pytest.raises(api.ApiError) as e:
            asyncio.run(_send(answers))
        assert e.value.status == status and len(answers.bodies) == 1


def test_retries_stop_after_ten_and_never_wait_past_the_timeout() -> None:
    answers = _Answers(*[(503, {"Retry-After": "0"})] * 20)
    with pytest.raises(api.ApiError):
        asyncio.run(_send(answers))
    assert len(answers.bodies) == 1 + MAX_RETRY_AFTER
    slow = _Answers((503, {"Retry-After": "5"}))
    with pytest.raises(api.ApiError, match="shutting down"):
        asyncio.run(_send(slow, timeout=2.0))
    assert len(slow.bodies) == 1, "a 5 s wait does not fit in a 2 s timeout: the error is raised at once"


# -- the watch stream ------------------------------------------------------------------------------------
async def _watched(chunks: list[bytes]) -> list[Any]:
    """The events `KubeClient.watch` yields from a server that writes `chunks` as they are, then ends."""

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(chunk)
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    async with _client_of(handle) as client:
        return [e async for e in client.watch("/api/v1/pods", resource_version="1")]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=30),
    st.lists(st.integers(min_value=1, max_value=5000), max_size=40),
)
def test_watch_events_arrive_whole_and_in_order_however_the_stream_is_cut(sizes: list[int], cuts: list[int]) -> None:
    """Events are split out of the chunks the connection delivers (many per chunk in a WatchList's
    initial state, or one split over several); blank lines between them are skipped."""
    events = [
        {"type": "ADDED", "object": {"metadata": {"name": f"p{i}"}, "data": "x" * n}} for i, n in enumerate(sizes)
    ]
    stream = b"".join(json.dumps(e).encode() + (b"\n\n" if i % 3 == 0 else b"\n") for i, e in enumerate(events))
    chunks, at = [], 0
    for cut in cuts:
        if at >= len(stream):
            break
        chunks.append(stream[at : at + cut])
        at += cut
    chunks.append(stream[at:])
    assert asyncio.run(_watched(chunks)) == events


# -- managedFields ---------------------------------------------------------------------------------------
def test_a_client_drops_managed_fields_only_of_the_resources_it_was_given() -> None:
    """Pods' answers and watch events lose their managedFields; a ConfigMap keeps them, and so does an
    error's body."""
    meta = {"name": "p", "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]}
    obj = {"kind": "Pod", "metadata": meta, "spec": {"containers": []}}

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(json.dumps({"type": "ADDED", "object": obj}, separators=(",", ":")).encode() + b"\n")
            await resp.write_eof()
            return resp
        return web.Response(body=json.dumps(obj, separators=(",", ":")), content_type="application/json")

    async def main() -> list[Any]:
        async with _client_of(handle) as plain:
            lean = KubeClient(plain.config, drop_managed_fields=("pods",))
            try:
                return [
                    await lean.get("/api/v1/namespaces/x/pods/p"),
                    [e["object"] async for e in lean.watch("/api/v1/pods", resource_version="1")],
                    await lean.get("/api/v1/namespaces/x/configmaps/p"),
                    await plain.get("/api/v1/namespaces/x/pods/p"),
                ]
            finally:
                await lean.close()

    pod, watched, config_map, plain_pod = asyncio.run(main())
    assert "managedFields" not in pod["metadata"] and pod["spec"] == {"containers": []}
    assert watched == [pod]
    assert config_map["metadata"]["managedFields"] == meta["managedFields"]
    assert plain_pod == obj
