"""The v1beta1 golden cases mean what their v1alpha1 twins mean, and the manager sees them converted.

Each `v1beta1-*` case is a v1alpha1 case with its SidecarSets rewritten in v1beta1 (same input, same
namespaces): the expected output must be the twin's, byte for byte. The manager's store is fed by a
v1alpha1 watch, so it holds these SidecarSets as the API server hands them over, converted to
v1alpha1: through the webhook that way, each case must still give its expected pods.
"""

from __future__ import annotations

import dataclasses

import pytest

from sidecarsets.spec import names
from sidecarsets.spec.conversion import convert, is_v1beta1
from tests.golden_cases import GOLDEN_DIR, GoldenCase, cases, load
from tests.http.test_golden_webhook import test_webhook as through_the_webhook

TWINS = {
    "v1beta1-kruise-apiversion": "kruise-apiversion",
    "v1beta1-specific-namespace": "namespace-field",
    "v1beta1-namespace-selector": "namespace-selector",
}
V1BETA1_CASES = [c for c in cases() if c.name in TWINS]


def test_every_v1beta1_case_is_here_and_in_v1beta1() -> None:
    found = {c.name for c in cases() if any(is_v1beta1(o) for o in c.sidecarsets)}
    assert found == set(TWINS)
    assert all(is_v1beta1(o) for c in V1BETA1_CASES for o in c.sidecarsets)


@pytest.mark.parametrize("case", V1BETA1_CASES, ids=[c.name for c in V1BETA1_CASES])
def test_a_v1beta1_case_gives_its_v1alpha1_twin_s_bytes(case: GoldenCase) -> None:
    twin = load(GOLDEN_DIR / TWINS[case.name])
    for file in ("input.yaml", "expected.yaml"):
        assert (case.dir / file).read_bytes() == (twin.dir / file).read_bytes(), file
    assert case.namespace_labels == twin.namespace_labels and case.args == twin.args
    assert not any(is_v1beta1(o) for o in twin.sidecarsets)


@pytest.mark.parametrize("case", V1BETA1_CASES, ids=[c.name for c in V1BETA1_CASES])
def test_converted_as_the_manager_s_watch_sees_them(case: GoldenCase) -> None:
    stored = [convert(o, names.API_VERSION) for o in case.sidecarsets]
    through_the_webhook(dataclasses.replace(case, sidecarsets=stored))
