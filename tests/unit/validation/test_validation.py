"""One test per validation rule: a valid base object, one mutation, the field and the message."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from sidecarsets.validation import FieldError, validate_sidecarset
from tests.kube import builders
from tests.unit.install.test_crd_schema import kruise_sample

Obj = dict[str, Any]


def base() -> Obj:
    """A valid SidecarSet using most of the spec: a log agent with env and a mount, an init container, a volume."""
    agent = builders.container(
        "agent",
        "agent:1",
        env=[{"name": "LEVEL", "value": "info"}],
        volumeMounts=[{"name": "logs", "mountPath": "/var/log"}],
    )
    return builders.sidecarset(
        "log-agent",
        containers=[agent],
        initContainers=[builders.container("setup", "setup:1")],
        volumes=[{"name": "logs", "emptyDir": {}}],
    )


def errors_after(mutate: Callable[[Obj], Any], **kwargs: Any) -> list[FieldError]:
    obj = base()
    mutate(obj)
    return validate_sidecarset(obj, **kwargs)


def assert_error(errs: list[FieldError], field: str, fragment: str) -> None:
    matching = [e for e in errs if e.field == field and fragment in e.reason]
    assert matching, f"no error on {field} containing {fragment!r}; got {[str(e) for e in errs]}"


def spec(obj: Obj) -> Obj:
    value: Obj = obj["spec"]
    return value


def container(obj: Obj, i: int = 0) -> Obj:
    value: Obj = obj["spec"]["containers"][i]
    return value


def test_base_is_valid() -> None:
    assert validate_sidecarset(base()) == []


def test_kruise_sample_is_valid() -> None:
    assert validate_sidecarset(kruise_sample()) == []


def test_kruise_sample_with_kruise_api_version_is_valid() -> None:
    sample = kruise_sample()
    sample["apiVersion"] = "apps.kruise.io/v1alpha1"
    assert validate_sidecarset(sample) == []


def test_field_error_str() -> None:
    assert str(FieldError("spec.selector", "no selector")) == "spec.selector: no selector"


def test_every_problem_is_reported_not_just_the_first() -> None:
    def mutate(obj: Obj) -> None:
        obj["metadata"]["name"] = "bad_name"
        del spec(obj)["selector"]
        container(obj)["image"] = ""

    errs = errors_after(mutate)
    assert {e.field for e in errs} >= {"metadata.name", "spec.selector", "spec.containers[0].image"}


# --- metadata ---------------------------------------------------------------------------------


def test_name_characters() -> None:
    errs = errors_after(lambda o: o["metadata"].update(name="log.agent"))
    assert_error(errs, "metadata.name", "alphanumeric characters or '-'")


def test_name_length() -> None:
    errs = errors_after(lambda o: o["metadata"].update(name="a" * 64))
    assert_error(errs, "metadata.name", "no more than 63")
    assert validate_sidecarset({**base(), "metadata": {"name": "A" * 63}}) == []


def test_name_required() -> None:
    assert_error(errors_after(lambda o: o.update(metadata={})), "metadata.name", "required")


def test_not_an_object() -> None:
    assert_error(validate_sidecarset([1, 2]), "SidecarSet", "JSON object")  # type: ignore[arg-type]


def test_spec_required_and_an_object() -> None:
    assert_error(errors_after(lambda o: o.pop("spec")), "spec", "required")
    assert_error(errors_after(lambda o: o.update(spec=[])), "spec", "must be an object")


# --- selectors and namespaces -----------------------------------------------------------------


def test_selector_nil() -> None:
    errs = errors_after(lambda o: spec(o).pop("selector"))
    assert_error(errs, "spec.selector", "no selector defined for SidecarSet")


def test_selector_empty() -> None:
    errs = errors_after(lambda o: spec(o).update(selector={"matchLabels": {}}))
    assert_error(errs, "spec.selector", "empty selector is not valid")


def test_selector_malformed() -> None:
    bad = {"matchExpressions": [{"key": "app", "operator": "Near", "values": ["x"]}]}
    errs = errors_after(lambda o: spec(o).update(selector=bad))
    assert_error(errs, "spec.selector", "operator 'Near'")


def test_selector_bad_label_key() -> None:
    errs = errors_after(lambda o: spec(o).update(selector={"matchLabels": {"bad key": "x"}}))
    assert_error(errs, "spec.selector.matchLabels", "not a qualified name")


def test_namespace_selector_empty() -> None:
    errs = errors_after(lambda o: spec(o).update(namespaceSelector={}))
    assert_error(errs, "spec.namespaceSelector", "empty selector is not valid")


def test_namespace_selector_malformed() -> None:
    errs = errors_after(lambda o: spec(o).update(namespaceSelector={"matchLabels": "shop"}))
    assert_error(errs, "spec.namespaceSelector", "matchLabels")


def test_namespace_and_namespace_selector_together_are_accepted() -> None:
    def mutate(obj: Obj) -> None:
        spec(obj)["namespace"] = "shop"
        spec(obj)["namespaceSelector"] = {"matchLabels": {"team": "a"}}

    assert errors_after(mutate) == []


def test_namespace_must_be_a_dns_label() -> None:
    assert_error(errors_after(lambda o: spec(o).update(namespace="Shop_1")), "spec.namespace", "DNS-1123 label")


# --- injection strategy -----------------------------------------------------------------------


def test_revision_without_name_or_version() -> None:
    errs = errors_after(lambda o: spec(o).update(injectionStrategy={"revision": {"policy": "Always"}}))
    assert_error(errs, "spec.injectionStrategy.revision", "cannot be empty simultaneously")


def test_revision_unknown_policy() -> None:
    revision = {"revisionName": "log-agent-abc", "policy": "Sometimes"}
    errs = errors_after(lambda o: spec(o).update(injectionStrategy={"revision": revision}))
    assert_error(errs, "spec.injectionStrategy.revision.policy", "Invalid policy 'Sometimes'")


def test_revision_by_custom_version_is_valid() -> None:
    assert errors_after(lambda o: spec(o).update(injectionStrategy={"revision": {"customVersion": "v2"}})) == []


# --- update strategy --------------------------------------------------------------------------


def with_strategy(strategy: Obj) -> list[FieldError]:
    return errors_after(lambda o: spec(o).update(updateStrategy=strategy))


@pytest.mark.parametrize("partition", ["30%", 3])
def test_partition_with_selector(partition: Any) -> None:
    errs = with_strategy({"partition": partition, "selector": {"matchLabels": {"canary": "true"}}})
    assert_error(errs, "spec.updateStrategy.partition", "Partition and Selector cannot be used together")


def test_partition_zero_with_selector_is_valid() -> None:
    assert with_strategy({"partition": 0, "selector": {"matchLabels": {"canary": "true"}}}) == []


def test_partition_with_selector_is_valid_under_not_update() -> None:
    strategy = {"type": "NotUpdate", "partition": 2, "selector": {"matchLabels": {"canary": "true"}}}
    assert with_strategy(strategy) == []


def test_update_selector_empty() -> None:
    assert_error(with_strategy({"selector": {}}), "spec.updateStrategy.selector", "empty selector")


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("partition", -1, ">= 0"),
        ("partition", "101%", "more than 100%"),
        ("partition", "half", "percentage"),
        ("maxUnavailable", "-5%", "percentage"),
        ("maxUnavailable", True, "not an integer"),
    ],
)
def test_int_or_percent(field: str, value: Any, fragment: str) -> None:
    assert_error(with_strategy({field: value}), f"spec.updateStrategy.{field}", fragment)


def test_update_type_unknown() -> None:
    assert_error(with_strategy({"type": "OnDelete"}), "spec.updateStrategy.type", "unsupported update strategy type")


def test_priority_both_kinds() -> None:
    priority = {
        "weightPriority": [{"weight": 10, "matchSelector": {"matchLabels": {"a": "b"}}}],
        "orderPriority": [{"orderedKey": "rank"}],
    }
    errs = with_strategy({"priorityStrategy": priority})
    assert_error(errs, "spec.updateStrategy.priorityStrategy", "only one of weightPriority and orderPriority")


@pytest.mark.parametrize("weight", [0, 101, "50"])
def test_priority_weight_range(weight: Any) -> None:
    priority = {"weightPriority": [{"weight": weight, "matchSelector": {"matchLabels": {"a": "b"}}}]}
    errs = with_strategy({"priorityStrategy": priority})
    assert_error(errs, "spec.updateStrategy.priorityStrategy.weightPriority[0].weight", "range 1-100")


def test_priority_selector_empty() -> None:
    priority = {"weightPriority": [{"weight": 5, "matchSelector": {}}]}
    errs = with_strategy({"priorityStrategy": priority})
    assert_error(errs, "spec.updateStrategy.priorityStrategy.weightPriority[0].matchSelector", "empty selector")


def test_priority_order_key_empty() -> None:
    errs = with_strategy({"priorityStrategy": {"orderPriority": [{"orderedKey": ""}]}})
    assert_error(errs, "spec.updateStrategy.priorityStrategy.orderPriority[0].orderedKey", "order key can not be empty")


def test_scatter_empty_key() -> None:
    errs = with_strategy({"scatterStrategy": [{"key": "", "value": "a"}]})
    assert_error(errs, "spec.updateStrategy.scatterStrategy[0].key", "key should not be empty")


def test_scatter_duplicate() -> None:
    errs = with_strategy({"scatterStrategy": [{"key": "zone", "value": "a"}, {"key": "zone", "value": "a"}]})
    assert_error(errs, "spec.updateStrategy.scatterStrategy[1]", "duplicated key=zone value=a")


# --- containers -------------------------------------------------------------------------------


def test_no_containers_at_all() -> None:
    def mutate(obj: Obj) -> None:
        spec(obj)["containers"] = []
        del spec(obj)["initContainers"]

    assert_error(errors_after(mutate), "spec", "Required value: no initContainer or container defined for SidecarSet")


def test_init_containers_alone_are_enough() -> None:
    assert errors_after(lambda o: spec(o).pop("containers")) == []


def test_unsupported_pod_inject_policy() -> None:
    errs = errors_after(lambda o: container(o).update(podInjectPolicy="Middle"))
    assert_error(errs, "spec.containers[0].podInjectPolicy", "unsupported pod inject policy")


def test_unsupported_pod_inject_policy_on_init_container() -> None:
    errs = errors_after(lambda o: spec(o)["initContainers"][0].update(podInjectPolicy="First"))
    assert_error(errs, "spec.initContainers[0].podInjectPolicy", "unsupported pod inject policy")


def test_unsupported_share_volume_policy() -> None:
    errs = errors_after(lambda o: container(o).update(shareVolumePolicy={"type": "sometimes"}))
    assert_error(errs, "spec.containers[0].shareVolumePolicy.type", "unsupported share volume policy")


def test_unsupported_share_volume_device_policy() -> None:
    errs = errors_after(lambda o: container(o).update(shareVolumeDevicePolicy={"type": "on"}))
    assert_error(errs, "spec.containers[0].shareVolumeDevicePolicy.type", "unsupported share volume policy")


def test_unsupported_upgrade_type() -> None:
    errs = errors_after(lambda o: container(o).update(upgradeStrategy={"upgradeType": "WarmUpgrade"}))
    assert_error(errs, "spec.containers[0].upgradeStrategy.upgradeType", "unsupported upgrade type")


def test_duplicate_container_names() -> None:
    errs = errors_after(lambda o: spec(o)["containers"].append({"name": "agent", "image": "b:1"}))
    assert_error(errs, "spec.containers[1].name", 'Duplicate value: "agent"')


def test_duplicate_names_across_containers_and_init_containers() -> None:
    errs = errors_after(lambda o: spec(o)["initContainers"][0].update(name="agent"))
    assert_error(errs, "spec.initContainers[0].name", 'Duplicate value: "agent"')


@pytest.mark.parametrize(
    ("name", "fragment"),
    [("Agent", "RFC 1123 label"), ("agent_1", "RFC 1123 label"), ("-agent", "RFC 1123 label"), ("a" * 64, "63")],
)
def test_container_name_is_a_dns_label(name: str, fragment: str) -> None:
    assert_error(errors_after(lambda o: container(o).update(name=name)), "spec.containers[0].name", fragment)


def test_container_name_required() -> None:
    assert_error(errors_after(lambda o: container(o).pop("name")), "spec.containers[0].name", "Required value")


@pytest.mark.parametrize(
    ("image", "fragment"),
    [("", "Required value"), (None, "Required value"), ("  ", "leading or trailing whitespace"), (5, "string")],
)
def test_image_required(image: Any, fragment: str) -> None:
    assert_error(errors_after(lambda o: container(o).update(image=image)), "spec.containers[0].image", fragment)


def test_env_name_invalid() -> None:
    errs = errors_after(lambda o: container(o)["env"].append({"name": "A=B", "value": "x"}))
    assert_error(errs, "spec.containers[0].env[1].name", "other than '='")


def test_volume_mount_must_name_a_volume_of_the_sidecarset() -> None:
    # As in Kruise: the pod's volumes are unknown here (shareVolumePolicy reaches them).
    mount = {"name": "app-data", "mountPath": "/data"}
    errs = errors_after(lambda o: container(o)["volumeMounts"].append(mount))
    assert [str(e) for e in errs] == ['spec.containers[0].volumeMounts[1].name: Not found: "app-data"']


def test_volume_mount_path_twice() -> None:
    errs = errors_after(lambda o: container(o)["volumeMounts"].append({"name": "x", "mountPath": "/var/log"}))
    assert_error(errs, "spec.containers[0].volumeMounts[1].mountPath", 'Invalid value: "/var/log": must be unique')


def test_volume_mount_without_name() -> None:
    errs = errors_after(lambda o: container(o)["volumeMounts"].append({"mountPath": "/x"}))
    assert_error(errs, "spec.containers[0].volumeMounts[1].name", "Required value")


def test_container_port_range() -> None:
    errs = errors_after(lambda o: container(o).update(ports=[{"containerPort": 70000}]))
    assert_error(errs, "spec.containers[0].ports[0].containerPort", "must be between 1 and 65535, inclusive")


# --- transferEnv ------------------------------------------------------------------------------


def with_transfer(entry: Obj) -> list[FieldError]:
    return errors_after(lambda o: container(o).update(transferEnv=[entry]))


def field_ref(path: str, api_version: str | None = "v1") -> Obj:
    ref: Obj = {"fieldPath": path}
    if api_version is not None:
        ref["apiVersion"] = api_version
    return {"sourceContainerNameFrom": {"fieldRef": ref}, "envName": "TZ"}


def test_transfer_env_valid_forms() -> None:
    assert with_transfer({"sourceContainerName": "main", "envNames": ["TZ", "LANG"]}) == []
    for path in ("metadata.labels['app']", "metadata.annotations['example.com/Main']"):
        assert with_transfer(field_ref(path)) == [], path


def test_transfer_env_refuses_metadata_name_as_kruise_does() -> None:
    errs = with_transfer(field_ref("metadata.name"))
    assert_error(
        errs, "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef.fieldPath", "'metadata.name'"
    )
    assert "metadata.labels['<KEY>'] or metadata.annotations['<KEY>']" in str(errs[0])
    assert str(errs[0]).startswith("spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef.fieldPath: ")


def test_transfer_env_both_sources() -> None:
    entry = {**field_ref("metadata.labels['app']"), "sourceContainerName": "main"}
    assert_error(with_transfer(entry), "spec.containers[0].transferEnv[0]", "exactly one of sourceContainerName")


def test_transfer_env_no_source() -> None:
    assert_error(with_transfer({"envName": "TZ"}), "spec.containers[0].transferEnv[0]", "exactly one of")


def test_transfer_env_field_ref_needs_api_version() -> None:
    errs = with_transfer(field_ref("metadata.labels['app']", api_version=None))
    assert_error(errs, "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef.apiVersion", "required")


def test_transfer_env_field_ref_needs_field_path() -> None:
    errs = with_transfer(field_ref(""))
    assert_error(errs, "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef.fieldPath", "required")


def test_transfer_env_source_from_needs_field_ref() -> None:
    errs = with_transfer({"sourceContainerNameFrom": {}, "envName": "TZ"})
    assert_error(errs, "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef", "required")


@pytest.mark.parametrize("path", ["spec.nodeName", "metadata.labels", "metadata.uid", "status.podIP", "metadata.name"])
def test_transfer_env_field_path_not_allowed(path: str) -> None:
    errs = with_transfer(field_ref(path))
    assert_error(errs, "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef.fieldPath", "not supported")


def test_transfer_env_field_path_bad_key() -> None:
    errs = with_transfer(field_ref("metadata.labels['bad key']"))
    assert_error(errs, "spec.containers[0].transferEnv[0].sourceContainerNameFrom.fieldRef.fieldPath", "qualified")


def test_transfer_env_needs_env_name_or_names() -> None:
    errs = with_transfer({"sourceContainerName": "main", "envNames": []})
    assert_error(errs, "spec.containers[0].transferEnv[0]", "one of envName or envNames")


def test_transfer_env_bad_env_name() -> None:
    errs = with_transfer({"sourceContainerName": "main", "envNames": ["OK", "NOT=OK"]})
    assert_error(errs, "spec.containers[0].transferEnv[0].envNames[1]", "other than '='")


# --- resourcesPolicy --------------------------------------------------------------------------


def policy(**overrides: Any) -> Obj:
    value: Obj = {
        "targetContainersMode": "sum",
        "targetContainersNameRegex": "^app.*$",
        "resourcesExpr": {"limits": {"cpu": "max(cpu*50%, 50m)", "memory": "200Mi"}},
    }
    value.update(overrides)
    return value


def with_policy(value: Obj, *, resources: Obj | None = None) -> list[FieldError]:
    def mutate(obj: Obj) -> None:
        container(obj)["resourcesPolicy"] = value
        if resources is not None:
            container(obj)["resources"] = resources

    return errors_after(mutate)


def test_resources_policy_valid() -> None:
    assert with_policy(policy()) == []


def test_resources_policy_with_resources() -> None:
    errs = with_policy(policy(), resources={"limits": {"cpu": "1"}})
    assert_error(errs, "spec.containers[0].resourcesPolicy", "cannot be configured together")


def test_resources_policy_empty_regex() -> None:
    errs = with_policy(policy(targetContainersNameRegex=""))
    assert_error(errs, "spec.containers[0].resourcesPolicy.targetContainersNameRegex", "invalid empty regex")


def test_resources_policy_bad_regex() -> None:
    errs = with_policy(policy(targetContainersNameRegex="app(("))
    assert_error(errs, "spec.containers[0].resourcesPolicy.targetContainersNameRegex", "invalid regex pattern")


def test_resources_policy_needs_limits_or_requests() -> None:
    errs = with_policy(policy(resourcesExpr={}))
    assert_error(errs, "spec.containers[0].resourcesPolicy.resourcesExpr", "at least one of limits or requests")


def test_resources_policy_mode() -> None:
    errs = with_policy(policy(targetContainersMode="avg"))
    assert_error(errs, "spec.containers[0].resourcesPolicy.targetContainersMode", 'Unsupported value: "avg"')


@pytest.mark.parametrize("expr", ["max(cpu*50%", "cpu +", "memory*2", "sqrt(cpu)", "50 m"])
def test_resources_policy_bad_expression(expr: str) -> None:
    errs = with_policy(policy(resourcesExpr={"requests": {"cpu": expr}}))
    assert_error(errs, "spec.containers[0].resourcesPolicy.resourcesExpr.requests.cpu", "invalid expression")


def test_resources_policy_on_plain_init_container() -> None:
    errs = errors_after(lambda o: spec(o)["initContainers"][0].update(resourcesPolicy=policy()))
    assert_error(errs, "spec.initContainers[0].resourcesPolicy", "RestartPolicy Always")
    native = {"restartPolicy": "Always", "resourcesPolicy": policy()}
    assert errors_after(lambda o: spec(o)["initContainers"][0].update(native)) == []


# --- volumes, pull secrets, history -------------------------------------------------------------


def test_duplicate_volume_names() -> None:
    errs = errors_after(lambda o: spec(o)["volumes"].append({"name": "logs", "hostPath": {"path": "/l"}}))
    assert_error(errs, "spec.volumes[1].name", 'Duplicate value: "logs"')


def test_volume_with_two_sources() -> None:
    errs = errors_after(lambda o: spec(o)["volumes"][0].update(hostPath={"path": "/l"}))
    assert_error(errs, "spec.volumes[0].hostPath", "Forbidden: may not specify more than 1 volume type")


def test_volume_name_required() -> None:
    assert_error(
        errors_after(lambda o: spec(o)["volumes"].append({"emptyDir": {}})), "spec.volumes[1].name", "Required value"
    )


def test_pull_secret_name_required() -> None:
    errs = errors_after(lambda o: spec(o).update(imagePullSecrets=[{}]))
    assert_error(errs, "spec.imagePullSecrets[0].name", "required")


def test_revision_history_limit_negative() -> None:
    assert_error(errors_after(lambda o: spec(o).update(revisionHistoryLimit=-1)), "spec.revisionHistoryLimit", ">= 0")


# --- patchPodMetadata -------------------------------------------------------------------------


def with_patches(*patches: Obj) -> list[FieldError]:
    return errors_after(lambda o: spec(o).update(patchPodMetadata=list(patches)))


def test_patch_annotations_required() -> None:
    assert_error(with_patches({"patchPolicy": "Retain"}), "spec.patchPodMetadata[0].annotations", "no annotations")
    assert_error(with_patches({"annotations": {}}), "spec.patchPodMetadata[0].annotations", "no annotations")


def test_patch_policy_value() -> None:
    errs = with_patches({"annotations": {"a": "b"}, "patchPolicy": "Merge"})
    assert_error(errs, "spec.patchPodMetadata[0].patchPolicy", "unsupported patchPolicy 'Merge'")


@pytest.mark.parametrize("value", ["not json", "[1, 2]", "3"])
def test_merge_patch_json_values_must_be_objects(value: str) -> None:
    errs = with_patches({"annotations": {"oom-score": value}, "patchPolicy": "MergePatchJson"})
    assert_error(errs, "spec.patchPodMetadata[0].annotations[oom-score]", "JSON object")


def test_merge_patch_json_object_is_valid() -> None:
    assert with_patches({"annotations": {"oom-score": '{"agent": 1}'}, "patchPolicy": "MergePatchJson"}) == []


def test_patch_annotation_key_twice() -> None:
    errs = with_patches({"annotations": {"a": "1"}}, {"annotations": {"a": "2"}, "patchPolicy": "Overwrite"})
    assert_error(errs, "spec.patchPodMetadata[1].annotations[a]", "already exists in spec.patchPodMetadata[0]")


def test_patch_annotation_key_invalid() -> None:
    errs = with_patches({"annotations": {"bad key!": "1"}})
    assert_error(errs, "spec.patchPodMetadata[0].annotations[bad key!]", "qualified name")


def test_any_annotation_key_is_allowed_without_a_whitelist() -> None:
    assert with_patches({"annotations": {"sidecar.istio.io/inject": "true"}, "patchPolicy": "Overwrite"}) == []


# --- defaults are applied before validating ---------------------------------------------------


def test_validates_the_defaulted_object() -> None:
    obj = base()
    obj["spec"]["patchPodMetadata"] = [{"annotations": {"a": "b"}}]  # no patchPolicy: Retain
    obj["spec"]["injectionStrategy"] = {"revision": {"revisionName": "r"}}  # no policy: Always
    assert validate_sidecarset(obj) == []
    assert "patchPolicy" not in obj["spec"]["patchPodMetadata"][0]


def test_input_is_not_modified() -> None:
    obj = base()
    before = copy.deepcopy(obj)
    validate_sidecarset(obj, old=copy.deepcopy(obj), others=[copy.deepcopy(obj)])
    assert obj == before
