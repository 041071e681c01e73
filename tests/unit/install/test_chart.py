"""The Helm chart (charts/sidecarctl) installs what config/ installs, and its values do what they say.

- with default values `helm template` renders exactly the objects of `kubectl kustomize
  config/default`, and with `certificates.mode=cert-manager` those of config/certmanager: object by
  object, field by field. config/ is the source of truth; when it changes, the failure lists every
  object and field path that differs, with both values, so the change can be mirrored in the chart;
- each value changes exactly the fields it names and nothing else (a diff against the default
  render), and the manager flags it sets parse with the real `sidecarctl run` parser;
- `helm lint --strict` reports no warning or error.

`helm install` on the real node is tests/node/test_helm_node.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.kube import helm
from tests.kube.helm import CHART, CONFIG, Obj
from tests.unit.install.test_manifests import parse_run

Key = tuple[str, str, str]
ABSENT = "<absent>"


@pytest.fixture(scope="module", autouse=True)
def binaries() -> None:
    helm.require("helm", "kubectl", checking="the chart")


def keyed(objs: list[Obj]) -> dict[Key, Obj]:
    out: dict[Key, Obj] = {}
    for o in objs:
        meta = o.get("metadata") or {}
        k = (str(o.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))
        assert k not in out, f"{describe(k)} rendered twice"
        out[k] = o
    return out


def describe(k: Key) -> str:
    kind, ns, name = k
    return f"{kind} {ns + '/' if ns else ''}{name}"


def _show(value: Any) -> str:
    text = ABSENT if value is ABSENT else json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."


def field_diff(left: Any, right: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every (JSON pointer, left value, right value) where the two differ, deepest first found."""
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        for k in sorted(set(left) | set(right)):
            sub = f"{path}/{str(k).replace('~', '~0').replace('/', '~1')}"
            yield from field_diff(left.get(k, ABSENT), right.get(k, ABSENT), sub)
    elif isinstance(left, list) and isinstance(right, list):
        for i in range(max(len(left), len(right))):
            yield from field_diff(
                left[i] if i < len(left) else ABSENT, right[i] if i < len(right) else ABSENT, f"{path}/{i}"
            )
    elif left != right or (type(left) is not type(right) and not (_number(left) and _number(right))):
        yield path or "/", left, right


