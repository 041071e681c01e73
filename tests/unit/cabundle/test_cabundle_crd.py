"""caBundle of the SidecarSet CRD's conversion webhook: kept like the webhook configurations' caBundle.

Same syncer, same rules (tests/unit/cabundle/test_cabundle.py has them for webhook configurations): only
`spec.conversion.webhook.clientConfig.caBundle` is written, behind a resourceVersion test; the bundle
policy (exact or merge), ownership marker, foreign-write repair and conflict handling all apply; and
a CRD that does not convert by webhook is left alone.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

import pytest

from cabundle.syncer import CABundleSyncer, SyncResult, WebhookConfigRef
from certwatcher import pem
from sidecarctl.manager.control import _bundle_owners
from sidecarctl.manager.options import ManagerOptions
from sidecarsets.spec import names
from tests.certutil import KeyPair, make_ca
from tests.kube.fakeapi import FakeApiServer

CRD = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{names.CRD_NAME}"
REF = WebhookConfigRef("conversion", names.CRD_NAME)


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def live_ca(name: str) -> KeyPair:
    return make_ca(name, lifetime=timedelta(days=30))


def crd(*, ca_bundle: bytes | None = None, strategy: str = "Webhook", labels: dict[str, str] | None = None) -> Any:
    client: dict[str, Any] = {"service": {"namespace": "sidecarctl-system", "name": "sidecarctl-webhook"}}
    if ca_bundle is not None:
        client["caBundle"] = base64.b64encode(ca_bundle).decode()
    conversion: dict[str, Any] = {"strategy": strategy}
    if strategy == "Webhook":
        conversion["webhook"] = {"conversionReviewVersions": ["v1"], "clientConfig": client}
    meta: dict[str, Any] = {"name": names.CRD_NAME}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "spec": {"group": names.GROUP, "conversion": conversion, "versions": [{"name": "x"}]}}


def bundle(api: FakeApiServer) -> list[int]:
    client = api.objects[CRD]["spec"]["conversion"]["webhook"]["clientConfig"]
    return [c.serial_number for c in pem.certificates(base64.b64decode(client.get("caBundle", "")))]


def test_the_ref_names_the_crd() -> None:
    assert REF.path == CRD
    with pytest.raises(ValueError, match="one conversion webhook"):
        WebhookConfigRef("conversion", names.CRD_NAME, webhooks=frozenset({"a"}))


def test_first_sync_writes_only_the_conversion_ca_bundle() -> None:
    ca = live_ca("local")

    class Recording(FakeApiServer):
        ops: list[Any] = []

        async def patch(self, path: str, body: Any, **kw: Any) -> dict[str, Any]:
            self.ops.append(body)
            return await super().patch(path, body, **kw)

    async def main() -> None:
        api = Recording()
        api.put(CRD, crd())
        before = copy.deepcopy(api.objects[CRD])
        syncer = CABundleSyncer(api, configs=[REF], local_ca_pem=ca.cert_pem)
        assert await syncer.reconcile_once() == {names.CRD_NAME: SyncResult.WRITTEN}
        (ops,) = api.ops
        assert ops[0] == {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": before["metadata"]["resourceVersion"],
        }
        assert [(o["op"], o["path"]) for o in ops[1:]] == [("add", "/spec/conversion/webhook/clientConfig/caBundle")]
        assert bundle(api) == [ca.serial]
        after = copy.deepcopy(api.objects[CRD])
        after["spec"]["conversion"]["webhook"]["clientConfig"].pop("caBundle")
        after["metadata"].pop("resourceVersion")
        before["metadata"].pop("resourceVersion")
        assert after == before, "nothing but caBundle changed"
        assert await syncer.reconcile_once() == {names.CRD_NAME: SyncResult.IN_SYNC}
        assert syncer.writes == {names.CRD_NAME: 1}

    run(main())


@pytest.mark.parametrize(("keep_existing", "expected"), [(True, ["local", "foreign"]), (False, ["local"])])
def test_merge_and_exact_policies(keep_existing: bool, expected: list[str]) -> None:
    cas = {"local": live_ca("local"), "foreign": live_ca("foreign")}

    async def main() -> None:
        api = FakeApiServer()
        api.put(CRD, crd(ca_bundle=cas["foreign"].cert_pem))
        syncer = CABundleSyncer(api, configs=[REF], local_ca_pem=cas["local"].cert_pem, keep_existing=keep_existing)
        await syncer.reconcile_once()
        assert bundle(api) == [cas[name].serial for name in expected]

    run(main())


def test_a_foreign_write_is_repaired_at_the_next_pass() -> None:
    ca = live_ca("local")

    async def main() -> None:
        api = FakeApiServer()
        api.put(CRD, crd(ca_bundle=ca.cert_pem))
        syncer = CABundleSyncer(api, configs=[REF], local_ca_pem=ca.cert_pem)
        assert await syncer.reconcile_once() == {names.CRD_NAME: SyncResult.IN_SYNC}
        api.foreign_write(CRD, lambda o: o["spec"]["conversion"]["webhook"]["clientConfig"].update(caBundle="junk"))
        assert await syncer.reconcile_once() == {names.CRD_NAME: SyncResult.WRITTEN}
        assert bundle(api) == [ca.serial]

    run(main())


def test_ownership_marker_applies_to_the_crd_too() -> None:
    ca = live_ca("local")
    marker = ("app.kubernetes.io/managed-by", "sidecarctl")

    async def main() -> None:
        api = FakeApiServer()
        api.put(CRD, crd())
        syncer = CABundleSyncer(api, configs=[REF], local_ca_pem=ca.cert_pem, owner_marker=marker)
        assert await syncer.reconcile_once() == {names.CRD_NAME: SyncResult.NOT_OWNED}
        api.foreign_write(CRD, lambda o: o["metadata"].update(labels=dict([marker])))
        assert await syncer.reconcile_once() == {names.CRD_NAME: SyncResult.WRITTEN}

    run(main())


def test_a_crd_without_a_conversion_webhook_is_left_alone() -> None:
    ca = live_ca("local")

    async def main() -> None:
        api = FakeApiServer()
        api.put(CRD, crd(strategy="None"))
        syncer = CABundleSyncer(api, configs=[REF], local_ca_pem=ca.cert_pem)
        assert await syncer.reconcile_once() == {names.CRD_NAME: SyncResult.INVALID}
        assert api.writes() == []
        missing = CABundleSyncer(FakeApiServer(), configs=[REF], local_ca_pem=ca.cert_pem)
        assert await missing.reconcile_once() == {names.CRD_NAME: SyncResult.MISSING}

    run(main())


def test_a_conflicting_write_is_retried() -> None:
    ca = live_ca("local")

    class Racy(FakeApiServer):
        raced = False

        async def patch(self, path: str, body: Any, **kw: Any) -> dict[str, Any]:
            if not self.raced:
                self.raced = True
                self.foreign_write(path, lambda o: o["metadata"].setdefault("labels", {}).update(x="y"))
            return await super().patch(path, body, **kw)

    async def main() -> None:
        api = Racy()
        api.put(CRD, crd())
        syncer = CABundleSyncer(api, configs=[REF], local_ca_pem=ca.cert_pem, fast_retry_delay=0.02)
        stop = asyncio.Event()
        task = asyncio.create_task(syncer.run(stop))
        await asyncio.sleep(0.3)
        stop.set()
        await task
        assert (syncer.conflicts[names.CRD_NAME], syncer.writes[names.CRD_NAME]) == (1, 1)
        assert bundle(api) == [ca.serial] and api.objects[CRD]["metadata"]["labels"] == {"x": "y"}

    run(main())


def test_the_manager_keeps_the_crd_unless_told_not_to() -> None:
    kinds = [(r.kind, r.name) for r in _bundle_owners(ManagerOptions.build())]
    assert kinds == [
        ("mutating", names.MUTATING_WEBHOOK_CONFIG),
        ("validating", names.VALIDATING_WEBHOOK_CONFIG),
        ("conversion", names.CRD_NAME),
    ]
    assert [r.kind for r in _bundle_owners(ManagerOptions.build(conversion_crd=""))] == ["mutating", "validating"]
