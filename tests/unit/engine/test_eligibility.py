"""Which pods are candidates for injection at all (the contract's table), alone and through the engine."""

from __future__ import annotations

from typing import Any

import pytest

from injector.engine import eligibility, engine
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

ENABLED = {names.NS_INJECTION_LABEL: names.NS_INJECTION_ENABLED}


def pod(*, status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    """The default pod; `meta` replaces metadata fields (`labels=...`, `deletionTimestamp=...`)."""
    return builders.pod(containers=[builders.container("app", "app")], metadata=meta, status=status)


def reason(p: dict[str, Any], **kw: Any) -> str | None:
    args: dict[str, Any] = {
        "namespace": "shop",
        "namespace_labels": ENABLED,
        "operation": "CREATE",
        "manager_namespace": names.DEFAULT_MANAGER_NAMESPACE,
        "require_namespace_label": True,
    }
    args.update(kw)
    return eligibility.skip_reason(p, **args)


@pytest.mark.parametrize(
    ("p", "kw", "expected"),
    [
        (pod(), {}, None),
        (pod(), {"namespace_labels": None}, eligibility.SKIP_NAMESPACE_NOT_LABELLED),
        (pod(), {"namespace_labels": {}}, eligibility.SKIP_NAMESPACE_NOT_LABELLED),
        (pod(), {"namespace_labels": {names.NS_INJECTION_LABEL: "true"}}, eligibility.SKIP_NAMESPACE_NOT_LABELLED),
        (pod(), {"namespace_labels": {names.NS_INJECTION_LABEL: "Enabled"}}, eligibility.SKIP_NAMESPACE_NOT_LABELLED),
        (pod(), {"namespace_labels": None, "require_namespace_label": False}, None),
        (pod(), {"namespace": "kube-system"}, eligibility.SKIP_SYSTEM_NAMESPACE),
        (pod(), {"namespace": "kube-public"}, eligibility.SKIP_SYSTEM_NAMESPACE),
        (pod(), {"namespace": "kube-node-lease"}, eligibility.SKIP_SYSTEM_NAMESPACE),
        (pod(), {"namespace": names.DEFAULT_MANAGER_NAMESPACE}, eligibility.SKIP_SYSTEM_NAMESPACE),
        (pod(), {"namespace": "mesh-system", "manager_namespace": "mesh-system"}, eligibility.SKIP_SYSTEM_NAMESPACE),
        (pod(), {"namespace": "kube-system", "require_namespace_label": False}, eligibility.SKIP_SYSTEM_NAMESPACE),
        (pod(labels={names.POD_INJECT_LABEL: "false"}), {}, eligibility.SKIP_OPTED_OUT),
        (pod(labels={names.POD_INJECT_LABEL: "true"}), {}, None),
        (pod(labels={names.POD_INJECT_LABEL: "false"}), {"require_namespace_label": False}, eligibility.SKIP_OPTED_OUT),
        # The opt-out is a label; an annotation of the same name does not count.
        (pod(annotations={names.POD_INJECT_LABEL: "false"}), {}, None),
        (pod(deletionTimestamp="2024-01-01T00:00:00Z"), {}, eligibility.SKIP_INACTIVE),
        (pod(status={"phase": "Succeeded"}), {}, eligibility.SKIP_INACTIVE),
        (pod(status={"phase": "Failed"}), {}, eligibility.SKIP_INACTIVE),
        (pod(status={"phase": "Pending"}), {}, None),
        (pod(), {"operation": "UPDATE"}, eligibility.SKIP_OPERATION),
        (pod(), {"operation": "DELETE"}, eligibility.SKIP_OPERATION),
    ],
)
def test_skip_reason(p: dict[str, Any], kw: dict[str, Any], expected: str | None) -> None:
    assert reason(p, **kw) == expected


def test_skip_reason_tolerates_malformed_metadata() -> None:
    assert reason({"metadata": "x", "status": []}) is None
    assert reason({"metadata": {"labels": ["x"]}}) is None


def test_engine_applies_the_policy_before_matching() -> None:
    ss = SidecarSet.from_object(builders.sidecarset("mesh", containers=[builders.container("p", "p")]))
    common: dict[str, Any] = {"sidecarsets": [ss], "now": "2024-01-01T00:00:00Z"}
    assert engine.inject(pod(), namespace="shop", namespace_labels=ENABLED, **common).injected == ("mesh",)
    skipped = engine.inject(pod(), namespace="shop", namespace_labels={}, **common)
    assert (skipped.patch, skipped.skipped) == ([], eligibility.SKIP_NAMESPACE_NOT_LABELLED)
    unlabelled_cli = engine.inject(
        pod(), namespace="shop", namespace_labels=None, require_namespace_label=False, **common
    )
    assert unlabelled_cli.injected == ("mesh",)
    opted_out = engine.inject(
        pod(labels={"app": "web", names.POD_INJECT_LABEL: "false"}),
        namespace="shop",
        namespace_labels=ENABLED,
        require_namespace_label=False,
        **common,
    )
    assert opted_out.skipped == eligibility.SKIP_OPTED_OUT
    # An empty request namespace means `default`, which is not a system namespace.
    assert engine.inject(pod(), namespace="", namespace_labels=ENABLED, **common).injected == ("mesh",)
