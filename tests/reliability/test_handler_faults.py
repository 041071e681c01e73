"""A fault inside the real manager's handlers is answered as the webhook's fault, not the caller's.

The manager runs as `sidecarctl run` (supervisor, control process, two admission workers) with a
fault planted in every process by a `sitecustomize` module put first on its PYTHONPATH: deciding
/inject raises for a pod named `fault-*`, converting a SidecarSet named `fault-*` raises. Nothing
in the product knows of it. Through the real API server:
- creating such a pod fails with HTTP 500 and the webhook's message, as `kubectl` shows it, and the
  next ordinary pod in the namespace is injected: the worker answered, it did not die;
- reading such a SidecarSet in v1beta1 fails with the webhook's message; the others still convert;
on the wire, the AdmissionReview answer is a denial with code 500 (InternalError) for the request's
uid, the ConversionReview answer a Failure with code 500; and the supervisor restarted nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import orjson
import pytest

from kuberuntime import api
from sidecarsets.spec import names
from tests.kube import builders
from tests.kube.client import eventually
from tests.kube.controlplane import REPO
from tests.kube.managerharness import CRD_PATH, ManagerProcess, conversion_bundle_synced, conversion_crd
from tests.kube.managerharness import conversion_works as converts
from tests.kube.measure import WebhookClient, pod_review
from tests.reliability.harness import SS_PATH, ReliabilityCluster, child_pids, supervisor_restarts

SIDECARSETS = {"mesh": "shop"}  # created by the `cluster` fixture before the manager starts
BETA_PATH = f"/apis/{names.GROUP}/{names.VERSION_V1BETA1}/{names.PLURAL}"
INJECT_FAULT = "planted fault in /inject"
CONVERT_FAULT = "planted fault in /convert"

# Loaded by every Python process of the manager at start-up (site imports `sitecustomize` from the
# path); it wraps the two handlers when their modules are first imported, so nothing loads early.
SITECUSTOMIZE = f"""
import importlib.abc
import importlib.machinery
import sys


def _faulty(name):
    return isinstance(name, str) and name.startswith("fault-")


def _plant(module):
    if module.__name__ == "injector.http.decisions":
        inject = module.inject

        async def faulty_inject(review, *args):
            if _faulty(((review.object or {{}}).get("metadata") or {{}}).get("name")):
                raise RuntimeError({INJECT_FAULT!r})
            return await inject(review, *args)

        module.inject = faulty_inject
    else:
        convert = module.convert

        def faulty_convert(obj, desired):
            if _faulty(((obj or {{}}).get("metadata") or {{}}).get("name")):
                raise RuntimeError({CONVERT_FAULT!r})
            return convert(obj, desired)

        module.convert = faulty_convert


class _Planter(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in ("injector.http.decisions", "sidecarsets.spec.conversion"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                _plant(module)

            spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Planter())
"""


@pytest.fixture(scope="module")
def manager(cluster: ReliabilityCluster) -> Iterator[ManagerProcess]:
    """The manager with the faults planted, its webhooks registered and the CRD converted by it."""
    faults = cluster.workdir / "faults"
    faults.mkdir(exist_ok=True)
    (faults / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # Webhook injection only: a pod a MutatingAdmissionPolicy injects never reaches /inject.
    m = cluster.start_manager("faulty", extra=("--injection=webhook",), env={"PYTHONPATH": f"{faults}:{REPO}"})
    try:
        cluster.register_webhooks(m, "shop")
        cluster.kube.apply(CRD_PATH, conversion_crd(m.webhook_url))
        eventually(lambda: conversion_bundle_synced(cluster.kube), timeout=30, what="the CRD's caBundle")
        eventually(lambda: converts(cluster.kube), timeout=30, interval=0.2, what="conversion through the manager")
        yield m
    finally:
        cluster.stop_manager(m)


def test_a_fault_in_inject_fails_that_pod_with_500_and_the_next_pod_is_injected(
    cluster: ReliabilityCluster, manager: ManagerProcess
) -> None:
    workers = child_pids(manager)
    ns = cluster.labelled_namespace("faults")
    pods = f"/api/v1/namespaces/{ns}/pods"
    with pytest.raises(api.ApiError) as refused:
        cluster.kube.create(pods, builders.pod("fault-1", labels={"app": "shop"}))
    assert refused.value.status == 500, refused.value
    message = refused.value.message
    assert message.startswith('admission webhook "inject.sidecarctl.io" denied the request: '), message
    assert f"RuntimeError: {INJECT_FAULT}" in message and "see the manager's log" in message, message
    created = cluster.kube.create(pods, builders.pod("web-1", labels={"app": "shop"}))
    assert "proxy" in [c["name"] for c in created["spec"]["containers"]]
    assert not supervisor_restarts(manager), supervisor_restarts(manager)
    assert child_pids(manager) == workers


def test_on_the_wire_the_admission_answer_is_a_denial_with_code_500_for_that_uid(
    cluster: ReliabilityCluster, manager: ManagerProcess
) -> None:
    client = WebhookClient(manager.webhook_url, cluster.ca_file)
    try:
        for _ in range(4):  # both workers, whichever takes the connection
            uid = secrets.token_hex(8)
            status, body, _ = client.post(names.INJECT_PATH, pod_review("faults", "fault-2", app="shop", uid=uid))
            answer = orjson.loads(body)["response"]
            assert (status, answer["uid"], answer["allowed"]) == (200, uid, False), body[:300]
            assert (answer["status"]["code"], answer["status"]["reason"]) == (500, "InternalError")
            assert INJECT_FAULT in answer["status"]["message"]
            client.close()
    finally:
        client.close()


def test_a_fault_in_conversion_fails_that_read_and_the_others_convert(
    cluster: ReliabilityCluster, manager: ManagerProcess
) -> None:
    cluster.sidecarset("fault-conv", "nothing")
    with pytest.raises(api.ApiError) as refused:
        cluster.kube.get(f"{BETA_PATH}/fault-conv")
    message = refused.value.message
    assert f"conversion webhook for {names.API_VERSION}, Kind={names.KIND} failed" in message, message
    assert f"RuntimeError: {CONVERT_FAULT}" in message and "see the manager's log" in message, message
    assert cluster.kube.get(f"{BETA_PATH}/mesh")["apiVersion"] == names.API_VERSION_V1BETA1
    cluster.kube.delete(f"{SS_PATH}/fault-conv")


def test_on_the_wire_the_conversion_answer_is_a_failure_with_code_500(
    cluster: ReliabilityCluster, manager: ManagerProcess
) -> None:
    uid = secrets.token_hex(8)
    request = {"uid": uid, "desiredAPIVersion": names.API_VERSION_V1BETA1, "objects": [builders.sidecarset("fault-3")]}
    review = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "request": request}
    client = WebhookClient(manager.webhook_url, cluster.ca_file)
    try:
        status, body, _ = client.post(names.CONVERT_PATH, orjson.dumps(review))
    finally:
        client.close()
    answer = orjson.loads(body)["response"]
    assert (status, answer["uid"]) == (200, uid), body[:300]
    result = answer["result"]
    assert (result["status"], result["code"], result["reason"]) == ("Failure", 500, "InternalError")
    assert CONVERT_FAULT in result["message"] and "convertedObjects" not in answer
