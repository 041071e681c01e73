"""The parameter objects' keys: valid annotation names, one per value, readable where they can be."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from injector.policy import params

# kube-apiserver's qualified name: an optional DNS-subdomain prefix, then the name part checked here.
NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
DNS_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
SUBDOMAIN = st.lists(DNS_LABEL, min_size=1, max_size=12).map(".".join)


def test_a_short_key_stays_readable() -> None:
    assert params.key_name("mesh:image:proxy", {}) == "mesh_image_proxy"
    assert params.key_name("team-a/mesh:hash", {}) == "team-a_mesh_hash"


def test_two_keys_that_read_alike_get_two_names() -> None:
    """A SidecarSet `ns` with a container `hash` and a NamespacedSidecarSet `ns/image` read alike."""
    taken: dict[str, str] = {}
    first = params.key_name("ns:image:hash", taken)
    taken[first] = "ns:image:hash"
    second = params.key_name("ns/image:hash", taken)
    assert first != second and NAME.fullmatch(second) and len(second) <= 63
    assert params.key_name("ns:image:hash", taken) == first, "the same key keeps its name"


@given(SUBDOMAIN, DNS_LABEL, st.sampled_from(["image", "hash", "revision"]))
def test_every_key_is_a_valid_annotation_name(sidecarset: str, container: str, what: str) -> None:
    key = f"{sidecarset}:image:{container}" if what == "image" else f"{sidecarset}:{what}"
    name = params.key_name(key, {})
    assert NAME.fullmatch(name) and len(name) <= 63, name
    # Behind the prefix a policy's CEL version gives it (12 hex digits, a DNS label).
    assert len(f"0123456789ab/{name}") <= 253 + 1 + 63


def test_the_object_holds_its_values_as_template_annotations() -> None:
    obj = params.parameter_object("sidecarctl-injection-0", "sidecarctl-system", {"v/a": "1"}, {"l": "x"})
    assert obj["kind"] == "PodTemplate" and obj["metadata"]["namespace"] == "sidecarctl-system"
    assert params.values(obj) == {"v/a": "1"}
    changed = params.with_values(obj, {"v/b": "2"})
    assert params.values(changed) == {"v/b": "2"} and params.values(obj) == {"v/a": "1"}
    assert changed["template"]["spec"] == obj["template"]["spec"]
