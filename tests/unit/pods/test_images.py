"""sidecarsets.pods.podstate.same_image: which rewrites of a sidecar's image by another admission
step (a digest-pinning webhook) still count as the image the SidecarSet asks for."""

from __future__ import annotations

import pytest

from sidecarsets.pods.podstate import same_image
from sidecarsets.pods.projection import project
from sidecarsets.rollout import hotupgrade
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

D = "sha256:" + "a" * 64
E = "sha256:" + "b" * 64


@pytest.mark.parametrize(
    ("in_pod", "wanted", "same"),
    [
        ("proxy:2", "proxy:2", True),
        (f"proxy:2@{D}", "proxy:2", True),  # a digest added to the tag
        (f"docker.io/library/proxy:2@{D}", "proxy:2", True),  # and the name written out
        (f"proxy@{D}", "proxy:2", True),  # a digest-only reference to the same repository
        (f"proxy:1@{D}", "proxy:2", False),  # the digest of another tag
        ("proxy:1", "proxy:2", False),
        (f"mirror.example/proxy:2@{D}", "proxy:2", False),  # another repository: a mirror
        (f"proxy:2@{D}", f"proxy:2@{D}", True),
        (f"proxy:2@{E}", f"proxy:2@{D}", False),  # pinned by the SidecarSet: the digest decides
        ("proxy", "proxy:latest", True),
        (None, "proxy:2", False),
    ],
)
def test_rewrites_that_keep_the_image(in_pod: str | None, wanted: str, same: bool) -> None:
    assert same_image(in_pod, wanted) is same


def test_a_pinned_empty_image_still_counts_as_the_empty_image_of_a_hotupgrade_pair() -> None:
    obj = builders.sidecarset(
        "hot",
        containers=[
            builders.container(
                "envoy", "envoy:2", upgradeStrategy={"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "empty:1"}
            )
        ],
    )
    raw = builders.injected_pod("p", obj)
    for c in raw["spec"]["containers"]:
        c["image"] += f"@{D}"  # a pinner rewrote every image of the pod
    pod, ss = project(raw), SidecarSet.from_object(obj)
    assert hotupgrade.empties_done(pod, ss), "the idle container runs the (pinned) empty image"
    assert not hotupgrade.in_hot_upgrade(pod, ss)
