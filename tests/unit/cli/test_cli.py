"""`sidecarctl inject` in process: inputs and outputs, and a clear one-line error for every kind of bad input.

tests/unit/cli/test_inject_cli.py runs the command as a child process, as users do.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecarctl.cli import injectcmd
from sidecarctl.cli import main as cli
from sidecarsets import validation
from sidecarsets.spec import names
from tests.kube.builders import container, pod, sidecarset

NOW = "2024-01-01T00:00:00Z"
MESH = sidecarset("mesh", containers=[container("proxy", "envoy:1")])
POD = pod("web", namespace="shop", containers=[container("app", "nginx")])


def write(path: Path, *docs: Any) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {"pod": write(tmp_path / "pod.yaml", POD), "ss": write(tmp_path / "ss.yaml", MESH)}


def containers(doc: dict[str, Any]) -> list[str]:
    return [c["name"] for c in doc["spec"]["containers"]]


def test_injects_a_pod(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        ["inject", "-f", str(files["pod"]), "--sidecarset", str(files["ss"]), "--timestamp", NOW], capsys
    )
    assert (code, err) == (0, "")
    (doc,) = yaml.safe_load_all(out)
    assert containers(doc) == ["proxy", "app"]
    assert list(doc) == ["apiVersion", "kind", "metadata", "spec"]
    assert NOW in doc["metadata"]["annotations"][names.ANN_HASH]


def test_reads_stdin(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(files["pod"].read_bytes())))
    code, out, _ = run(["inject", "-f", "-", "--sidecarset", str(files["ss"])], capsys)
    assert code == 0
    assert containers(yaml.safe_load(out)) == ["proxy", "app"]


def test_timestamp_from_the_environment(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(injectcmd.NOW_ENV, "2030-05-05T05:05:05Z")
    _, out, _ = run(["inject", "-f", str(files["pod"]), "--sidecarset", str(files["ss"])], capsys)
    assert "2030-05-05T05:05:05Z" in yaml.safe_load(out)["metadata"]["annotations"][names.ANN_HASH]


def test_directory_of_sidecarsets_and_lists(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    ssdir = tmp_path / "sidecarsets"
    ssdir.mkdir()
    write(ssdir / "a.yaml", MESH)
    logging = sidecarset("logging", containers=[container("log", "l", podInjectPolicy="AfterAppContainer")])
    tracing = sidecarset("tracing", containers=[container("tracer", "t", podInjectPolicy="AfterAppContainer")])
    write(ssdir / "b.yml", {"apiVersion": "v1", "kind": "List", "items": [logging, tracing]})
    (ssdir / "notes.txt").write_text("not a manifest")
    code, out, err = run(["inject", "-f", str(files["pod"]), "--sidecarset", str(ssdir)], capsys)
    assert (code, err) == (0, "")
    assert containers(yaml.safe_load(out)) == ["proxy", "app", "log", "tracer"]


def test_passthrough_kinds_and_empty_documents(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
    custom = {"apiVersion": "x.io/v1", "kind": "Thing", "spec": {"template": {"spec": {"containers": []}}}}
    src = tmp_path / "in.yaml"
    src.write_text(
        "---\n" + yaml.safe_dump(service, sort_keys=False) + "---\n---\n" + yaml.safe_dump(custom, sort_keys=False)
    )
    code, out, err = run(["inject", "-f", str(src), "--sidecarset", str(files["ss"])], capsys)
    assert code == 0
    assert out == src.read_text(), "nothing injected: the file as it was, empty document included"
    assert err.splitlines() == [
        "warning: Thing (unnamed): kind Thing of API group x.io is not a workload this tool knows, but it holds a "
        "pod template at spec.template: passed through unchanged "
        "(inject it with --kind-template Thing.x.io=spec.template)",
        "warning: nothing to inject: no Pod, and no workload with a pod template, in the input",
    ]


def test_output_file(tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out.yaml"
    code, out, _ = run(["inject", "-f", str(files["pod"]), "--sidecarset", str(files["ss"]), "-o", str(target)], capsys)
    assert (code, out) == (0, "")
    assert containers(yaml.safe_load(target.read_text())) == ["proxy", "app"]


def test_namespace_label_forms(tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    scoped = sidecarset(
        "mesh", containers=[container("proxy", "envoy:1")], namespace_selector={"matchLabels": {"team": "shop"}}
    )
    ss = write(tmp_path / "scoped.yaml", scoped)
    base = ["inject", "-f", str(files["pod"]), "--sidecarset", str(ss)]
    injected = [
        ["--namespace-labels", "shop:team=shop,env=prod"],
        ["--namespace-labels", "team=shop"],
        [
            "--namespace-labels",
            str(
                write(
                    tmp_path / "ns.yaml",
                    {"kind": "Namespace", "metadata": {"name": "shop", "labels": {"team": "shop"}}},
                )
            ),
        ],
    ]
    for extra in injected:
        _, out, _ = run(base + extra, capsys)
        assert containers(yaml.safe_load(out)) == ["proxy", "app"], extra
    for extra in ([], ["--namespace-labels", "shop:"], ["--namespace-labels", "other:team=shop"]):
        _, out, _ = run(base + extra, capsys)
        assert containers(yaml.safe_load(out)) == ["app"], extra


def test_warnings_go_to_stderr(tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    ss = sidecarset(
        "mesh", containers=[container("proxy", "e", transferEnv=[{"sourceContainerName": "nope", "envName": "X"}])]
    )
    code, out, err = run(
        ["inject", "-f", str(files["pod"]), "--sidecarset", str(write(tmp_path / "s.yaml", ss))], capsys
    )
    assert code == 0 and out
    expected = (
        "warning: Pod shop/web: SidecarSet mesh, container proxy: "
        "transferEnv: source container 'nope' is not in the pod; skipped\n"
    )
    assert err == expected


def test_help_documents_the_namespace_label_forms(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["inject", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "NAME:k=v,k2=v2" in out and "Namespace objects" in out
    for flag in ("--timestamp", "--revisions", "--kind-template", "-n NS", "FILE|DIR|-"):
        assert flag in out, flag
    assert "Exit status: 0 done, 1 bad input or output not written, 2 bad command line." in out


def test_validation_errors_stop_injection(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, Any, Any]] = []

    class FakeError:
        def __str__(self) -> str:
            return "spec.containers[0].image: must not be empty"

    def validate_sidecarset(obj: Any, *, old: Any = None, others: Any = ()) -> list[FakeError]:
        calls.append((obj, old, list(others)))
        return [FakeError(), FakeError()]

    monkeypatch.setattr(validation, "validate_sidecarset", validate_sidecarset)
    code, out, err = run(["inject", "-f", str(files["pod"]), "--sidecarset", str(files["ss"])], capsys)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert "SidecarSet mesh is invalid: spec.containers[0].image: must not be empty; spec.containers" in err
    assert str(files["ss"]) in err
    assert calls == [(MESH, None, [])]
    code, out, _ = run(["inject", "-f", str(files["pod"]), "--sidecarset", str(files["ss"]), "--no-validate"], capsys)
    assert code == 0 and out


def test_validation_sees_the_other_sidecarsets(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, list[str]] = {}

    def validate_sidecarset(obj: Any, *, old: Any = None, others: Any = ()) -> list[Any]:
        seen[obj["metadata"]["name"]] = [o["metadata"]["name"] for o in others]
        return []

    monkeypatch.setattr(validation, "validate_sidecarset", validate_sidecarset)
    other = write(
        tmp_path / "other.yaml",
        sidecarset("other", containers=[container("x", "x")]),
    )
    code, _, _ = run(
        ["inject", "-f", str(files["pod"]), "--sidecarset", str(files["ss"]), "--sidecarset", str(other)], capsys
    )
    assert code == 0
    assert seen == {"mesh": ["other"], "other": ["mesh"]}


def _bad_cases(tmp: Path) -> list[tuple[list[str], str]]:
    pod = str(write(tmp / "pod.yaml", POD))
    ss = str(write(tmp / "ss.yaml", MESH))
    bad_yaml = tmp / "bad.yaml"
    bad_yaml.write_text("kind: Pod\nmetadata: {name: [unclosed\n")
    binary = tmp / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    empty_dir = tmp / "empty"
    empty_dir.mkdir()
    broken_ss = write(tmp / "broken-ss.yaml", sidecarset("mesh", containers="proxy"))
    not_ss = write(tmp / "not-ss.yaml", POD)
    dup_dir = tmp / "dups"
    dup_dir.mkdir()
    write(dup_dir / "a.yaml", MESH)
    write(dup_dir / "b.yaml", MESH)
    bad_pod = write(tmp / "bad-pod.yaml", {**POD, "spec": {"containers": [{"image": "x"}]}})
    bad_deploy = write(
        tmp / "bad-deploy.yaml", {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": "x"}}
    )
    bad_template = write(
        tmp / "bad-template.yaml",
        {
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": "app"}}},
        },
    )
    scalar = tmp / "scalar.yaml"
    scalar.write_text("just a string\n")
    bad_list = write(tmp / "bad-list.yaml", {"kind": "List", "items": "x"})
    bad_ns = write(tmp / "bad-ns.yaml", {"kind": "Pod", "metadata": {"name": "x"}})
    base = ["inject", "-f", pod]
    return [
        (["inject", "-f", str(tmp / "missing.yaml"), "--sidecarset", ss], "missing.yaml: cannot read: No such file"),
        (["inject", "-f", str(bad_yaml), "--sidecarset", ss], "bad.yaml: document 1: invalid YAML at line 3, column 1"),
        (["inject", "-f", str(binary), "--sidecarset", ss], "binary.yaml: not UTF-8 text (byte 1)"),
        (["inject", "-f", str(scalar), "--sidecarset", ss], "scalar.yaml: document 1: the document is not an object"),
        (["inject", "-f", str(bad_list), "--sidecarset", ss], "document 1: List (unnamed): items must be a list"),
        ([*base, "--sidecarset", str(tmp / "nope")], "nope: cannot read"),
        ([*base, "--sidecarset", str(empty_dir)], "--sidecarset " + str(empty_dir) + ": no .yaml, .yml, .json files"),
        ([*base, "--sidecarset", str(bad_yaml)], "bad.yaml: document 1: invalid YAML"),
        (
            [*base, "--sidecarset", str(broken_ss)],
            "broken-ss.yaml: document 1: SidecarSet mesh: spec.containers must be a list",
        ),
        ([*base, "--sidecarset", str(not_ss)], "--sidecarset: no SidecarSet found in " + str(not_ss)),
        ([*base, "--sidecarset", str(dup_dir)], "b.yaml: document 1: SidecarSet mesh is already defined in"),
        (
            ["inject", "-f", str(bad_pod), "--sidecarset", ss],
            "bad-pod.yaml: document 1: Pod shop/web: spec.containers[0]",
        ),
        (["inject", "-f", str(bad_deploy), "--sidecarset", ss], "Deployment d: spec.template must be an object"),
        (
            ["inject", "-f", str(bad_template), "--sidecarset", ss],
            "Deployment d: spec.template.spec.containers must be a non-empty list",
        ),
        (
            [*base, "--sidecarset", ss, "--namespace-labels", str(bad_ns)],
            "bad-ns.yaml: document 1: --namespace-labels: Pod x is not a Namespace",
        ),
        ([*base, "--sidecarset", ss, "-o", str(tmp / "no-dir" / "out.yaml")], "out.yaml: cannot write"),
    ]


def test_bad_input_exits_1_with_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in _bad_cases(tmp_path):
        code, out, err = run(argv, capsys)
        assert code == 1, (argv, err)
        assert out == "", argv
        assert err.startswith("sidecarctl inject: error: "), err
        assert err.count("\n") == 1, err
        assert message in err, (message, err)


def test_a_conflicting_pair_is_refused_by_validation(
    tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    other = write(tmp_path / "other.yaml", sidecarset("mesh-two", containers=[container("proxy", "envoy:1")]))
    argv = ["inject", "-f", str(files["pod"]), "--sidecarset", str(files["ss"]), "--sidecarset", str(other)]
    code, out, err = run(argv, capsys)
    assert (code, out) == (1, "")
    assert "is invalid" in err and "proxy" in err
    code, out, err = run([*argv, "--no-validate"], capsys)
    assert code == 0
    assert "SidecarSet mesh-two is not injected" in err


def test_usage_errors_exit_2(tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["inject", "-f", str(files["pod"]), "--sidecarset", str(files["ss"])]
    cases = [
        ([], "the following arguments are required: COMMAND"),
        (["inject"], "the following arguments are required: -f/--filename, --sidecarset"),
        (["nope"], "invalid choice: 'nope'"),
        (["inject", "-f", str(files["pod"])], "the following arguments are required: --sidecarset"),
        ([*base, "--namespace-labels", "nonsense"], "'nonsense': no such file, and not NAME:KEY=VALUE"),
        ([*base, "--namespace-labels", "shop:team"], "'team' is not KEY=VALUE"),
        ([*base, "--namespace-labels", ":a=b"], "the namespace name before ':' is empty"),
        ([*base, "--timestamp", "yesterday"], "'yesterday' is not an RFC 3339 time"),
        ([*base, "--timestamp", "2024-01-01"], "is not an RFC 3339 time"),
        ([*base, "--kind-template", "CloneSet"], "'CloneSet' is not KIND.GROUP=PATH"),
        ([*base, "-f", "-", "-f", "-"], "- (standard input) can be given only once"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("usage: sidecarctl"), err
        assert message in err, (message, err)
