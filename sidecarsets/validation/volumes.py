"""Validation of what a SidecarSet adds to the pod besides containers: volumes and pull secrets.

These are merged into the pod by name at injection; a nameless, misnamed or doubly-defined volume,
or one with two sources, would make the merged pod invalid, so they are checked here in the API
server's words. The sources' own fields are left to the API server's pod validation (the CRD
schema already checks their structure).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecarsets.validation.base import (
    Errors,
    FieldError,
    duplicate,
    forbidden,
    is_int,
    list_field,
    objects,
    required,
    type_name,
)
from sidecarsets.validation.podrules import dns_label_errors, quantity_value

# The order in which the API server looks at a volume's sources: the second one found is the one
# reported. Its path for downwardAPI is misspelt ("downwarAPI") in kube-apiserver, and kept so here.
VOLUME_SOURCES = (
    "emptyDir", "hostPath", "gitRepo", "gcePersistentDisk", "awsElasticBlockStore", "secret", "nfs", "iscsi",
    "glusterfs", "flocker", "persistentVolumeClaim", "rbd", "quobyte", "cinder", "cephfs", "flexVolume",
    "downwardAPI", "fc", "configMap", "azureFile", "vsphereVolume", "photonPersistentDisk", "portworxVolume",
    "azureDisk", "storageos", "scaleIO", "projected", "csi", "ephemeral", "image",
)  # fmt: skip
_REPORTED_AS = {"downwardAPI": "downwarAPI"}


def validate_volumes(spec: Mapping[str, Any], errs: Errors) -> set[str]:
    """The volumes as the API server checks a pod's; returns the names of the valid ones (which
    the sidecars' volumeMounts may name: the pod's own volumes are not known here)."""
    valid: set[str] = set()
    seen: set[str] = set()
    for _, path, volume in objects(list_field(spec, "volumes", "spec.volumes", errs), "spec.volumes", errs):
        found: Errors = []
        sources = [key for key in VOLUME_SOURCES if volume.get(key) is not None]
        found.extend(
            forbidden(f"{path}.{_REPORTED_AS.get(key, key)}", "may not specify more than 1 volume type")
            for key in sources[1:]
        )
        empty_dir = volume.get("emptyDir")
        if isinstance(empty_dir, Mapping) and empty_dir.get("sizeLimit") is not None:
            quantity_value(empty_dir["sizeLimit"], f"{path}.emptyDir.sizeLimit", found)
        name = volume.get("name")
        if name is None or name == "":
            found.append(required(f"{path}.name"))
        elif not isinstance(name, str):
            found.append(FieldError(f"{path}.name", f"must be a string, not {type_name(name)}"))
        else:
            found.extend(dns_label_errors(name, f"{path}.name"))
            if name in seen:
                found.append(duplicate(f"{path}.name", name))
            seen.add(name)
            if not found:
                valid.add(name)
        errs.extend(found)
    return valid


def validate_pull_secrets(spec: Mapping[str, Any], errs: Errors) -> None:
    path = "spec.imagePullSecrets"
    for _, item_path, item in objects(list_field(spec, "imagePullSecrets", path, errs), path, errs):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            errs.append(FieldError(f"{item_path}.name", "secret name is required"))


def validate_revision_history_limit(spec: Mapping[str, Any], errs: Errors) -> None:
    limit = spec.get("revisionHistoryLimit")
    if limit is not None and (not is_int(limit) or limit < 0):
        errs.append(FieldError("spec.revisionHistoryLimit", f"must be an integer >= 0, not {limit!r}"))
