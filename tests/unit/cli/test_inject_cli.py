"""`sidecarctl inject` as a user runs it: a child process, real files, stdin, stdout and stderr.

One test (or a few) per promise of the README's "Manual injection": mixed manifest directories,
repeated -f, -n, deterministic output, revision pins from ControllerRevision files, Kruise's
transferEnv, the libyaml and pure-Python paths giving the same bytes, untouched documents copied
as their text, the warnings (each once), kinds matched by API group and --kind-template, and the
errors and exit statuses (0 done, 1 bad input, 2 usage), broken pipes and full disks included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecarsets.spec import names, revisions
from sidecarsets.spec.model import SidecarSet
from tests.kube.builders import container, sidecarset

REPO = Path(__file__).resolve().parents[3]
SAMPLES = REPO / "config" / "samples"
NOW = "2024-01-01T00:00:00Z"
# A child whose PyYAML has no libyaml: the pure-Python fallback, through the same entry point.
PURE = (
    "import sys; sys.modules['yaml._yaml'] = None; from sidecarctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
)

Obj = dict[str, Any]


def sidecarctl(
    *args: str, stdin: bytes | None = None, pure: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-c", PURE] if pure else [sys.executable, "-m", "sidecarctl.cli.main"]
    child_env = {k: v for k, v in os.environ.items() if k != "SIDECARCTL_NOW"}
    child_env.update(env or {})
    return subprocess.run(
        [*argv, *args], input=stdin, capture_output=True, cwd=REPO, env=child_env, timeout=120, check=False
    )


def ok(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 0, done.stderr.decode()
    assert b"Traceback" not in done.stderr
    return done.stdout.decode()


def failed(done: subprocess.CompletedProcess[bytes], code: int = 1) -> str:
    err = done.stderr.decode()
    assert done.returncode == code, (done.returncode, err)
    assert "Traceback" not in err
    assert done.stdout == b""
    return err


def warnings(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    return [line for line in done.stderr.decode().splitlines() if line.startswith("warning: ")]


def write(path: Path, *docs: Any) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return path


def docs(text: str) -> list[Any]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def deployment(name: str, *, namespace: str | None = "shop", labels: dict[str, str] | None = None, **spec: Any) -> Obj:
    meta: Obj = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    pod_labels = labels or {"app": "web"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {"containers": [container("app", "nginx:1.27")], **spec},
            },
        },
    }


def pod_spec(doc: Obj) -> Obj:
    template: Obj = doc["spec"]["template"]["spec"]
    return template


def names_of(items: Sequence[Obj]) -> list[str]:
    return [str(c["name"]) for c in items]


MESH = sidecarset("mesh", containers=[container("proxy", "envoy:1")], selector={"matchLabels": {"app": "web"}})


@pytest.fixture
def mesh(tmp_path: Path) -> Path:
    return write(tmp_path / "mesh.yaml", MESH)


# ---------------------------------------------------------------------------------------------
# --sidecarset takes mixed manifests; -f is repeatable and takes directories and stdin; -n


def test_the_readme_command_on_the_samples_directory() -> None:
    done = sidecarctl("inject", "-f", "config/samples/05-demo-deployment.yaml", "--sidecarset", "config/samples/")
    (deployment_out,) = docs(ok(done))
    spec = pod_spec(deployment_out)
    # mesh-proxy selects namespaces labelled for injection: 01-demo-namespace.yaml says demo-shop is.
    assert names_of(spec["initContainers"]) == ["proxy-init"]
    assert names_of(spec["containers"]) == ["proxy", "app", "log-agent"]
    notes = [line for line in done.stderr.decode().splitlines() if line]
    assert notes == [
        "note: ConfigMap demo-shop/mesh-proxy-bootstrap (config/samples/02-mesh-proxy-bootstrap.yaml), "
        "Deployment demo-shop/shop (config/samples/05-demo-deployment.yaml): not a SidecarSet or Namespace: "
        "ignored by --sidecarset"
    ]


def test_repeated_f_directories_and_stdin_are_all_injected_in_order(tmp_path: Path, mesh: Path) -> None:
    first = write(tmp_path / "a.yaml", deployment("a"))
    folder = tmp_path / "more"
    folder.mkdir()
    write(folder / "b.yml", deployment("b"))
    write(folder / "c.json", deployment("c"))
    (folder / "README.md").write_text("not a manifest\n")
    stdin = yaml.safe_dump(deployment("d")).encode()
    out = ok(
        sidecarctl("inject", "-f", str(first), "-f", str(folder), "-f", "-", "--sidecarset", str(mesh), stdin=stdin)
    )
    got = docs(out)
    assert [d["metadata"]["name"] for d in got] == ["a", "b", "c", "d"]
    assert all(names_of(pod_spec(d)["containers"]) == ["proxy", "app"] for d in got)
    assert out.count("\n---\n") == 3


def test_namespace_flag_scopes_objects_that_name_none(tmp_path: Path) -> None:
    scoped = sidecarset(
        "mesh",
        containers=[container("proxy", "envoy:1")],
        selector={"matchLabels": {"app": "web"}},
        namespace_selector={"matchLabels": {"mesh": "on"}},
    )
    ss = write(
        tmp_path / "ss.yaml",
        scoped,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop", "labels": {"mesh": "on"}}},
    )
    src = write(tmp_path / "d.yaml", deployment("web", namespace=None))
    in_shop = docs(ok(sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss), "-n", "shop")))[0]
    assert names_of(pod_spec(in_shop)["containers"]) == ["proxy", "app"]
    assert "namespace" not in in_shop["metadata"], "-n is used for matching, the object is not changed"
    elsewhere = sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss), "-n", "other")
    assert src.read_text() == ok(elsewhere), "not selected in namespace other: written back as it was"
    assert any("labels of namespace other are not known" in w for w in warnings(elsewhere))


# ---------------------------------------------------------------------------------------------
# Deterministic output


def test_output_is_the_same_on_every_run_and_its_time_comes_from_the_sidecarset(tmp_path: Path) -> None:
    exported = sidecarset("mesh", containers=[container("proxy", "envoy:1")], selector={"matchLabels": {"app": "web"}})
    exported["metadata"].update(
        creationTimestamp="2024-02-03T04:05:06Z",
        managedFields=[
            {"manager": "kubectl", "operation": "Update", "time": "2024-03-01T08:00:00Z"},
            {"manager": "sidecarctl", "operation": "Update", "subresource": "status", "time": "2025-01-01T00:00:00Z"},
        ],
    )
    hand_written = sidecarset(
        "logs",
        containers=[container("log", "fluent-bit:3", podInjectPolicy="AfterAppContainer")],
        selector={"matchLabels": {"app": "web"}},
    )
    ss = write(tmp_path / "ss.yaml", exported, hand_written)
    src = write(tmp_path / "d.yaml", deployment("web"))
    runs = [sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss)) for _ in range(2)]
    assert runs[0].stdout == runs[1].stdout
    again = sidecarctl("inject", "-f", "-", "--sidecarset", str(ss), stdin=runs[0].stdout)
    assert (again.stdout, again.stderr) == (runs[0].stdout, b""), "its own output is left as it is"
    annotations = pod_annotations(docs(ok(runs[0]))[0])
    stamps = {name: entry["updateTimestamp"] for name, entry in json.loads(annotations[names.ANN_HASH]).items()}
    # The last change to the object itself (not its status); a file without times gives the epoch.
    assert stamps == {"mesh": "2024-03-01T08:00:00Z", "logs": "1970-01-01T00:00:00Z"}
    fixed = docs(ok(sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss), "--timestamp", NOW)))[0]
    assert {e["updateTimestamp"] for e in json.loads(pod_annotations(fixed)[names.ANN_HASH]).values()} == {NOW}
    from_env = sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss), env={"SIDECARCTL_NOW": NOW})
    assert from_env.stdout == sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss), "--timestamp", NOW).stdout


def pod_annotations(doc: Obj) -> dict[str, str]:
    annotations: dict[str, str] = doc["spec"]["template"]["metadata"]["annotations"]
    return annotations


# ---------------------------------------------------------------------------------------------
# Revision pins from ControllerRevisions


def _old_revision() -> tuple[Obj, str]:
    """The ControllerRevision the manager stored for mesh at envoy:1 (labelled customVersion v1)."""
    old = sidecarset("mesh", containers=[container("proxy", "envoy:1")], selector={"matchLabels": {"app": "web"}})
    old["metadata"]["uid"] = "0b0e7c1e-0000-4000-8000-000000000001"
    model = SidecarSet.from_object(old)
    name = revisions.revision_name("mesh", revisions.revision_hash(revisions.revision_data(model)))
    revision = revisions.new_revision(model, name=name, number=1)
    revision["metadata"].update(namespace=names.DEFAULT_MANAGER_NAMESPACE, creationTimestamp="2024-04-01T00:00:00Z")
    revision["metadata"]["labels"][names.SS_LABEL_CUSTOM_VERSION] = "v1"
    return revision, name


REVISION_NAME = _old_revision()[1]


def _pinned_setup(tmp_path: Path, pin: Obj, **strategy: Any) -> tuple[Path, Path]:
    """SidecarSet mesh at envoy:2 pinning `pin`, and its revisions as `kubectl get -o yaml` prints them."""
    current = sidecarset(
        "mesh",
        containers=[container("proxy", "envoy:2")],
        selector={"matchLabels": {"app": "web"}},
        injectionStrategy={"revision": pin},
        **strategy,
    )
    other = {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {"name": "web-5d8f", "namespace": "shop"},
        "revision": 3,
    }
    items = [_old_revision()[0], other]
    revs = write(tmp_path / "revisions.yaml", {"apiVersion": "v1", "kind": "List", "items": items})
    return write(tmp_path / "mesh.yaml", current), revs


def _proxy_image(doc: Obj) -> str:
    return str(next(c["image"] for c in pod_spec(doc)["containers"] if c["name"] == "proxy"))


@pytest.mark.parametrize("by", ["revisionName", "customVersion"])
def test_pins_are_honoured_with_the_revisions_given(tmp_path: Path, by: str) -> None:
    pin = {"revisionName": REVISION_NAME} if by == "revisionName" else {"customVersion": "v1"}
    ss, revs = _pinned_setup(tmp_path, {**pin, "policy": "Always"})
    src = write(tmp_path / "d.yaml", deployment("web"), deployment("api"))
    done = sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss), "--revisions", str(revs))
    out = docs(ok(done))
    assert [_proxy_image(d) for d in out] == ["envoy:1", "envoy:1"]
    entry = json.loads(pod_annotations(out[0])[names.ANN_HASH])["mesh"]
    assert entry["controllerRevision"] == REVISION_NAME
    assert entry["updateTimestamp"] == "2024-04-01T00:00:00Z", "the revision's own time"
    # The StatefulSet revision of another namespace is not the webhook's: a note, not an error.
    assert "ControllerRevision shop/web-5d8f" in done.stderr.decode()


def test_without_revisions_a_pin_uses_the_current_spec_with_one_warning(tmp_path: Path) -> None:
    ss, _ = _pinned_setup(tmp_path, {"revisionName": REVISION_NAME, "policy": "Always"})
    src = write(tmp_path / "d.yaml", deployment("web"), deployment("api"))
    done = sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss))
    assert [_proxy_image(d) for d in docs(ok(done))] == ["envoy:2", "envoy:2"]
    assert warnings(done) == [
        f"warning: Deployment shop/web, Deployment shop/api: SidecarSet mesh pins spec.injectionStrategy.revision "
        f"to revisionName {REVISION_NAME}, but no --revisions were given: its current spec was injected instead"
    ]


def test_a_pin_that_names_no_revision_fails_like_the_webhook(tmp_path: Path) -> None:
    ss, revs = _pinned_setup(tmp_path, {"revisionName": "mesh-gone", "policy": "Always"})
    src = write(tmp_path / "d.yaml", deployment("web"))
    err = failed(sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss), "--revisions", str(revs)))
    assert err == (
        f"sidecarctl inject: error: {src}: document 1: Deployment shop/web: SidecarSet mesh: "
        "spec.injectionStrategy.revision: no ControllerRevision of SidecarSet 'mesh' matches revisionName "
        "'mesh-gone' (among the --revisions given)\n"
    )


def test_partial_pins_draw_the_same_for_an_object_on_every_run(tmp_path: Path) -> None:
    ss, revs = _pinned_setup(
        tmp_path, {"revisionName": REVISION_NAME, "policy": "Partial"}, updateStrategy={"partition": "50%"}
    )
    src = write(tmp_path / "d.yaml", *[deployment(f"web-{i}") for i in range(40)])
    argv = ("inject", "-f", str(src), "--sidecarset", str(ss), "--revisions", str(revs))
    first, second = (sidecarctl(*argv) for _ in range(2))
    assert first.stdout == second.stdout
    images = [_proxy_image(d) for d in docs(ok(first))]
    assert 8 <= images.count("envoy:1") <= 32, "about half of the workloads stay on the pinned revision"


# ---------------------------------------------------------------------------------------------
# transferEnv as Kruise: sorted names; fieldRef only on labels and annotations


def test_transfer_env_copies_the_names_sorted(tmp_path: Path) -> None:
    agent = container(
        "agent",
        "agent:1",
        transferEnv=[{"sourceContainerName": "app", "envName": "ZONE", "envNames": ["REGION", "LANG", "ZONE"]}],
    )
    ss = write(tmp_path / "ss.yaml", sidecarset("agent", containers=[agent], selector={"matchLabels": {"app": "web"}}))
    d = deployment("web")
    pod_spec(d)["containers"][0]["env"] = [{"name": n, "value": n.lower()} for n in ("ZONE", "REGION", "LANG", "OTHER")]
    out = docs(ok(sidecarctl("inject", "-f", str(write(tmp_path / "d.yaml", d)), "--sidecarset", str(ss))))[0]
    env = next(c["env"] for c in pod_spec(out)["containers"] if c["name"] == "agent")
    assert names_of(env) == ["IS_INJECTED", "LANG", "REGION", "ZONE"]


def test_transfer_env_from_metadata_name_is_refused_naming_the_field(tmp_path: Path) -> None:
    agent = container(
        "agent",
        "agent:1",
        transferEnv=[
            {
                "sourceContainerNameFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
                "envName": "X",
            }
        ],
    )
    ss = write(tmp_path / "ss.yaml", sidecarset("agent", containers=[agent], selector={"matchLabels": {"app": "web"}}))
    src = write(tmp_path / "d.yaml", deployment("web"))
    field = "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef.fieldPath"
    for extra in ([], ["--no-validate"]):  # the model refuses it before validation would
        err = failed(sidecarctl("inject", "-f", str(src), "--sidecarset", str(ss), *extra))
        assert err == (
            f"sidecarctl inject: error: {ss}: document 1: SidecarSet agent: {field}: 'metadata.name' is not "
            "supported (metadata.labels['k'] or metadata.annotations['k'])\n"
        )


# ---------------------------------------------------------------------------------------------
# libyaml and the pure-Python fallback; untouched documents as their text

ROUND_TRIP = """\
# Shop manifests, applied with kubectl apply -f.
---
# The scripts the jobs run.
apiVersion: v1
kind: ConfigMap
metadata:
  name: scripts      # kept as written
  namespace: shop
  annotations: {owner: "team-a", note: 'single'}
