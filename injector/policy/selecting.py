"""CEL that says whether some of a set of SidecarSets could select a pod, sized for thousands of them.

Written into the pod webhook's matchCondition (the pods only the webhook can serve) and into each
policy's (the pods its SidecarSets could select). Both are evaluated for every pod of a labelled
namespace, and the API server parses at most 100,000 code points of CEL, so neither may grow by a
selector per SidecarSet: the usual one-label selectors become one constant-set lookup per label key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from injector.policy import cel
from sidecarsets.spec import names, podindex, selectors
from sidecarsets.spec.model import SidecarSet

# The API server parses CEL of at most 100,000 code points; past this much the condition is
# written with anchors (see `pods_selected`), and past it again the webhook is not narrowed.
MAX_CONDITION_CHARS = 95_000
# kube-apiserver type-checks a CEL expression in time that grows with the square of its length
# (cel-go's checker copies its type substitutions at every call it resolves), when the webhook
# configuration is written and again at the first pod after, which every pod in flight waits on.
# The webhook's exact condition for two-label selectors took 16 ms at 30 of them (2.6 KB), 133 ms
# at 100 (8.6 KB), 1,055 ms at 300 (26 KB); the same with anchors, 2-4 ms. Past this many characters
# of exact selectors the condition is written with anchors (`pods_selected(approximate=True)`).
MAX_EXACT_CHARS = 4_000
# Inside a webhook's matchCondition (no `variables` there): the pod's labels, bound once as `l`.
_BIND_LABELS = f"[{cel.LABELS}].exists(l, %s)"


def pods_selected(sidecarsets: Iterable[SidecarSet], *, approximate: bool = False) -> str:
    """CEL over a webhook request: some of `sidecarsets` could select the pod (never narrower than exact).

    Its size and cost must not grow with every SidecarSet's selector: SidecarSets selecting by one
    label (the usual `app: x` or `team: y`) are grouped by key into one set-membership test,
    `"team" in l && l["team"] in [...]`, which CEL evaluates as a hash lookup (a constant list). The
    rest keep their exact selector, with the namespace part when they name namespaces only (decided
    from the request's namespace). `approximate`: those too are reduced to one label their selector
    requires (sidecarsets.spec.podindex), grouped the same way; a SidecarSet that requires none
    makes the whole condition `true`.
    """
    grouped: dict[str, set[str]] = {}
    keys: set[str] = set()
    exact: dict[tuple[str, str], tuple[set[str], list[str]]] = {}  # by anchor (kind, key): its values, the terms
    active = [ss for ss in sidecarsets if not ss.injection_paused and not selectors.is_empty(ss.selector)]
    chosen = podindex.Anchors(ss.selector for ss in active)
    for ss in active:
        simple = _one_label(ss.selector or {}) if ss.namespace_selector is None else None
        if simple is not None:
            grouped.setdefault(simple[0], set()).update(simple[1])
            continue
        found = chosen.of(ss.selector)
        if approximate:
            if found is None:
                return "true"
            for _, key, value in found:
                if value is None:
                    keys.add(key)
                else:
                    grouped.setdefault(key, set()).add(value)
            continue
        term = cel.selector(ss.selector, "l")
        if ss.namespace_selector is not None and names_namespaces_only(ss):
            term += " && " + cel.selector(ss.namespace_selector, '{"kubernetes.io/metadata.name": request.namespace}')
        anchor = ("", "") if not found else (found[0][0], found[0][1])
        values, guarded = exact.setdefault(anchor, (set(), []))
        values.update(str(v) for _, _, v in found or () if v is not None)
        guarded.append(f"({term})")
    terms = [f"({cel.string(k)} in l)" for k in sorted(keys)]
    terms += [_in_test(key, grouped[key]) for key in sorted(grouped)]
    for (kind, key), (values, guarded) in sorted(exact.items()):
        # Many selectors of several labels (`{team: t7, tier: web}`) would each be evaluated for every
        # pod; behind one test of the label they are anchored on, a pod without it costs one lookup.
        body = " || ".join(guarded)
        if not kind:
            terms.append(body)
        else:
            guard = f"({cel.string(key)} in l)" if kind == "key" else _in_test(key, values)
            terms.append(f"({guard} && ({body}))")
    return _BIND_LABELS % " || ".join(terms) if terms else "false"


def _in_test(key: str, values: Iterable[str]) -> str:
    """CEL: the pod has label `key` with one of `values` (a hash lookup in a constant list)."""
    ordered = sorted(values)
    test = (
        f"l[{cel.string(key)}] == {cel.string(ordered[0])}"
        if len(ordered) == 1
        else f"l[{cel.string(key)}] in {cel.strings(ordered)}"
    )
    return f"({cel.string(key)} in l && {test})"


def _one_label(selector: Mapping[str, object]) -> tuple[str, list[str]] | None:
    """(key, values) when the selector is one label equal to one of some values, else None."""
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if isinstance(match_labels, Mapping) and len(match_labels) == 1 and not expressions:
        [(key, value)] = match_labels.items()
        return str(key), [str(value)]
    if not match_labels and isinstance(expressions, list) and len(expressions) == 1:
        e = expressions[0]
        if isinstance(e, Mapping) and e.get("operator") == "In" and e.get("values"):
            return str(e["key"]), [str(v) for v in e["values"]]
    return None


def names_namespaces_only(ss: SidecarSet) -> bool:
    """The SidecarSet's namespace selector reads the namespace name label alone."""
    sel = ss.namespace_selector or {}
    keys = set(sel.get("matchLabels") or {}) | {e.get("key") for e in sel.get("matchExpressions") or []}
    return keys <= {names.NS_NAME_LABEL}
