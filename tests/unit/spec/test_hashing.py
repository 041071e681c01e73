"""SidecarSet hashes: canonical (defaults, key order), image-sensitive or not, and total on odd input."""

from __future__ import annotations

from sidecarsets.spec.hashing import spec_hash, spec_hash_without_image


def test_same_sidecarset_from_a_file_or_from_the_api_server_hashes_the_same() -> None:
    from_file = {"containers": [{"name": "proxy", "image": "proxy:1"}]}
    from_server = {
        "containers": [
            {
                "upgradeStrategy": {"upgradeType": "ColdUpgrade"},
                "shareVolumePolicy": {"type": "disabled"},
                "podInjectPolicy": "BeforeAppContainer",
                "image": "proxy:1",
                "name": "proxy",
            }
        ]
    }
    assert spec_hash(from_file) == spec_hash(from_server)
    assert spec_hash_without_image(from_file) == spec_hash_without_image(from_server)


def test_image_changes_only_the_image_sensitive_hash() -> None:
    a = {"containers": [{"name": "proxy", "image": "proxy:1"}]}
    b = {"containers": [{"name": "proxy", "image": "proxy:2"}]}
    assert spec_hash(a) != spec_hash(b)
    assert spec_hash_without_image(a) == spec_hash_without_image(b)
    env = {"containers": [{"name": "proxy", "image": "proxy:1", "env": [{"name": "X", "value": "1"}]}]}
    assert spec_hash_without_image(a) != spec_hash_without_image(env)


def test_plain_init_containers_and_volumes_are_not_hashed_but_native_sidecars_are() -> None:
    base = {"containers": [{"name": "proxy", "image": "p:1"}]}
    plain_init = {**base, "initContainers": [{"name": "init", "image": "i:1"}], "volumes": [{"name": "v"}]}
    native = {**base, "initContainers": [{"name": "init", "image": "i:1", "restartPolicy": "Always"}]}
    assert spec_hash(base) == spec_hash(plain_init)
    assert spec_hash(base) != spec_hash(native)


def test_hashes_use_the_kruise_alphabet_and_never_crash_on_odd_values() -> None:
    huge = {"containers": [{"name": "p", "image": "p:1", "securityContext": {"runAsUser": 2**70}}]}
    value = spec_hash(huge)
    assert len(value) == 64 and set(value) <= set("bcdfghjklmnpqrstvwxz2456789")
    assert spec_hash(huge) != spec_hash({"containers": [{"name": "p", "image": "p:1"}]})
