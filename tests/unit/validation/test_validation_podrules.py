"""Sidecars checked as the containers they become: the lines kube-apiserver 1.37 gives for a pod
with the same containers and volumes (read from it with `kubectl create --dry-run=server`), from
sidecarctl's SidecarSet validation. tests/e2e/test_validation_e2e.py compares the two live."""

from __future__ import annotations

from typing import Any

import pytest

from sidecarsets.validation import validate_sidecarset
from tests.kube import builders


def lines(containers: list[Any], init: list[Any] | None = None, volumes: list[Any] | None = None) -> list[str]:
    obj = builders.sidecarset("agents", containers=containers, init_containers=init, volumes=volumes or [])
    return [str(e) for e in validate_sidecarset(obj)]


def test_the_five_cases_of_the_issue() -> None:
    proxy = builders.container(
        "proxy",
        "envoy:1",
        imagePullPolicy="Sometimes",
        ports=[{"name": "http", "containerPort": 80}, {"name": "http", "containerPort": 81}],
        volumeMounts=[{"name": "x", "mountPath": "/x"}],
        livenessProbe={"periodSeconds": 3},
        readinessProbe={},
        startupProbe={},
        lifecycle={"preStop": {}, "postStart": {}},
        resources={"limits": {"cpu": "1e1.5"}},
    )
    assert sorted(lines([proxy])) == sorted(
        [
            'spec.containers[0].ports[1].name: Duplicate value: "http"',
            'spec.containers[0].volumeMounts[0].name: Not found: "x"',
            'spec.containers[0].imagePullPolicy: Unsupported value: "Sometimes": supported values: '
            '"Always", "IfNotPresent", "Never"',
            "spec.containers[0].lifecycle.postStart: Required value: must specify a handler type",
            "spec.containers[0].lifecycle.preStop: Required value: must specify a handler type",
            "spec.containers[0].livenessProbe: Required value: must specify a handler type",
            "spec.containers[0].readinessProbe: Required value: must specify a handler type",
            "spec.containers[0].startupProbe: Required value: must specify a handler type",
            # For a pod the API server says this without a field, as a decoding error.
            'spec.containers[0].resources.limits[cpu]: Invalid value: "1e1.5": quantities must match the '
            "regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ]
    )


def test_ports_env_mounts_resources_probes() -> None:
    c = builders.container(
        "dup",
        "a",
        terminationMessagePolicy="Bogus",
        env=[{"name": "A=B", "value": "x"}, {"name": ""}],
        ports=[
            {"name": "HTTP_x", "containerPort": 0},
            {"containerPort": 70000, "protocol": "ICMP"},
            {"containerPort": 80, "hostPort": -1},
            {"name": "averyveryverylongname", "containerPort": 81},
            {"name": "1234", "containerPort": 82},
            {"name": "a--b", "containerPort": 83},
            {"name": "-ab", "containerPort": 84},
        ],
        volumeMounts=[
            {"name": "v", "mountPath": ""},
            {"name": "v", "mountPath": "/a"},
            {"name": "v", "mountPath": "/a"},
            {"name": "v", "mountPath": "/b", "subPath": "../x"},
            {"name": "", "mountPath": "/c"},
            {"name": "v", "mountPath": "/d", "subPath": "/abs"},
            {"name": "v", "mountPath": "/e", "subPathExpr": "x", "subPath": "y"},
            {"name": "v", "mountPath": "/f", "mountPropagation": "Weird"},
        ],
        resources={
            "limits": {"cpu": "1", "memory": "1Gi", "bogus": "1"},
            "requests": {"cpu": "2", "memory": "2Gi"},
        },
        livenessProbe={
            "exec": {"command": ["a"]},
            "httpGet": {"port": 80},
            "successThreshold": 2,
            "timeoutSeconds": -1,
            "terminationGracePeriodSeconds": 0,
        },
        readinessProbe={"httpGet": {"port": 0}, "terminationGracePeriodSeconds": 5},
        startupProbe={"tcpSocket": {"port": "bad_name"}},
    )
    p = "spec.containers[0]"
    expected = {
        f'{p}.terminationMessagePolicy: Unsupported value: "Bogus": supported values: "File", "FallbackToLogsOnError"',
        f'{p}.ports[0].name: Invalid value: "HTTP_x": must contain only alpha-numeric characters (a-z, 0-9), '
        "and hyphens (-)",
        f"{p}.ports[0].containerPort: Required value",
        f"{p}.ports[1].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
        f'{p}.ports[1].protocol: Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"',
        f"{p}.ports[2].hostPort: Invalid value: -1: must be between 1 and 65535, inclusive",
        f'{p}.ports[3].name: Invalid value: "averyveryverylongname": must be no more than 15 characters',
        f'{p}.ports[4].name: Invalid value: "1234": must contain at least one letter (a-z)',
        f'{p}.ports[5].name: Invalid value: "a--b": must not contain consecutive hyphens',
        f'{p}.ports[6].name: Invalid value: "-ab": must not begin or end with a hyphen',
        f'{p}.env[0].name: Invalid value: "A=B": a valid environment variable name must consist only of '
        "printable ASCII characters other than '='",
        f"{p}.env[1].name: Required value",
        f"{p}.volumeMounts[0].mountPath: Required value",
        f'{p}.volumeMounts[2].mountPath: Invalid value: "/a": must be unique',
        f"{p}.volumeMounts.subPath: Invalid value: \"../x\": must not contain '..'",
        f"{p}.volumeMounts[4].name: Required value",
        f'{p}.volumeMounts[4].name: Not found: ""',
        f'{p}.volumeMounts.subPath: Invalid value: "/abs": must be a relative path',
        f'{p}.volumeMounts[6].subPathExpr: Invalid value: "x": subPathExpr and subPath are mutually exclusive',
        f'{p}.volumeMounts.mountPropagation: Unsupported value: "Weird": supported values: '
        '"Bidirectional", "HostToContainer", "None"',
        f'{p}.resources.limits[bogus]: Invalid value: "bogus": must be a standard resource type or fully qualified',
        f'{p}.resources.limits[bogus]: Invalid value: "bogus": must be a standard resource for containers',
        f'{p}.resources.requests: Invalid value: "2": must be less than or equal to cpu limit of 1',
        f'{p}.resources.requests: Invalid value: "2Gi": must be less than or equal to memory limit of 1Gi',
        f"{p}.livenessProbe.httpGet: Forbidden: may not specify more than 1 handler type",
        f"{p}.livenessProbe.timeoutSeconds: Invalid value: -1: must be greater than or equal to 0",
        f"{p}.livenessProbe.successThreshold: Invalid value: 2: must be 1",
        f"{p}.livenessProbe.terminationGracePeriodSeconds: Invalid value: 0: must be greater than 0",
        f"{p}.readinessProbe.httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive",
        f"{p}.readinessProbe.terminationGracePeriodSeconds: Invalid value: 5: must not be set for readinessProbes",
        f'{p}.startupProbe.tcpSocket.port: Invalid value: "bad_name": must contain only alpha-numeric '
        "characters (a-z, 0-9), and hyphens (-)",
    }
    found = lines([c], volumes=[{"name": "v", "emptyDir": {}}])
    assert set(found) == expected


def test_init_containers() -> None:
    init = [
        builders.container("Init_x", "", restartPolicy="Sometimes"),
        builders.container(
            "plain",
            "a",
            livenessProbe={"exec": {"command": ["a"]}},
            readinessProbe={"exec": {"command": ["a"]}},
            startupProbe={"exec": {"command": ["a"]}},
            lifecycle={"preStop": {"exec": {"command": ["a"]}}},
        ),
        builders.container(
            "native",
            "a",
            restartPolicy="Always",
            readinessProbe={"exec": {"command": ["a"]}, "failureThreshold": -2, "periodSeconds": -1},
            startupProbe={"exec": {"command": ["a"]}, "successThreshold": 2},
            lifecycle={"preStop": {"httpGet": {"port": 99999}, "tcpSocket": {"port": 1}}},
        ),
        builders.container("dup", "a"),
    ]
    p = "spec.initContainers"
    forbidden = "Forbidden: may not be set for init containers without restartPolicy=Always"
    assert set(lines([builders.container("dup", "a")], init=init)) == {
        f'{p}[0].name: Invalid value: "Init_x": a lowercase RFC 1123 label must consist of lower case alphanumeric '
        "characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
        "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        f"{p}[0].image: Required value",
        f'{p}[0].restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "Never", "OnFailure"',
        f"{p}[1].lifecycle: {forbidden}",
        f"{p}[1].livenessProbe: {forbidden}",
        f"{p}[1].readinessProbe: {forbidden}",
        f"{p}[1].startupProbe: {forbidden}",
        f"{p}[2].lifecycle.preStop.httpGet.port: Invalid value: 99999: must be between 1 and 65535, inclusive",
        f"{p}[2].lifecycle.preStop.tcpSocket: Forbidden: may not specify more than 1 handler type",
        f"{p}[2].readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
        f"{p}[2].readinessProbe.failureThreshold: Invalid value: -2: must be greater than or equal to 0",
        f"{p}[2].startupProbe.successThreshold: Invalid value: 2: must be 1",
        f'{p}[3].name: Duplicate value: "dup"',
    }


def test_volumes() -> None:
    volumes = [
        {"name": "a", "emptyDir": {}},
        {"name": "a", "emptyDir": {}},
        {"name": "two", "emptyDir": {}, "hostPath": {"path": "/x"}},
        {"name": "", "emptyDir": {}},
        {"name": "a8", "configMap": {"name": "c"}, "downwardAPI": {}},
        {"name": "a9", "downwardAPI": {}, "persistentVolumeClaim": {"claimName": "c"}},
        {"name": "none"},  # no source: the API server makes it an emptyDir
        {"name": "big", "emptyDir": {"sizeLimit": "lots"}},
    ]
    mounts = [{"name": n, "mountPath": f"/{i}"} for i, n in enumerate(["a", "two", "none", "big"])]
    found = set(lines([builders.container("c", "a", volumeMounts=mounts)], volumes=volumes))
    assert found == {
        'spec.volumes[1].name: Duplicate value: "a"',
        "spec.volumes[2].hostPath: Forbidden: may not specify more than 1 volume type",
        "spec.volumes[3].name: Required value",
        "spec.volumes[4].configMap: Forbidden: may not specify more than 1 volume type",
        "spec.volumes[5].downwarAPI: Forbidden: may not specify more than 1 volume type",
        'spec.volumes[7].emptyDir.sizeLimit: Invalid value: "lots": quantities must match the regular expression '
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        # Only valid volumes may be mounted, as in the API server.
        'spec.containers[0].volumeMounts[1].name: Not found: "two"',
        'spec.containers[0].volumeMounts[3].name: Not found: "big"',
    }


@pytest.mark.parametrize(
    ("limits", "line"),
    [
        (
            {"cpu": "-1"},
            'spec.containers[0].resources.limits[cpu]: Invalid value: "-1": must be greater than or equal to 0',
        ),
        (
            {"cpu": "1ki"},
            'spec.containers[0].resources.limits[cpu]: Invalid value: "1ki": unable to parse quantity\'s suffix',
        ),
        (
            {"memory": True},
            "spec.containers[0].resources.limits[memory]: must be a quantity (a string or a number), not boolean",
        ),
    ],
)
def test_quantities(limits: dict[str, Any], line: str) -> None:
    assert line in lines([builders.container("c", "a", resources={"limits": limits})])


def test_defaults_the_api_server_applies_are_not_errors() -> None:
    c = builders.container(
        "c",
        "a",
        imagePullPolicy="",
        ports=[{"containerPort": 80, "protocol": ""}],
        livenessProbe={"exec": {"command": ["x"]}, "successThreshold": 0, "periodSeconds": 0},
        resources={"limits": {"cpu": 2, "memory": "1Gi"}, "requests": {"cpu": "500m"}},
    )
    assert lines([c]) == []
