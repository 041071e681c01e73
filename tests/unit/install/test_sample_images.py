"""The demo on a real node runs config/samples from busybox stand-ins (no registry is reachable):
every image the samples name must have one, and the proxy the demo rolls to as well."""

from __future__ import annotations

import yaml

from tests.kube import images


def test_every_image_of_the_samples_has_a_stand_in() -> None:
    named = set()
    for path in sorted(images.SAMPLES.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        named |= {line.split("image:", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("image:")}
        assert all(d is None or isinstance(d, dict) for d in yaml.safe_load_all(text))
    refs = {s.ref for s in images.sample_catalog()}
    assert named, "config/samples names no image"
    assert named <= refs, f"no stand-in for {sorted(named - refs)} (tests/kube/images.py sample_catalog)"
    assert images.next_patch_version(images.sample_images()["proxy"]) in refs


def test_next_patch_version() -> None:
    assert images.next_patch_version("docker.io/envoyproxy/envoy:v1.32.3") == "docker.io/envoyproxy/envoy:v1.32.4"
    assert images.next_patch_version("registry:5000/proxy:1.9.9") == "registry:5000/proxy:1.9.10"
