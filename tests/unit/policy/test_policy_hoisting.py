"""Pieces of CEL several groups of a policy write alike are policy variables (injector.policy.hoisting).

What the policies do to pods is compared with the webhook by the differential tier against a real
API server; here: what is hoisted, what stays in its group, and the order the policy defines them in.
"""

from __future__ import annotations

from typing import Any

from injector.policy import bundle, cel, generate, hoisting
from injector.policy.build import V
from sidecarsets.spec.model import SidecarSet
from tests.kube import builders

TS = "2024-01-01T00:00:00Z"
NS = "sidecarctl-system"
BIG = "object.spec.containers.map(c, c.name)" + " + []" * 60  # longer than MIN_CHARS


def test_a_piece_two_groups_write_alike_is_defined_once_and_each_reads_it() -> None:
    a = [("env", BIG), ("c", f'{{"image": "a", "env": {V}env}}')]
    b = [("env", BIG), ("c", f'{{"image": "b", "env": {V}env}}')]
    defined, replaced = hoisting.common([a, b])
    assert [e for _, e in defined] == [BIG]
    (name,) = (n for n, _ in defined)
    assert replaced == [{"env": name}, {"env": name}], "the groups' own containers differ: they stay"
    assert cel.renamed_variables(a[1][1], replaced[0]) == f'{{"image": "a", "env": {V}{name}}}'


def test_short_pieces_a_single_group_and_pieces_reading_their_group_stay() -> None:
    short = [("names", '["proxy"]')]
    assert hoisting.common([short, short]) == ([], [{}, {}])
    assert hoisting.common([[("env", BIG)]]) == ([], [{}])
    a = [("img", '"a"'), ("c", f"[{V}img] + {BIG}")]
    b = [("img", '"b"'), ("c", f"[{V}img] + {BIG}")]
    assert hoisting.common([a, b]) == ([], [{}, {}]), "alike text, but each reads its own image"


def test_a_hoisted_piece_takes_what_it_reads_and_is_defined_after_it() -> None:
    group = [("names", '["proxy"]'), ("env", f"{BIG}.filter(n, !(n in {V}names))")]
    defined, replaced = hoisting.common([group, list(group)])
    (names_var, names_text), (env_var, env_text) = defined
    assert names_text == '["proxy"]' and env_text == f"{BIG}.filter(n, !(n in {V}{names_var}))"
    assert replaced[0] == replaced[1] == {"names": names_var, "env": env_var}


def _sidecarset(name: str, team: str) -> SidecarSet:
    proxy: dict[str, Any] = builders.container("proxy", "proxy:1")
    proxy["transferEnv"] = [{"sourceContainerName": "app", "envNames": ["LOG_LEVEL", "REGION"]}]
    return SidecarSet.from_object(
        builders.sidecarset(name, selector={"matchLabels": {"team": team}}, containers=[proxy])
    )


def test_sidecarsets_stamped_from_one_template_share_their_transferred_env_in_the_policy() -> None:
    sets = [_sidecarset(f"s{k}", f"t{k}") for k in range(3)]
    parts = [generate.parts([s], timestamp=TS, manager_namespace=NS) for s in sets]
    g = bundle.policy("p", parts, manager_namespace=NS)
    variables = {v["name"]: v["expression"] for v in g.policy["spec"]["variables"]}
    copying = [n for n, e in variables.items() if '["LOG_LEVEL", "REGION"]' in e]
    assert len(copying) == 1 and copying[0].startswith("h"), "one definition of the env copying"
    groups = [e for n, e in variables.items() if n.startswith("groups")]
    assert len(groups) == 3 and all(V + copying[0] in e for e in groups), "each of the three groups reads it"
    order = list(variables)
    assert order.index(copying[0]) < min(order.index(n) for n in variables if n.startswith("groups"))
