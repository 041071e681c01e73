"""config/alerts: the PrometheusRule, its promtool tests, the kustomize Component and the chart's copy.

- `promtool check rules` accepts the rule groups and `promtool test rules` passes
  tests/unit/install/alerts-tests.yaml, which has, for every alert, a case where it fires (with its
  labels and rendered annotations) and one where it must not; a wrong expectation makes promtool fail;
- every alert has a severity, a summary, a description naming the object it is about, and a
  `runbook_url` that is a section of docs/monitoring.md (an anchor mkdocs gives that page's heading);
- every sidecarctl metric an alert reads is one the manager registers (spelled as Prometheus stores
  it); only SidecarctlWebhookUnreachable reads kube-apiserver's metrics;
- the Component adds exactly the PrometheusRule; with monitoring.prometheusRule.enabled the chart
  renders that same object (its labels extended, in the release's namespace), and not by default.

Whether each alert fires against a running manager under a real Prometheus is
tests/e2e/test_prometheus_e2e.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown.extensions.toc import slugify

from tests.kube import helm, prometheus
from tests.kube.helm import CHART, CONFIG
from tests.unit.install.test_manifests import MANAGER_NS, key
from tests.unit.install.test_monitoring import registered_families, series_names, unknown_metrics

ALERTS = CONFIG / "alerts"
RULE = ALERTS / "prometheusrule.yaml"
CHART_RULE = CHART / "files" / RULE.name
PROMTOOL_TESTS = Path(__file__).with_name("alerts-tests.yaml")
RUNBOOKS = Path("docs/monitoring.md")  # relative to the repository root, as runbook_url gives it
API_SERVER_ALERTS = {"SidecarctlWebhookUnreachable"}

Obj = dict[str, Any]


def prometheus_rule() -> Obj:
    obj: Obj = yaml.safe_load(RULE.read_text(encoding="utf-8"))
    return obj


def alerts() -> list[Obj]:
    return [r for g in prometheus_rule()["spec"]["groups"] for r in g["rules"] if "alert" in r]


def write_rules(directory: Path) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file (what prometheus-operator hands Prometheus)."""
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": prometheus_rule()["spec"]["groups"]}, sort_keys=False))
    return path


def promtool(*args: str, cwd: Path) -> tuple[int, str]:
    binary = prometheus.binaries() / "promtool"
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)
    return proc.returncode, proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------------
# promtool


def test_promtool_accepts_the_rules_and_passes_every_case(tmp_path: Path) -> None:
    write_rules(tmp_path)
    code, out = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert code == 0 and f"SUCCESS: {len(alerts())} rules found" in out, out
    shutil.copy(PROMTOOL_TESTS, tmp_path / PROMTOOL_TESTS.name)
    code, out = promtool("test", "rules", PROMTOOL_TESTS.name, cwd=tmp_path)
    assert code == 0 and "SUCCESS" in out, out


def test_promtool_fails_a_case_whose_expectation_is_wrong(tmp_path: Path) -> None:
    write_rules(tmp_path)
    cases = yaml.safe_load(PROMTOOL_TESTS.read_text())
    firing = next(t for case in cases["tests"] for t in case["alert_rule_test"] if t["exp_alerts"])
    firing["exp_alerts"][0]["exp_labels"]["severity"] = "page-nobody"
    (tmp_path / "wrong.yaml").write_text(yaml.safe_dump(cases))
    code, out = promtool("test", "rules", "wrong.yaml", cwd=tmp_path)
    assert code != 0 and "page-nobody" in out, out


def test_every_alert_has_a_firing_case_and_a_quiet_case() -> None:
    cases = yaml.safe_load(PROMTOOL_TESTS.read_text())
    assert cases["rule_files"] == ["rules.yaml"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in cases["tests"]:
        for t in case["alert_rule_test"]:
            (firing if t["exp_alerts"] else quiet).add(t["alertname"])
    names = {a["alert"] for a in alerts()}
    assert firing == names, f"alerts without a firing case: {sorted(names - firing)}"
    assert quiet == names, f"alerts without a case where they stay quiet: {sorted(names - quiet)}"


# ---------------------------------------------------------------------------------------------
# What each alert says


def runbook_anchors() -> set[str]:
    """The anchors mkdocs gives the headings of the runbook page (its toc extension's own slugify)."""
    out = set()
    for line in (CONFIG.parent / RUNBOOKS).read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            out.add(slugify(line.lstrip("#").strip(), "-"))
    return out


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: str(a["alert"]))
def test_each_alert_says_what_is_wrong_where_and_what_to_do(alert: Obj) -> None:
    assert alert["labels"]["severity"] in {"critical", "warning", "info"}
    notes = alert["annotations"]
    assert set(notes) == {"summary", "description", "runbook_url"}
    assert "{{" not in notes["summary"], "the summary is the same for every instance; the description names it"
    assert re.search(r"\{\{ \$labels\.(sidecarset|namespace|pod|lease|name|webhook) \}\}", notes["description"])
    anchor = f"{RUNBOOKS}#{alert['alert'].lower()}"
    assert notes["runbook_url"] == anchor
    assert anchor.split("#", 1)[1] in runbook_anchors(), f"{RUNBOOKS} has no section {alert['alert']}"


def test_alerts_read_only_metrics_the_manager_exports() -> None:
    known = series_names(registered_families())
    for alert in alerts():
        expr = alert["expr"]
        assert not unknown_metrics(expr, known), (alert["alert"], unknown_metrics(expr, known))
        reads_api_server = "apiserver_" in expr
        assert reads_api_server == (alert["alert"] in API_SERVER_ALERTS), alert["alert"]
        assert "sidecarctl_" in expr or reads_api_server


# ---------------------------------------------------------------------------------------------
# kustomize and the chart


def test_the_component_adds_the_prometheusrule_only() -> None:
    kustomization = yaml.safe_load((ALERTS / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    assert kustomization["resources"] == [RULE.name]
    assert set(kustomization) == {"apiVersion", "kind", "resources"}
    rule = prometheus_rule()
    assert key(rule) == ("PrometheusRule", MANAGER_NS, "sidecarctl-alerts")


@pytest.fixture(scope="module")
def chart_helm() -> None:
    helm.require("helm", checking="the chart's PrometheusRule")


def test_the_chart_rule_is_config_alerts_file() -> None:
    assert CHART_RULE.is_symlink() and CHART_RULE.resolve() == RULE.resolve()


def test_the_chart_renders_the_prometheusrule_only_when_asked(chart_helm: None) -> None:
    default = {key(o): o for o in helm.helm_template()}
    on = {key(o): o for o in helm.helm_template("--set", "monitoring.prometheusRule.enabled=true")}
    rule = prometheus_rule()
    assert set(on) - set(default) == {key(rule)}
    assert on[key(rule)] == rule
    assert {k: on[k] for k in default} == default, "the value changes no other object"


def test_the_chart_rule_takes_labels_and_the_install_namespace(tmp_path: Path, chart_helm: None) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        json.dumps(
            {
                "installation": {"namespace": "mesh-control"},
                "monitoring": {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
            }
        )
    )
    objs = {key(o): o for o in helm.helm_template("-f", str(values))}
    got = objs[("PrometheusRule", "mesh-control", "sidecarctl-alerts")]
    assert got["metadata"]["labels"] == {**prometheus_rule()["metadata"]["labels"], "release": "kube-prometheus-stack"}
    assert got["spec"] == prometheus_rule()["spec"]