def _number(value: Any) -> bool:
    """YAML's 3 and 3.0 are one value to the API server; a bool or a string is not a number."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def object_diff(config: dict[Key, Obj], chart: dict[Key, Obj]) -> dict[Key, list[tuple[str, Any, Any]]]:
    """Per object, the fields that differ; an object on one side only is one entry at path ''."""
    out: dict[Key, list[tuple[str, Any, Any]]] = {}
    for k in sorted(set(config) | set(chart)):
        if k not in chart:
            out[k] = [("", config[k], ABSENT)]
        elif k not in config:
            out[k] = [("", ABSENT, chart[k])]
        elif fields := list(field_diff(config[k], chart[k])):
            out[k] = fields
    return out


def explain(
    diff: Mapping[Key, list[tuple[str, Any, Any]]],
    config_name: str,
    render: str,
    sources: Mapping[Key, str] | None = None,
) -> str:
    """The failure message: per object (and the files it comes from), each differing field."""
    sources = sources or {}
    lines = [f"charts/sidecarctl ({render}) does not render the objects of {config_name} (kubectl kustomize):"]
    for k, fields in diff.items():
        origin = f" [{sources[k]}]" if k in sources else ""
        if fields[0][0] == "":
            where = config_name if fields[0][2] is ABSENT else "the chart"
            todo = "add a template to" if where == config_name else "remove it from (or add it to config/)"
            lines.append(f"  {describe(k)}{origin}: only in {where}; {todo} charts/sidecarctl/templates")
            continue
        lines.append(f"  {describe(k)}{origin}:")
        for path, want, got in fields:
            lines.append(f"    {path}: {config_name} {_show(want)}  |  chart {_show(got)}")
    lines.append("config/ is the source of truth: mirror the change in charts/sidecarctl/templates.")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def default_render() -> dict[Key, Obj]:
    return keyed(helm.helm_template())


def changed(args: list[str], default_render: dict[Key, Obj]) -> dict[str, dict[str, tuple[Any, Any]]]:
    """What a render with `args` changes against the default render: {object: {path: (old, new)}}."""
    diff = object_diff(default_render, keyed(helm.helm_template(*args)))
    return {describe(k): {p: (a, b) for p, a, b in fields} for k, fields in diff.items()}


def deployment(objs: Mapping[Key, Obj]) -> Obj:
    return objs[("Deployment", "sidecarctl-system", "sidecarctl")]


# ---------------------------------------------------------------------------------------------
# Same objects as config/


@pytest.mark.parametrize(
    ("overlay", "args"),
    [("default", []), ("certmanager", ["--set", "certificates.mode=cert-manager"])],
    ids=["config-default", "config-certmanager"],
)
def test_the_chart_renders_exactly_the_objects_of_config(overlay: str, args: list[str]) -> None:
    config = keyed(helm.kustomize(CONFIG / overlay))
    chart = keyed(helm.helm_template(*args))
    assert len(config) >= 14, sorted(config)  # the install is not empty (a broken render would be)
    diff = object_diff(config, chart)
    if diff:
        sources = {**helm.config_sources(CONFIG / "default"), **helm.config_sources(CONFIG / overlay)}
        for k, chart_file in helm.template_sources(*args).items():
            sources[k] = f"{sources[k]} -> {chart_file}" if k in sources else chart_file
        render = "helm template, default values" + (f" and {' '.join(args[1:])}" if args else "")
        pytest.fail(explain(diff, f"config/{overlay}", render, sources), pytrace=False)


def test_the_comparison_names_each_differing_field() -> None:
    """The failure message above must point at the field: a changed rule, an added object."""
    config = keyed(helm.kustomize(CONFIG / "default"))
    role_key = ("ClusterRole", "", "sidecarctl")
    chart = {k: json.loads(json.dumps(v)) for k, v in config.items()}
    chart[role_key]["rules"][0]["verbs"].append("get")
    del chart[("Service", "sidecarctl-system", "sidecarctl-metrics")]
    text = explain(object_diff(config, chart), "config/default", "test")
    assert 'ClusterRole sidecarctl:\n    /rules/0/verbs/2: config/default <absent>  |  chart "get"' in text, text
    assert "Service sidecarctl-system/sidecarctl-metrics: only in config/default; add a template to" in text, text


def test_the_crd_is_config_crd_itself() -> None:
    for crd_file in ("sidecarctl.io_sidecarsets.yaml", "sidecarctl.io_namespacedsidecarsets.yaml"):
        link = CHART / "files" / crd_file
        assert link.is_symlink() and link.resolve() == (CONFIG / "crd" / crd_file).resolve()


def test_helm_lint_is_clean() -> None:
    proc = helm.run("helm", "lint", "--strict", str(CHART))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


# ---------------------------------------------------------------------------------------------
# Values


def test_image_values_set_the_manager_image(default_render: dict[Key, Obj]) -> None:
    args = ["--set", "image.repository=registry.example/sidecarctl", "--set", "image.tag=0.2.0"]
    args += ["--set", "image.pullPolicy=Always"]
    base = "/spec/template/spec/containers/0"
    assert changed(args, default_render) == {
        "Deployment sidecarctl-system/sidecarctl": {
            f"{base}/image": ("sidecarctl:0.1.0", "registry.example/sidecarctl:0.2.0"),
            f"{base}/imagePullPolicy": ("IfNotPresent", "Always"),
        }
    }


def test_replicas_and_resources(default_render: dict[Key, Obj]) -> None:
    args = ["--set", "replicas=3", "--set", "resources.limits.cpu=2", "--set", "resources.requests.memory=256Mi"]
    res = "/spec/template/spec/containers/0/resources"
    assert changed(args, default_render) == {
        "Deployment sidecarctl-system/sidecarctl": {
            "/spec/replicas": (2, 3),
            f"{res}/limits/cpu": ("1", 2),
            f"{res}/requests/memory": ("128Mi", "256Mi"),
        }
    }


@pytest.mark.parametrize(
    ("values", "flag"),
    [
        (["--set", "webhook.enableHTTP2=true"], "--enable-http2"),
        (["--set", "webhook.workers=3"], "--webhook-workers=3"),
    ],
    ids=["http2", "workers"],
)
def test_http2_and_workers_add_their_flag(
    values: list[str], flag: str, default_render: dict[Key, Obj], monkeypatch: pytest.MonkeyPatch
) -> None:
    args_path = "/spec/template/spec/containers/0/args"
    n = len(deployment(default_render)["spec"]["template"]["spec"]["containers"][0]["args"])
    assert changed(values, default_render) == {
        "Deployment sidecarctl-system/sidecarctl": {f"{args_path}/{n}": (ABSENT, flag)}
    }
    container = deployment(keyed(helm.helm_template(*values)))["spec"]["template"]["spec"]["containers"][0]
    parsed = parse_run(container, "sidecarctl-system", monkeypatch)
    default_parsed = parse_run(
        deployment(default_render)["spec"]["template"]["spec"]["containers"][0], "sidecarctl-system", monkeypatch
    )
    before = (default_parsed.enable_http2, default_parsed.webhook_workers)
    assert (parsed.enable_http2, parsed.webhook_workers) != before
    assert parsed.enable_http2 == (flag == "--enable-http2")
    assert parsed.webhook_workers == (3 if flag.startswith("--webhook-workers") else default_parsed.webhook_workers)


def test_namespace_selector_terms_only_narrow_the_injection_selector(
    tmp_path: Path, default_render: dict[Key, Obj]
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        json.dumps(
            {
                "webhook": {
                    "namespaceSelector": {
                        # sidecar-injection cannot be switched to another value: the manager
                        # injects only where it is `enabled`.
                        "matchLabels": {"team": "payments", "sidecar-injection": "disabled"},
                        "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}],
                    }
                }
            }
        )
    )
    sel = "/webhooks/0/namespaceSelector"
    assert changed(["-f", str(values)], default_render) == {
        "MutatingWebhookConfiguration sidecarctl-injector": {
            f"{sel}/matchLabels/team": (ABSENT, "payments"),
            f"{sel}/matchExpressions/1": (ABSENT, {"key": "env", "operator": "In", "values": ["prod"]}),
        }
    }


def test_cert_manager_mode_and_a_bad_mode(default_render: dict[Key, Obj]) -> None:
    objs = keyed(helm.helm_template("--set", "certificates.mode=cert-manager"))
    assert {k[0] for k in set(objs) - set(default_render)} == {"Issuer", "Certificate"}
    proc = helm.run("helm", "template", "sidecarctl", str(CHART), "--set", "certificates.mode=vault")
    assert proc.returncode != 0
    assert 'certificates.mode must be self-signed or cert-manager, not "vault"' in proc.stderr


def test_another_namespace_moves_every_reference(default_render: dict[Key, Obj]) -> None:
    for mode in ("self-signed", "cert-manager"):
        args = ["--set", "installation.namespace=mesh-control", "--set", f"certificates.mode={mode}"]
        text = helm.ok(helm.run("helm", "template", "sidecarctl", str(CHART), *args))
        assert "sidecarctl-system" not in text, [line for line in text.splitlines() if "sidecarctl-system" in line]
        objs = keyed(helm.docs(text))
        mwc = objs[("MutatingWebhookConfiguration", "", "sidecarctl-injector")]["webhooks"][0]
        assert "mesh-control" in mwc["namespaceSelector"]["matchExpressions"][0]["values"]
        assert mwc["clientConfig"]["service"]["namespace"] == "mesh-control"
        assert ("Namespace", "", "mesh-control") in objs
    no_ns = keyed(helm.helm_template("--set", "installation.createNamespace=false"))
    assert set(default_render) - set(no_ns) == {("Namespace", "", "sidecarctl-system")}


def test_crd_values(default_render: dict[Key, Obj]) -> None:
    crd = ("CustomResourceDefinition", "", "sidecarsets.sidecarctl.io")
    tenant_crd = ("CustomResourceDefinition", "", "namespacedsidecarsets.sidecarctl.io")
    namespace = ("Namespace", "", "sidecarctl-system")
    keep = {"/metadata/annotations": (ABSENT, {"helm.sh/resource-policy": "keep"})}
    # The namespace too: it holds the parameter objects of the kept SidecarSets' policies, which would
    # refuse their pods without them.
    assert changed(["--set", "crds.keep=true"], default_render) == {
        describe(crd): keep,
        describe(tenant_crd): keep,
        describe(namespace): keep,
    }
    assert set(default_render) - set(keyed(helm.helm_template("--set", "crds.install=false"))) == {crd, tenant_crd}


def test_extra_args_env_and_scheduling(tmp_path: Path, default_render: dict[Key, Obj]) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        json.dumps(
            {
                "extraArgs": ["--lease-duration=20"],
                "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}],
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "imagePullSecrets": [{"name": "regcred"}],
            }
        )
    )
    pod = "/spec/template/spec"
    n = len(deployment(default_render)["spec"]["template"]["spec"]["containers"][0]["args"])
    assert changed(["-f", str(values)], default_render) == {
        "Deployment sidecarctl-system/sidecarctl": {
            f"{pod}/containers/0/args/{n}": (ABSENT, "--lease-duration=20"),
            f"{pod}/containers/0/env/1": (ABSENT, {"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}),
            f"{pod}/nodeSelector": (ABSENT, {"kubernetes.io/os": "linux"}),
            f"{pod}/tolerations": (ABSENT, [{"key": "dedicated", "operator": "Exists"}]),
            f"{pod}/imagePullSecrets": (ABSENT, [{"name": "regcred"}]),
        }
    }
