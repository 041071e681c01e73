"""/inject through the real API server: the stored pod is what the user gets."""

from __future__ import annotations

import socket
import ssl
import time
import warnings
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, make_pod, wait_injecting
from tests.kube.client import Kube
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import RunningManager
from tests.kube.webhook import labeling_webhook

pytestmark = pytest.mark.versions


def _names(items: list[dict[str, Any]] | None) -> list[str]:
    return [c["name"] for c in items or []]


def test_labelled_namespace_gets_proxy_init_and_proxy(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    ss = sidecarsets("shop")
    wait_injecting(kube, injected_ns, "shop", lambda p: "proxy" in _names(p["spec"]["containers"]))
    kube.create(f"/api/v1/namespaces/{injected_ns}/pods", make_pod("web", "shop"))
    stored = kube.get(f"/api/v1/namespaces/{injected_ns}/pods/web")
    assert _names(stored["spec"]["containers"]) == ["proxy", "app"]
    assert _names(stored["spec"]["initContainers"]) == ["proxy-init"]
    proxy = stored["spec"]["containers"][0]
    assert proxy["image"] == "proxy:1"
    assert {"name": "IS_INJECTED", "value": "true"} in proxy["env"]
    ann = stored["metadata"]["annotations"]
    assert ann[names.ANN_INJECTED_LIST] == ss["metadata"]["name"]
    entry = orjson.loads(ann[names.ANN_HASH])[ss["metadata"]["name"]]
    assert entry["sidecarList"] == ["proxy", "proxy-init"] or entry["sidecarList"] == ["proxy"]
    assert entry["hash"]
    assert ss["metadata"]["name"] in orjson.loads(ann[names.ANN_HASH_WITHOUT_IMAGE])
    assert ann[names.ANN_DEFAULT_CONTAINER] == "app"
    assert stored["metadata"]["labels"][names.POD_INJECTED_LABEL] == "true"


def test_unlabelled_namespace_and_opted_out_pod_are_untouched(
    kube: Kube, namespace: str, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    sidecarsets("optout")
    wait_injecting(kube, injected_ns, "optout", lambda p: "proxy" in _names(p["spec"]["containers"]))
    opted = make_pod("opted", "optout", **{names.POD_INJECT_LABEL: "false"})
    stored = kube.create(f"/api/v1/namespaces/{injected_ns}/pods", opted)
    assert _names(stored["spec"]["containers"]) == ["app"]
    assert names.POD_INJECTED_LABEL not in stored["metadata"]["labels"]
    # The namespace label off: nothing is injected either.
    kube.patch(f"/api/v1/namespaces/{injected_ns}", {"metadata": {"labels": {names.NS_INJECTION_LABEL: None}}})
    time.sleep(0.5)
    plain = kube.create(f"/api/v1/namespaces/{injected_ns}/pods", make_pod("plain", "optout"))
    assert _names(plain["spec"]["containers"]) == ["app"]
    assert "initContainers" not in plain["spec"]


def test_sidecarset_edit_reaches_the_next_pod_within_a_second(
    kube: Kube, injected_ns: str, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    ss = sidecarsets("edit")
    name = ss["metadata"]["name"]
    wait_injecting(kube, injected_ns, "edit", lambda p: "proxy" in _names(p["spec"]["containers"]))
    kube.patch(
        f"{SS_PATH}/{name}",
        [{"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:2"}],
        patch_type="json",
    )
    started = time.monotonic()
    seen = None
    while time.monotonic() - started < 5:
        p = kube.create(f"/api/v1/namespaces/{injected_ns}/pods", make_pod("probe", "edit"), dryRun="All")
        if p["spec"]["containers"][0]["image"] == "proxy:2":
            seen = time.monotonic() - started
            break
    assert seen is not None and seen < 1.0, f"edit reached admissions after {seen}s"
    # And a deletion stops injection just as fast.
    kube.delete(f"{SS_PATH}/{name}")
    started = time.monotonic()
    gone = None
    while time.monotonic() - started < 5:
        p = kube.create(f"/api/v1/namespaces/{injected_ns}/pods", make_pod("probe", "edit"), dryRun="All")
        if _names(p["spec"]["containers"]) == ["app"]:
            gone = time.monotonic() - started
            break
    assert gone is not None and gone < 1.0, f"deletion reached admissions after {gone}s"


def test_reinvocation_does_not_inject_twice(
    aloop: BackgroundLoop,
    kube: Kube,
    injected_ns: str,
    manager: RunningManager,
    sidecarsets: Callable[..., dict[str, Any]],
) -> None:
    sidecarsets("reinv")
    wait_injecting(kube, injected_ns, "reinv", lambda p: "proxy" in _names(p["spec"]["containers"]))
    pods = f"/api/v1/namespaces/{injected_ns}/pods"
    # The relabelling webhook sorts after ours, so it runs after ours and forces our re-invocation.
    with labeling_webhook(
        aloop,
        kube,
        config_name=f"zz-relabel-{injected_ns}",
        namespace=injected_ns,
        label="relabelled",
        value="yes",
        probe=lambda: kube.create(pods, make_pod("probe", "reinv"), dryRun="All"),
    ):
        stored = kube.create(pods, make_pod("web", "reinv"))
        assert stored["metadata"]["labels"]["relabelled"] == "yes"
        assert _names(stored["spec"]["containers"]) == ["proxy", "app"]
        assert _names(stored["spec"]["initContainers"]) == ["proxy-init"]


def test_manager_namespace_is_never_injected(
    kube: Kube, manager: RunningManager, sidecarsets: Callable[..., dict[str, Any]]
) -> None:
    ss = sidecarsets("sys", namespaceSelector=None)
    assert ss["metadata"]["name"]
    ns = manager.opts.namespace
    kube.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {names.NS_INJECTION_LABEL: "enabled"}}})
    try:
        time.sleep(0.5)
        p = kube.create(f"/api/v1/namespaces/{ns}/pods", make_pod("probe", "sys"), dryRun="All")
        assert _names(p["spec"]["containers"]) == ["app"]
    finally:
        kube.patch(f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {names.NS_INJECTION_LABEL: None}}})


def test_webhook_port_speaks_tls12_plus_and_only_http11_by_default(manager: RunningManager) -> None:
    host, port = "127.0.0.1", int(manager.webhook_url.rsplit(":", 1)[1])
    current = manager.manager.webhook.reloader.current
    assert current is not None
    ca = current.ca_pem.decode()
    for offered, selected in ((["h2"], None), (["h2", "http/1.1"], "http/1.1"), (["http/1.1"], "http/1.1")):
        ctx = ssl.create_default_context(cadata=ca)
        ctx.set_alpn_protocols(offered)
        with socket.create_connection((host, port), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=host) as s:
            assert s.selected_alpn_protocol() == selected, offered
            assert s.version() in ("TLSv1.2", "TLSv1.3")
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(cadata=ca)
    with warnings.catch_warnings():  # deliberately old: the server must refuse it
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("ALL:@SECLEVEL=0")
    with socket.create_connection((host, port), timeout=5) as raw:
        try:
            old.wrap_socket(raw, server_hostname=host).close()
            raise AssertionError("a TLS 1.1 client was accepted")
        except ssl.SSLError:
            pass