data:
  backup.sh: |
    #!/bin/sh
    set -eu
    tar czf /backup/data.tgz /data   # nightly

    echo "done: $(date)"
  mode: 0400
  enabled: yes
  when: 2024-01-01
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  ports:
  - port: 80   # http
...
---
# The web front end: injected.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}   # the pods
    spec:
      containers:
      - name: app
        image: nginx:1.27
        args: ["--port", "8080"]
# end of the web front end
---
apiVersion: v1
kind: Secret
metadata: {name: token, namespace: shop}
stringData:
  token: "ünïcødé ✓ 🔑"
"""


def test_untouched_documents_come_out_byte_for_byte(tmp_path: Path, mesh: Path) -> None:
    src = tmp_path / "shop.yaml"
    src.write_bytes(ROUND_TRIP.encode())
    out = ok(sidecarctl("inject", "-f", str(src), "--sidecarset", str(mesh), "--timestamp", NOW))
    before, injected_part = ROUND_TRIP.split("# The web front end: injected.\n")
    after = injected_part.split("# end of the web front end\n")[1]
    assert out.startswith(before + "# The web front end: injected.\n"), "the ConfigMap and Service as written"
    assert out.endswith("# end of the web front end\n" + after), "the Secret as written, after the kept comment"
    web = docs(out)[2]
    assert names_of(pod_spec(web)["containers"]) == ["proxy", "app"]
    assert "# the pods" not in out, "comments inside an injected document are lost (README)"
    # A file where nothing is injected is its own output, whatever its line endings.
    crlf = tmp_path / "crlf.yaml"
    crlf.write_bytes(b"\xef\xbb\xbf# BOM and CRLF\r\napiVersion: v1\r\nkind: Service\r\nmetadata: {name: x}\r\n")
    assert sidecarctl("inject", "-f", str(crlf), "--sidecarset", str(mesh)).stdout == crlf.read_bytes()


def test_pure_python_yaml_gives_the_same_bytes(tmp_path: Path) -> None:
    src = tmp_path / "shop.yaml"
    src.write_text(ROUND_TRIP, encoding="utf-8")
    d = deployment(
        "scripts", namespace="demo-shop", labels={"app.kubernetes.io/name": "x", "log-collection": "enabled"}
    )
    pod_spec(d)["containers"][0]["command"] = ["sh", "-c", "set -e\necho 'é ✓'\nexit 0\n", "🔑 ok\n2"]
    pod_spec(d)["containers"][0]["env"] = [{"name": "SERVICE_NAME", "value": "scripts"}]
    other = write(tmp_path / "other.yaml", d)
    argv = ("inject", "-f", str(src), "-f", str(other), "--sidecarset", "config/samples/")
    fast, pure = sidecarctl(*argv), sidecarctl(*argv, pure=True)
    assert ok(fast) == ok(pure)
    assert fast.stderr == pure.stderr
    injected = ok(fast).split("  name: scripts\n", 1)[1]
    assert "        - |\n          set -e\n" in injected, "multi-line strings of injected documents are literal blocks"
    assert '        - "\\U0001F511 ok\\n2"\n' in injected, "but not with characters libyaml escapes"
    assert "log-agent" in injected


# ---------------------------------------------------------------------------------------------
# Warnings, each once


def test_each_warning_once_naming_the_objects(tmp_path: Path) -> None:
    scoped = sidecarset(
        "scoped",
        containers=[container("scoped", "s:1")],
        selector={"matchLabels": {"app": "web"}},
        namespace_selector={"matchLabels": {"mesh": "on"}},
    )
    named_app = sidecarset(
        "named", containers=[container("app", "wrapper:1")], selector={"matchLabels": {"tier": "wrapped"}}
    )
    ss = write(tmp_path / "ss.yaml", MESH, scoped, named_app)
    workloads = write(
        tmp_path / "workloads.yaml",
        deployment("a", namespace="unlabelled"),
        deployment("b", namespace="unlabelled"),
        deployment("sys", namespace="kube-system"),
        deployment("wrapped", labels={"tier": "wrapped"}),
        deployment("c", namespace="unlabelled"),
        deployment("d", namespace="unlabelled"),
        {
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "shop"},
            "spec": {
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [container("db", "pg")]}}
            },
        },
    )
    nothing = write(tmp_path / "nothing.yaml", deployment("lonely", labels={"app": "other"}))
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here yet\n")
    done = sidecarctl(
        "inject", "-f", str(workloads), "-f", str(nothing), "-f", str(empty), "--sidecarset", str(ss), "--no-validate"
    )
    ok(done)
    assert warnings(done) == [
        "warning: Deployment unlabelled/a, Deployment unlabelled/b, Deployment unlabelled/c and 1 more: the labels of "
        "namespace unlabelled are not known, so SidecarSets that select namespaces by label were not matched: scoped "
        "(give its Namespace object with -f or --sidecarset, or --namespace-labels unlabelled:KEY=VALUE)",
        "warning: Deployment kube-system/sys: namespace kube-system is a system namespace, never injected: "
        "left unchanged",
        "warning: Deployment shop/wrapped: SidecarSet named: its container app replaces the pod's own container of "
        "that name in spec.containers",
        "warning: StatefulSet shop/db: kind StatefulSet of API group apps.kruise.io is not a workload this tool knows, "
        "but it holds a pod template at spec.template: passed through unchanged "
        "(inject it with --kind-template StatefulSet.apps.kruise.io=spec.template)",
        f"warning: {nothing}: no SidecarSet matched any pod or pod template in it (1 looked at)",
        f"warning: {empty}: no objects in it (empty input)",
    ]


# ---------------------------------------------------------------------------------------------
# Kinds by API group; --kind-template


def test_kinds_are_matched_by_group_and_kind_template_adds_one(tmp_path: Path, mesh: Path) -> None:
    clone = {
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "CloneSet",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [container("app", "nginx")]}}
        },
    }
    old_extensions = {**deployment("legacy"), "apiVersion": "extensions/v1beta1"}
    src = write(tmp_path / "crd.yaml", clone, old_extensions)
    plain = sidecarctl("inject", "-f", str(src), "--sidecarset", str(mesh))
    assert ok(plain) == src.read_text(), "neither is a workload this tool knows: both pass through"
    assert [w.split(": kind ")[1].split(" is not")[0] for w in warnings(plain)[:2]] == [
        "CloneSet of API group apps.kruise.io",
        "Deployment of API group extensions",
    ]
    added = docs(
        ok(
            sidecarctl(
                "inject",
                "-f",
                str(src),
                "--sidecarset",
                str(mesh),
                "--kind-template",
                "CloneSet.apps.kruise.io=spec.template",
            )
        )
    )
    assert names_of(pod_spec(added[0])["containers"]) == ["proxy", "app"]
    for bad in ("CloneSet", "CloneSet.apps.kruise.io=", "Clone Set.x=spec.template", "CloneSet.x=spec..template"):
        err = failed(sidecarctl("inject", "-f", str(src), "--sidecarset", str(mesh), "--kind-template", bad), code=2)
        assert "argument --kind-template" in err


# ---------------------------------------------------------------------------------------------
# Errors: one line with file, document, object and field; exit statuses; pipes and disks


def test_bad_input_is_one_line_naming_file_document_object_and_field(tmp_path: Path, mesh: Path) -> None:
    bad = deployment("web")
    pod_spec(bad)["containers"][0]["env"] = [{"value": "no name"}]
    src = write(tmp_path / "d.yaml", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}, bad)
    prefix = "sidecarctl inject: error:"
    err = failed(sidecarctl("inject", "-f", str(src), "--sidecarset", str(mesh)))
    field = "spec.template.spec.containers[0].env[0]"
    assert (
        err
        == f"{prefix} {src}: document 2: Deployment shop/web: {field} must be an object with a non-empty string name\n"
    )
    no_meta = write(tmp_path / "no-meta.yaml", {"apiVersion": names.API_VERSION, "kind": "SidecarSet", "spec": {}})
    err = failed(sidecarctl("inject", "-f", str(src), "--sidecarset", str(no_meta)))
    missing = "metadata is missing (a SidecarSet needs metadata.name)"
    assert err == f"{prefix} {no_meta}: document 1: SidecarSet (unnamed): {missing}\n"
    unusable = write(tmp_path / "unusable.yaml", sidecarset("mesh", containers="proxy"))
    err = failed(sidecarctl("inject", "-f", str(src), "--sidecarset", str(unusable)))
    assert err == f"{prefix} {unusable}: document 1: SidecarSet mesh: spec.containers must be a list, not a string\n"
    assert "None" not in err


def test_a_helm_template_gets_a_hint(tmp_path: Path, mesh: Path) -> None:
    chart = tmp_path / "deployment.yaml"
    chart.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\n  labels:\n"
        '    {{- include "x.labels" . | nindent 4 }}\n'
    )
    err = failed(sidecarctl("inject", "-f", str(chart), "--sidecarset", str(mesh)))
    assert err.count("\n") == 1
    assert f"{chart}: document 1: invalid YAML at line" in err and "render it first" in err


def test_exit_statuses(tmp_path: Path, mesh: Path) -> None:
    src = write(tmp_path / "d.yaml", deployment("web"))
    ok(sidecarctl("inject", "-f", str(src), "--sidecarset", str(mesh)))
    failed(sidecarctl("inject", "-f", str(tmp_path / "missing.yaml"), "--sidecarset", str(mesh)), code=1)
    usage = [
        ["inject"],
        ["inject", "-f", str(src)],  # no --sidecarset
        ["inject", "-f", str(src), "--sidecarset", str(mesh), "--timestamp", "yesterday"],
        ["inject", "-f", str(src), "--sidecarset", str(mesh), "--namespace-labels", "nonsense"],
        ["inject", "-f", "-", "-f", "-", "--sidecarset", str(mesh)],
        ["inject", "-f", str(src), "--sidecarset", "-"],
        ["inject", "--nope"],
    ]
    for argv in usage:
        err = failed(sidecarctl(*argv, stdin=b""), code=2)
        assert err.startswith("usage: sidecarctl"), argv
    assert "SIDECARCTL_NOW" in failed(
        sidecarctl("inject", "-f", str(src), "--sidecarset", str(mesh), env={"SIDECARCTL_NOW": "soon"}), code=2
    )


def test_a_closed_pipe_and_a_full_disk_end_without_a_traceback(tmp_path: Path, mesh: Path) -> None:
    src = write(tmp_path / "d.yaml", *[deployment(f"web-{i}") for i in range(300)])
    child = subprocess.Popen(
        [sys.executable, "-m", "sidecarctl.cli.main", "inject", "-f", str(src), "--sidecarset", str(mesh)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.read(100)
    child.stdout.close()  # as `| head -c 100` does
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 1
    assert err == "sidecarctl inject: error: stdout was closed before all of the output was written\n"
    if Path("/dev/full").exists():
        with open("/dev/full", "wb") as full:
            done = subprocess.run(
                [sys.executable, "-m", "sidecarctl.cli.main", "inject", "-f", str(src), "--sidecarset", str(mesh)],
                cwd=REPO,
                stdout=full,
                stderr=subprocess.PIPE,
                check=False,
            )
        assert done.returncode == 1
        assert done.stderr.decode() == "sidecarctl inject: error: cannot write to stdout: No space left on device\n"
        err = failed(sidecarctl("inject", "-f", str(src), "--sidecarset", str(mesh), "-o", "/dev/full"))
        assert err == "sidecarctl inject: error: /dev/full: cannot write: No space left on device\n"


def test_output_file_is_replaced_whole(tmp_path: Path, mesh: Path) -> None:
    src = write(tmp_path / "d.yaml", deployment("web"))
    target = tmp_path / "out.yaml"
    target.write_text("old\n")
    target.chmod(0o640)
    assert sidecarctl("inject", "-f", str(src), "--sidecarset", str(mesh), "-o", str(target)).stdout == b""
    assert names_of(pod_spec(docs(target.read_text())[0])["containers"]) == ["proxy", "app"]
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.yaml", "mesh.yaml", "out.yaml"], "no temporary file left"


# ---------------------------------------------------------------------------------------------
# --explain: which path injects each SidecarSet


def test_explain_names_each_path_and_leaves_stdout_alone(tmp_path: Path, mesh: Path) -> None:
    app = write(tmp_path / "app.yaml", deployment("web"))
    hot = sidecarset(
        "hot",
        containers=[
            container("agent", "agent:1", upgradeStrategy={"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "e:1"})
        ],
        selector={"matchLabels": {"app": "web"}},
    )
    other = sidecarset("logs", containers=[container("log", "log:1")], selector={"matchLabels": {"app": "db"}})
    paused = sidecarset("off", containers=[container("x", "x:1")], injectionStrategy={"paused": True})
    sets = write(tmp_path / "sets.yaml", MESH, hot, other, paused)
    plain = sidecarctl("inject", "-f", str(app), "--sidecarset", str(sets), "--timestamp", "2024-01-01T00:00:00Z")
    explained = sidecarctl(
        "inject", "-f", str(app), "--sidecarset", str(sets), "--timestamp", "2024-01-01T00:00:00Z", "--explain"
    )
    assert ok(explained) == ok(plain), "stdout is the same with --explain"
    lines = [x for x in explained.stderr.decode().splitlines() if x.startswith("explain: ")]
    assert lines == [
        "explain: SidecarSet hot: injected by the webhook: container agent: upgradeStrategy HotUpgrade "
        "(a container pair with version annotations)",
        "explain: SidecarSet logs: injected by a MutatingAdmissionPolicy (no webhook call)",
        "explain: SidecarSet mesh: injected by a MutatingAdmissionPolicy (no webhook call); "
        "pods that hot also select(s) go to the webhook, whole",
        "explain: SidecarSet off: not injected: injection paused or no selector: nothing is injected",
    ]
    assert "explain:" not in plain.stderr.decode()


def test_a_namespaced_sidecarset_injects_pods_of_its_namespace_keyed_namespace_slash_name(tmp_path: Path) -> None:
    tenant = sidecarset("logs", containers=[container("log", "log:1")], api_version=names.API_VERSION_V1BETA1)
    tenant["kind"] = names.NAMESPACED_KIND
    tenant["metadata"]["namespace"] = "shop"
    (tmp_path / "nss.yaml").write_text(yaml.safe_dump(tenant))
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": ns, "labels": {"app": "web"}},
             "spec": {"containers": [{"name": "app", "image": "app:1"}]}} for ns in ("shop", "other")]  # fmt: skip
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all(pods))
    args = ["inject", "-f", str(tmp_path / "pods.yaml"), "--sidecarset", str(tmp_path / "nss.yaml")]
    labels = ["--namespace-labels", "shop:team=shop", "--namespace-labels", "other:team=other"]
    shop, other = yaml.safe_load_all(ok(sidecarctl(*args, *labels)))
    assert [c["name"] for c in shop["spec"]["containers"]] == ["log", "app"]
    assert set(json.loads(shop["metadata"]["annotations"][names.ANN_HASH])) == {"shop/logs"}
    assert [c["name"] for c in other["spec"]["containers"]] == ["app"]
    del tenant["metadata"]["namespace"]
    (tmp_path / "nss.yaml").write_text(yaml.safe_dump(tenant))
    assert "metadata.namespace is required" in failed(sidecarctl(*args, *labels))
