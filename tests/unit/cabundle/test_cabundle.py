"""caBundle policy (`desired_bundle`) and the syncer against an in-memory API that enforces
resourceVersion: idempotence, repair of foreign writes, ownership limits, bounded write rates."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cabundle import metrics
from cabundle.bundlepolicy import bundle_differs, desired_bundle
from cabundle.syncer import CABundleSyncer, SyncResult, WebhookConfigRef
from cabundle.writebudget import WriteBudget
from certwatcher import pem
from kuberuntime import api as kube
from tests.certutil import (
    MWC_PATH,
    VWC_PATH,
    KeyPair,
    bundle_of,
    make_ca,
    make_leaf,
    now,
    pems,
    utc,
    webhook_config,
)
from tests.kube.fakeapi import FakeApiServer

pytestmark = pytest.mark.serial  # bounds elapsed time: runs alone, not beside other tests

T0 = utc(2030, 6, 1)
OLD = make_ca("old", not_before=utc(2029, 1, 1), not_after=utc(2030, 7, 1))
NEW = make_ca("new", not_before=utc(2030, 5, 1), not_after=utc(2035, 5, 1))
EXPIRED = make_ca("expired", not_before=utc(2028, 1, 1), not_after=utc(2030, 1, 1))
FOREIGN = make_ca("foreign", not_before=utc(2030, 1, 1), not_after=utc(2031, 1, 1))
LEAF = make_leaf(NEW, not_before=utc(2030, 5, 1), not_after=utc(2030, 9, 1))


def serials(bundle: bytes) -> list[int]:
    return [c.serial_number for c in pem.certificates(bundle)]


def ids(*pairs: KeyPair) -> list[int]:
    return [p.serial for p in pairs]


# --- policy ------------------------------------------------------------------------------------------


def test_expired_pruned_valid_kept_new_first_deduplicated() -> None:
    current = pems(EXPIRED, OLD, OLD)
    assert serials(desired_bundle(current, NEW.cert_pem, now=T0)) == ids(NEW, OLD)


def test_old_ca_leaves_only_after_it_expires() -> None:
    current = pems(NEW, OLD)
    assert serials(desired_bundle(current, NEW.cert_pem, now=utc(2030, 7, 1))) == ids(NEW, OLD)
    assert serials(desired_bundle(current, NEW.cert_pem, now=utc(2030, 7, 1, 0, 0, 1))) == ids(NEW)


def test_non_ca_and_garbage_dropped() -> None:
    current = LEAF.cert_pem + b"-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n" + OLD.cert_pem
    assert serials(desired_bundle(current, NEW.cert_pem, now=T0)) == ids(NEW, OLD)


def test_kept_ones_ordered_by_not_after() -> None:
    current = pems(FOREIGN, OLD)  # FOREIGN expires later than OLD
    assert serials(desired_bundle(current, NEW.cert_pem, now=T0)) == ids(NEW, OLD, FOREIGN)


def test_replace_mode_keeps_nothing_foreign() -> None:
    assert serials(desired_bundle(pems(OLD), NEW.cert_pem, now=T0, keep_existing=False)) == ids(NEW)


def test_local_expired_and_local_non_ca_leaf_are_not_published() -> None:
    assert desired_bundle(b"", pems(EXPIRED, LEAF), now=T0) == b""


def test_differs_ignores_order_but_not_content() -> None:
    assert not bundle_differs(pems(OLD, NEW), pems(NEW, OLD))
    assert bundle_differs(pems(NEW), pems(NEW, OLD))
    assert bundle_differs(pems(NEW, NEW), pems(NEW))
    assert bundle_differs(pems(NEW) + b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----", pems(NEW))


POOL = [OLD, NEW, EXPIRED, FOREIGN, LEAF]
bundles = st.lists(st.sampled_from(POOL), max_size=6).map(lambda ps: pems(*ps))
moments = st.sampled_from([utc(2029, 6, 1), T0, utc(2030, 8, 1), utc(2032, 1, 1)])


@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(current=bundles, local=st.lists(st.sampled_from([NEW, OLD, FOREIGN]), min_size=1, max_size=2), at=moments)
def test_policy_properties(current: bytes, local: list[KeyPair], at: Any) -> None:
    local_pem = pems(*local)
    out = desired_bundle(current, local_pem, now=at)
    certs = pem.certificates(out)
    fps = [pem.fingerprint(c) for c in certs]
    assert len(fps) == len(set(fps))  # no duplicates
    assert all(not pem.expired(c, at) and pem.is_ca(c) for c in certs)
    live_local = [p.serial_number for p in pem.dedupe(pem.certificates(local_pem)) if not pem.expired(p, at)]
    assert serials(out)[: len(live_local)] == live_local  # local first, in file order
    for c in pem.certificates(current):  # every live CA already published survives
        if pem.is_ca(c) and not pem.expired(c, at):
            assert pem.fingerprint(c) in fps
    assert desired_bundle(out, local_pem, now=at) == out  # a fixed point
    assert not bundle_differs(out, desired_bundle(out, local_pem, now=at))


# --- syncer ------------------------------------------------------------------------------------------

MWC = f"{MWC_PATH}/sidecarctl-injector"
VWC = f"{VWC_PATH}/sidecarctl-validator"
STRANGER = f"{MWC_PATH}/someone-else"


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def live_ca(name: str) -> KeyPair:
    return make_ca(name, lifetime=timedelta(days=30))


def seeded(ca_bundle: bytes | None = None) -> FakeApiServer:
    api = FakeApiServer()
    api.put(MWC, webhook_config("mutating", "sidecarctl-injector", ["inject.sidecarctl.io", "b"], ca_bundle=ca_bundle))
    api.put(VWC, webhook_config("validating", "sidecarctl-validator", ["validate.sidecarctl.io"], ca_bundle=ca_bundle))
    api.put(STRANGER, webhook_config("mutating", "someone-else", ["x"], ca_bundle=b"theirs"))
    return api


def test_first_sync_fills_every_webhook_and_touches_nothing_else() -> None:
    ca = live_ca("local")

    async def main() -> None:
        api = seeded()
        before = {p: dict(o) for p, o in api.objects.items()}
        syncer = CABundleSyncer(api, local_ca_pem=ca.cert_pem)
        result = await syncer.reconcile_once()
        assert result == {"sidecarctl-injector": SyncResult.WRITTEN, "sidecarctl-validator": SyncResult.WRITTEN}
        for path, count in ((MWC, 2), (VWC, 1)):
            obj = api.objects[path]
            for i in range(count):
                assert serials(bundle_of(obj, i)) == [ca.serial]
            # Nothing but caBundle changed.
            for i, hook in enumerate(obj["webhooks"]):
                assert {k: v for k, v in hook["clientConfig"].items() if k != "caBundle"} == before[path]["webhooks"][
                    i
                ]["clientConfig"]
                assert {k: v for k, v in hook.items() if k != "clientConfig"} == {
                    k: v for k, v in before[path]["webhooks"][i].items() if k != "clientConfig"
                }
        assert api.objects[STRANGER] == before[STRANGER]
        assert all(p != STRANGER for _, p in api.calls)
        assert syncer.writes == {"sidecarctl-injector": 1, "sidecarctl-validator": 1}

    run(main())


def test_patch_is_guarded_and_minimal() -> None:
    ca = live_ca("local")

    class Recording(FakeApiServer):
        ops: list[list[dict[str, Any]]] = []

        async def patch(
            self, path: str, body: Any, *, patch_type: kube.PatchType = "merge", params: kube.Params | None = None
        ) -> dict[str, Any]:
            ops = body
            self.ops.append(ops)
            return await super().patch(path, ops, patch_type=patch_type)

    async def main() -> None:
        api = Recording()
        api.put(MWC, webhook_config("mutating", "sidecarctl-injector", ["a", "b"], ca_bundle=ca.cert_pem))
        api.foreign_write(MWC, lambda o: o["webhooks"][1]["clientConfig"].pop("caBundle"))
        rv = api.objects[MWC]["metadata"]["resourceVersion"]
        syncer = CABundleSyncer(api, configs=[WebhookConfigRef("mutating", "sidecarctl-injector")])
        syncer.set_local_ca(ca.cert_pem)
        await syncer.reconcile_once()
        (ops,) = api.ops
        assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": rv}
        assert [(o["op"], o["path"]) for o in ops[1:]] == [("add", "/webhooks/1/clientConfig/caBundle")]

    run(main())


def test_ten_reconciles_without_change_write_nothing() -> None:
    ca = live_ca("local")

    async def main() -> None:
        api = seeded()
        syncer = CABundleSyncer(api, local_ca_pem=ca.cert_pem)
        await syncer.reconcile_once()
        rvs = {p: o["metadata"]["resourceVersion"] for p, o in api.objects.items()}
        writes = len(api.writes())
        for _ in range(10):
            assert set((await syncer.reconcile_once()).values()) == {SyncResult.IN_SYNC}
        assert len(api.writes()) == writes
        assert {p: o["metadata"]["resourceVersion"] for p, o in api.objects.items()} == rvs

    run(main())


def test_leaf_rotation_under_same_ca_writes_nothing() -> None:
    ca = live_ca("local")

    async def main() -> None:
        api = seeded(ca_bundle=ca.cert_pem)
        syncer = CABundleSyncer(api, local_ca_pem=ca.cert_pem)
        await syncer.reconcile_once()
        # The reloader hands over the same ca.crt bytes after every leaf change.
        for _ in range(3):
            syncer.set_local_ca(ca.cert_pem)
            await syncer.reconcile_once()
        assert syncer.write_count == 0 and api.writes() == []

    run(main())


@pytest.mark.parametrize("foreign", [b"", b"not a cert", "OTHER"])
def test_foreign_write_repaired_within_one_resync(foreign: bytes | str) -> None:
    ca = live_ca("local")
    other = live_ca("other")
    value = other.cert_pem if foreign == "OTHER" else foreign
    assert isinstance(value, bytes)

    async def main() -> None:
        api = seeded()
        syncer = CABundleSyncer(api, local_ca_pem=ca.cert_pem, resync_interval=0.5)
        stop = asyncio.Event()
        task = asyncio.create_task(syncer.run(stop))
        await asyncio.sleep(0.1)
        assert serials(bundle_of(api.objects[MWC])) == [ca.serial]

        def clobber(obj: dict[str, Any]) -> None:
            obj["webhooks"][0]["clientConfig"]["caBundle"] = base64.b64encode(value).decode()

        api.foreign_write(MWC, clobber)
        clobbered = time.monotonic()
        while ca.serial not in serials(bundle_of(api.objects[MWC])):
            assert time.monotonic() - clobbered < 0.5 + 0.2, "not repaired within one resync (+ scheduling slack)"
            await asyncio.sleep(0.01)
        stop.set()
        await task
        expected = [ca.serial, other.serial] if foreign == "OTHER" else [ca.serial]
        assert serials(bundle_of(api.objects[MWC])) == expected

    run(main())


def test_missing_configuration_is_left_alone_then_synced_when_created() -> None:
    ca = live_ca("local")

    async def main() -> None:
        api = FakeApiServer()
        syncer = CABundleSyncer(api, local_ca_pem=ca.cert_pem)
        assert (await syncer.reconcile_once())["sidecarctl-injector"] is SyncResult.MISSING
        assert api.writes() == []
        api.put(MWC, webhook_config("mutating", "sidecarctl-injector", ["a"]))
        assert (await syncer.reconcile_once())["sidecarctl-injector"] is SyncResult.WRITTEN

    run(main())


def test_owner_marker_when_enabled() -> None:
    ca = live_ca("local")
    marker = ("app.kubernetes.io/managed-by", "sidecarctl")

    async def main() -> None:
        api = FakeApiServer()
        api.put(MWC, webhook_config("mutating", "sidecarctl-injector", ["a"]))
        api.put(VWC, webhook_config("validating", "sidecarctl-validator", ["v"], labels=dict([marker])))
        syncer = CABundleSyncer(api, local_ca_pem=ca.cert_pem, owner_marker=marker)
        result = await syncer.reconcile_once()
        assert result == {"sidecarctl-injector": SyncResult.NOT_OWNED, "sidecarctl-validator": SyncResult.WRITTEN}
        assert "caBundle" not in api.objects[MWC]["webhooks"][0]["clientConfig"]
        # Default off: the same unmarked object is ours by name.
        assert (await CABundleSyncer(api, local_ca_pem=ca.cert_pem).reconcile_once())[
            "sidecarctl-injector"
        ] is SyncResult.WRITTEN

    run(main())


def test_webhook_name_filter() -> None:
    ca = live_ca("local")

    async def main() -> None:
        api = seeded()
        ref = WebhookConfigRef("mutating", "sidecarctl-injector", webhooks=frozenset({"b"}))
        await CABundleSyncer(api, configs=[ref], local_ca_pem=ca.cert_pem).reconcile_once()
        hooks = api.objects[MWC]["webhooks"]
        assert "caBundle" not in hooks[0]["clientConfig"] and serials(bundle_of(api.objects[MWC], 1)) == [ca.serial]

    run(main())


def test_no_valid_local_ca_means_no_write() -> None:
    async def main() -> None:
        api = seeded()
        syncer = CABundleSyncer(api, local_ca_pem=b"")
        assert set((await syncer.reconcile_once()).values()) == {SyncResult.NO_LOCAL_CA}
        syncer.set_local_ca(make_leaf(live_ca("x")).cert_pem)  # a leaf is not a CA
        assert set((await syncer.reconcile_once()).values()) == {SyncResult.NO_LOCAL_CA}
        assert api.writes() == []

    run(main())


def test_conflict_is_counted_and_retried() -> None:
    ca = live_ca("local")

    class Racy(FakeApiServer):
        raced = False

        async def patch(
            self, path: str, body: Any, *, patch_type: kube.PatchType = "merge", params: kube.Params | None = None
        ) -> dict[str, Any]:
            ops = body
            if not self.raced:  # someone writes between our GET and PATCH, once
                self.raced = True
                self.foreign_write(path, lambda o: o["metadata"].setdefault("labels", {}).update(x="y"))
            return await super().patch(path, ops, patch_type=patch_type)

    async def main() -> None:
        api = Racy()
        api.put(MWC, webhook_config("mutating", "sidecarctl-injector", ["a"]))
        ref = WebhookConfigRef("mutating", "sidecarctl-injector")
        before = metrics.CABUNDLE_CONFLICTS.labels(configuration="sidecarctl-injector")._value.get()
        syncer = CABundleSyncer(api, configs=[ref], local_ca_pem=ca.cert_pem, fast_retry_delay=0.02)
        stop = asyncio.Event()
        task = asyncio.create_task(syncer.run(stop))
        await asyncio.sleep(0.3)
        stop.set()
        await task
        assert syncer.conflicts["sidecarctl-injector"] == 1 and syncer.writes["sidecarctl-injector"] == 1
        assert api.objects[MWC]["metadata"]["labels"] == {"x": "y"}  # the other writer's change survives
        assert metrics.CABUNDLE_CONFLICTS.labels(configuration="sidecarctl-injector")._value.get() == before + 1

    run(main())


def fight(*, keep_existing: bool, duration: float, resync: float) -> tuple[list[int], FakeApiServer]:
    """Two syncers with different CAs, each woken by every write as a watch would wake it."""
    a, b = live_ca("a"), live_ca("b")
    api = FakeApiServer()
    api.put(MWC, webhook_config("mutating", "sidecarctl-injector", ["a"]))
    ref = [WebhookConfigRef("mutating", "sidecarctl-injector")]
    syncers = [
        CABundleSyncer(
            api,
            configs=ref,
            local_ca_pem=ca.cert_pem,
            resync_interval=resync,
            keep_existing=keep_existing,
            fast_retry_delay=0.01,
        )
        for ca in (a, b)
    ]
    for s in syncers:
        api.listeners.append(lambda _path, _old, _new, s=s: s.notify())  # type: ignore[misc]

    async def main() -> None:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(s.run(stop)) for s in syncers]
        await asyncio.sleep(duration)
        stop.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    return [s.write_count + s.conflicts["sidecarctl-injector"] for s in syncers], api


def test_two_disagreeing_writers_stay_bounded() -> None:
    duration, resync = 2.0, 0.25
    attempts, _ = fight(keep_existing=False, duration=duration, resync=resync)
    bound = 3 + duration / resync + 1  # burst + refills (+1 for the refill in progress)
    assert all(n <= bound for n in attempts), attempts
    assert sum(attempts) >= 6  # they really did fight
    # For a minute at the default 30 s resync: 3 + 2 writes each, not thousands.


def test_two_merging_writers_converge() -> None:
    attempts, api = fight(keep_existing=True, duration=0.5, resync=0.1)
    assert sum(attempts) <= 3, attempts
    published = serials(bundle_of(api.objects[MWC]))
    assert len(published) == 2


def test_write_budget_arithmetic() -> None:
    budget = WriteBudget(burst=3, refill_interval=10.0, now=0.0)
    assert [budget.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert budget.wait(0.0) == pytest.approx(10.0)
    assert not budget.take(9.9) and budget.take(10.0)
    assert budget.take(100.0) and budget.take(100.0) and budget.take(100.0) and not budget.take(100.0)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="resync_interval"):
        CABundleSyncer(FakeApiServer(), resync_interval=0)
    with pytest.raises(ValueError, match="fast_retries"):
        CABundleSyncer(FakeApiServer(), fast_retries=0)
    with pytest.raises(ValueError, match="kind"):
        WebhookConfigRef("other", "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        WebhookConfigRef("mutating", "")


def test_now_helper_is_aware() -> None:
    assert now().tzinfo is not None
