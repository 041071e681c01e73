"""v1alpha1 and v1beta1 side by side on the real API server, converted by the manager's /convert.

- Objects written in one version read back in the other, through the API paths and through
  `kubectl get sidecarsets.v1alpha1.sidecarctl.io` / `.v1beta1` (the control plane's kubectl), and
  a v1beta1 client reads back exactly what it wrote (the conversion loses nothing).
- A SidecarSet written in v1beta1 is served by the manager like any other: injected, its status
  written (the manager reads v1alpha1, the storage version), its update rolled.
- The validating webhook takes both versions and names the v1beta1 field it refuses; the schema's
  rule keeps the two spellings of the namespace scope apart.
- The outage, on a control plane of its own (README: "Conversion webhook outage"): before the
  manager runs and after it is SIGKILLed, everything stored reads and deletes in v1alpha1, while
  v1beta1 reads (plain `kubectl get sidecarsets` among them: v1beta1 is the preferred version)
  fail with the API server's conversion error, and writes of either version are refused by the
  fail-closed validating webhook; a restarted manager serves v1beta1 again.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kuberuntime import api, kubeapi, kubeconfig
from sidecarsets.spec import names
from tests.e2e.helpers import SS_PATH, make_sidecarset, wait_injecting
from tests.kube.client import Kube, eventually
from tests.kube.controlplane import ControlPlane, free_port
from tests.kube.loop import BackgroundLoop
from tests.kube.managerharness import (
    CRD_PATH,
    MANAGER_NS,
    MWC_PATH,
    VWC_PATH,
    RunningManager,
    conversion_bundle_synced,
    conversion_crd,
    conversion_works,
    ensure_namespace,
    start_process,
    wait_ready,
    webhook_configs,
    write_cert_dir,
)

BETA_PATH = f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/{names.PLURAL}"
BETA = names.API_VERSION_V1BETA1
CONVERSION_FAILED = f"conversion webhook for {names.API_VERSION}, Kind={names.KIND} failed"


def kubectl(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    binary = cp.bin_dir / "kubectl"
    assert binary.exists(), f"no kubectl in {cp.bin_dir} (tools/build-control-plane.sh builds it)"
    return subprocess.run(
        [str(binary), f"--kubeconfig={cp.kubeconfig}", *args], capture_output=True, text=True, timeout=60, check=False
    )


def kubectl_json(cp: ControlPlane, *args: str) -> dict[str, Any]:
    proc = kubectl(cp, *args, "-o", "json")
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def beta_sidecarset(name: str, app: str, **spec: Any) -> dict[str, Any]:
    obj = make_sidecarset(name, app, **spec)
    obj["apiVersion"] = BETA
    return obj


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@pytest.fixture
def cleanup(kube: Kube) -> Iterator[list[str]]:
    names_: list[str] = []
    yield names_
    for name in names_:
        kube.delete(f"{SS_PATH}/{name}")


# ---------------------------------------------------------------------------------------------
# Both versions through the session's manager


@pytest.mark.versions
def test_a_v1alpha1_object_reads_back_as_v1beta1(kube: Kube, manager: RunningManager, cleanup: list[str]) -> None:
    name = unique("alpha")
    body = make_sidecarset(name, unique("app"), namespace="shop")
    body["metadata"]["labels"] = {names.SS_LABEL_CUSTOM_VERSION: "v7", "team": "mesh"}
    created = kube.create(SS_PATH, body)
    cleanup.append(name)
    beta = kube.get(f"{BETA_PATH}/{name}")
    assert beta["apiVersion"] == BETA
    assert beta["spec"]["namespaceSelector"] == {"matchLabels": {names.NS_NAME_LABEL: "shop"}}, (
        "Kruise's spelling of an alpha namespace"
    )
    assert "namespace" not in beta["spec"] and "specificNamespace" not in beta["spec"]
    assert beta["spec"]["customVersion"] == "v7"
    assert beta["metadata"]["labels"] == {"team": "mesh"}
    assert beta["metadata"]["uid"] == created["metadata"]["uid"]
    assert beta["spec"]["containers"] == created["spec"]["containers"]
    listed = {o["metadata"]["name"]: o for o in kube.get(BETA_PATH)["items"]}
    assert listed[name]["spec"]["namespaceSelector"] == {"matchLabels": {names.NS_NAME_LABEL: "shop"}}, (
        "a list is converted too"
    )


@pytest.mark.versions
def test_a_v1beta1_object_reads_back_as_written_and_as_v1alpha1(
    kube: Kube, manager: RunningManager, cleanup: list[str]
) -> None:
    name = unique("beta")
    selector = {"matchExpressions": [{"key": names.NS_NAME_LABEL, "operator": "NotIn", "values": ["legacy"]}]}
    body = beta_sidecarset(name, unique("app"), namespaceSelector=selector, customVersion="v2")
    body["metadata"]["labels"] = {names.SS_LABEL_CUSTOM_VERSION: "a-plain-label-here"}
    created = kube.create(BETA_PATH, body)
    cleanup.append(name)
    assert created["spec"]["namespaceSelector"] == selector and created["spec"]["customVersion"] == "v2"
    again = kube.get(f"{BETA_PATH}/{name}")
    assert again["spec"] == created["spec"]
    assert again["metadata"]["labels"] == body["metadata"]["labels"]
    assert "annotations" not in again["metadata"], "the conversion's annotations never show in v1beta1"
    alpha = kube.get(f"{SS_PATH}/{name}")
    assert alpha["apiVersion"] == names.API_VERSION
    assert alpha["spec"]["namespaceSelector"] == selector
    assert alpha["metadata"]["labels"] == {names.SS_LABEL_CUSTOM_VERSION: "v2"}
    assert alpha["metadata"]["annotations"] == {names.ANN_CONVERSION_VERSION_LABEL: "a-plain-label-here"}


@pytest.mark.versions
def test_a_v1beta1_sidecarset_is_served_like_any_other(
    kube: Kube, manager: RunningManager, injected_ns: str, cleanup: list[str]
) -> None:
    name, app = unique("served"), unique("app")
    body = beta_sidecarset(name, app, specificNamespace={"namespace": injected_ns})
    kube.create(BETA_PATH, body)
    cleanup.append(name)
    wait_injecting(kube, injected_ns, app, lambda p: p["spec"]["containers"][0]["name"] == "proxy")
    revision = eventually(
        lambda: (kube.get(f"{SS_PATH}/{name}").get("status") or {}).get("latestRevision"),
        timeout=20,
        what="status written by the controller",
    )
    assert kube.get(f"{BETA_PATH}/{name}")["status"]["latestRevision"] == revision, "status reads the same in v1beta1"
    patch = [{"op": "replace", "path": "/spec/containers/0/image", "value": "proxy:2"}]
    kube.patch(f"{BETA_PATH}/{name}", patch, patch_type="json")

    def proxy_image(pod: dict[str, Any]) -> bool:
        return bool(pod["spec"]["containers"][0]["image"] == "proxy:2")

    wait_injecting(kube, injected_ns, app, proxy_image)
    assert kube.get(f"{SS_PATH}/{name}")["spec"]["containers"][0]["image"] == "proxy:2"


@pytest.mark.versions
def test_validation_takes_v1beta1_and_names_its_fields(kube: Kube, manager: RunningManager) -> None:
    bad = beta_sidecarset(unique("bad"), unique("app"), specificNamespace={"namespace": "Not_A_Namespace"})
    with pytest.raises(api.ApiError) as refused:
        kube.create(BETA_PATH, bad, dryRun="All")
    assert "spec.specificNamespace.namespace" in refused.value.message
    assert "validate.sidecarctl.io" in refused.value.message
    reserved = beta_sidecarset(unique("reserved"), unique("app"))
    reserved["metadata"]["annotations"] = {names.ANN_CONVERSION_VERSION_LABEL: "x"}
    with pytest.raises(api.ApiError) as refused:
        kube.create(BETA_PATH, reserved, dryRun="All")
    assert f"metadata.annotations[{names.ANN_CONVERSION_VERSION_LABEL}]: is reserved" in refused.value.message
    both = beta_sidecarset(
        unique("both"),
        unique("app"),
        namespaceSelector={"matchLabels": {"a": "b"}},
        specificNamespace={"namespace": "shop"},
    )
    with pytest.raises(api.ApiError) as refused:
        kube.create(BETA_PATH, both, dryRun="All")
    assert refused.value.status == 422
    assert "namespaceSelector and specificNamespace are mutually exclusive" in refused.value.message


@pytest.mark.versions
def test_kubectl_gets_both_versions(
    control_plane: ControlPlane, kube: Kube, manager: RunningManager, cleanup: list[str]
) -> None:
    name = unique("kubectl")
    kube.create(SS_PATH, make_sidecarset(name, unique("app"), namespace="shop"))
    cleanup.append(name)
    alpha = kubectl_json(control_plane, "get", f"{names.PLURAL}.{names.VERSION}.{names.GROUP}", name)
    beta = kubectl_json(control_plane, "get", f"{names.PLURAL}.{names.VERSION_V1BETA1}.{names.GROUP}", name)
    assert (alpha["apiVersion"], alpha["spec"]["namespace"]) == (names.API_VERSION, "shop")
    assert (beta["apiVersion"], beta["spec"]["namespaceSelector"]) == (
        BETA,
        {"matchLabels": {names.NS_NAME_LABEL: "shop"}},
    )
    preferred = kubectl_json(control_plane, "get", "sidecarsets", name)
    assert preferred["apiVersion"] == BETA, "kubectl's plain `get sidecarsets` asks for the preferred version"
    table = kubectl(control_plane, "get", f"{names.PLURAL}.{names.VERSION_V1BETA1}.{names.GROUP}", name)
    assert table.returncode == 0, table.stderr
    assert table.stdout.split()[:6] == ["NAME", "MATCHED", "UPDATED", "READY", "POLICY", "AGE"]


# ---------------------------------------------------------------------------------------------
# The outage, on a control plane of its own


class Outage:
    def __init__(self, cp: ControlPlane, kube: Kube, port: int, cert_dir: Path) -> None:
        self.cp, self.kube, self.port, self.cert_dir = cp, kube, port, cert_dir

    def install_webhooks(self) -> None:
        url = f"https://127.0.0.1:{self.port}"
        mwc, vwc = webhook_configs(
            url, mutating=names.MUTATING_WEBHOOK_CONFIG, validating=names.VALIDATING_WEBHOOK_CONFIG
        )
        self.kube.create(MWC_PATH, mwc)
        self.kube.create(VWC_PATH, vwc)

    def start_manager(self) -> Any:
        m = start_process(self.cp, self.cert_dir, identity="conversion-outage", webhook_port=self.port)
        try:
            wait_ready(m, timeout=40)
        except AssertionError:
            m.kill()
            raise
        return m


@pytest.fixture
def outage(aloop: BackgroundLoop, control_plane: ControlPlane) -> Iterator[Outage]:
    cp = ControlPlane(bin_dir=control_plane.bin_dir, controller_manager=False).start()
    client = kubeapi.KubeClient(kubeconfig.load_config(str(cp.kubeconfig)))
    kube = Kube(aloop, client)
    port = free_port()
    cert_dir = Path(tempfile.mkdtemp(prefix="sidecarctl-conversion-certs-"))
    write_cert_dir(cert_dir)
    url = f"https://127.0.0.1:{port}"
    try:
        kube.create(CRD_PATH, conversion_crd(url))

        def served() -> bool:
            try:
                kube.get(SS_PATH)
            except api.ApiError as e:  # 404 until discovery has it, 429 while its storage starts
                assert e.status in (404, 429), e
                return False
            return True

        eventually(served, timeout=30, interval=0.2, what="the CRD served")
        ensure_namespace(kube, MANAGER_NS)
        yield Outage(cp, kube, port, cert_dir)
    finally:
        aloop.run(client.close())
        cp.stop()


def _conversion_refused(kube: Kube, path: str) -> str:
    with pytest.raises(api.ApiError) as failed:
        kube.get(path)
    assert CONVERSION_FAILED in failed.value.message, failed.value.message
    return failed.value.message


def test_a_conversion_webhook_outage_is_answered_as_the_readme_says(outage: Outage) -> None:
    kube, cp = outage.kube, outage.cp
    # An object stored before the manager runs (before the webhooks were installed): v1alpha1 is the
    # storage version, so it reads without a conversion; v1beta1 needs one, and nothing answers yet.
    old = unique("old")
    kube.create(SS_PATH, make_sidecarset(old, unique("app"), namespace="shop"))
    outage.install_webhooks()
    assert kube.get(f"{SS_PATH}/{old}")["spec"]["namespace"] == "shop"
    message = _conversion_refused(kube, f"{BETA_PATH}/{old}")
    assert "/convert" in message, "the error names the webhook the API server could not call"

    manager = outage.start_manager()
    try:
        started = time.monotonic()
        eventually(lambda: conversion_bundle_synced(kube), timeout=20, what="the CRD's caBundle written")
        eventually(lambda: conversion_works(kube), timeout=20, interval=0.02, what="v1beta1 converted")
        print(f"\nv1beta1 served {time.monotonic() - started:.2f} s after the first manager was ready")
        assert kube.get(f"{BETA_PATH}/{old}")["spec"]["namespaceSelector"] == {
            "matchLabels": {names.NS_NAME_LABEL: "shop"}
        }
        new = unique("new")
        kube.create(BETA_PATH, beta_sidecarset(new, unique("app"), specificNamespace={"namespace": "cafe"}))
    finally:
        manager.kill()  # SIGKILL: nothing answers /convert any more

    # Stored objects, whichever version wrote them, read (and list) in v1alpha1.
    assert kube.get(f"{SS_PATH}/{new}")["spec"]["namespace"] == "cafe"
    assert {old, new} <= {o["metadata"]["name"] for o in kube.get(SS_PATH)["items"]}
    assert kubectl_json(cp, "get", f"{names.PLURAL}.{names.VERSION}.{names.GROUP}", new)["spec"]["namespace"] == "cafe"
    # v1beta1 gets do not: through the API and kubectl's plain `get sidecarsets NAME` (the preferred
    # version). A list may still come from the API server's watch cache, converted before the outage.
    _conversion_refused(kube, f"{BETA_PATH}/{new}")
    plain = kubectl(cp, "get", "sidecarsets", new)
    assert plain.returncode != 0 and CONVERSION_FAILED in plain.stderr, plain.stderr
    try:
        listed = kube.get(BETA_PATH)["items"]
    except api.ApiError as e:
        assert CONVERSION_FAILED in e.message, e.message
    else:
        assert {o["apiVersion"] for o in listed} == {BETA}, "a cached answer is still converted"
        assert {o["metadata"]["name"]: o["spec"].get("namespaceSelector") for o in listed} == {
            old: {"matchLabels": {names.NS_NAME_LABEL: "shop"}},
            new: {"matchLabels": {names.NS_NAME_LABEL: "cafe"}},
        }
    with pytest.raises(api.ApiError) as failed:
        kube.delete(f"{BETA_PATH}/{new}")
    assert CONVERSION_FAILED in failed.value.message, "a v1beta1 delete answers with the object: it must convert"
    # Writes of either version meet the fail-closed validating webhook first.
    for path, body in (
        (SS_PATH, make_sidecarset(unique("w"), unique("app"))),
        (BETA_PATH, beta_sidecarset(unique("w"), unique("app"))),
    ):
        with pytest.raises(api.ApiError) as refused:
            kube.create(path, body)
        assert "validate.sidecarctl.io" in refused.value.message, refused.value.message
    # In v1alpha1 status writes and deletes work (no webhook on either, nothing to convert).
    status = {"matchedPods": 1, "updatedPods": 1, "readyPods": 1}
    assert kube.patch(f"{SS_PATH}/{new}/status", {"status": status})["status"]["matchedPods"] == 1
    kube.delete(f"{SS_PATH}/{old}")
    eventually(lambda: kube.get_or_none(f"{SS_PATH}/{old}") is None, timeout=10, what=f"{old} deleted")

    restarted = outage.start_manager()
    try:
        started = time.monotonic()
        back = eventually(lambda: kube.get(f"{BETA_PATH}/{new}"), timeout=20, what="v1beta1 served again")
        assert back["spec"]["namespaceSelector"] == {"matchLabels": {names.NS_NAME_LABEL: "cafe"}}
        print(f"\nv1beta1 served again {time.monotonic() - started:.2f} s after the restarted manager was ready")
    finally:
        restarted.kill()
