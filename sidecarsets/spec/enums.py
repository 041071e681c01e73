"""The enumerated values of the SidecarSet API, defined once.

The model, validation, defaults and the CRD generator all read these, so a value added here is
accepted everywhere at once. They are StrEnums: a member compares equal to the string the API
server stores, so raw JSON and the model can be compared without conversion.
"""

from __future__ import annotations

from enum import StrEnum


class InjectPolicy(StrEnum):
    """Where a sidecar goes among the pod's containers: before the app containers, or after them."""

    BEFORE_APP = "BeforeAppContainer"
    AFTER_APP = "AfterAppContainer"


class UpgradeType(StrEnum):
    """Cold: the container restarts on the new image. Hot: a -1/-2 pair hands over without a gap."""

    COLD = "ColdUpgrade"
    HOT = "HotUpgrade"


class SharePolicy(StrEnum):
    """Whether a sidecar also mounts the volumes (or devices) of the pod's app containers."""

    ENABLED = "enabled"
    DISABLED = "disabled"


class UpdateType(StrEnum):
    """Whether injected pods are upgraded in place when the SidecarSet changes."""

    NOT_UPDATE = "NotUpdate"
    ROLLING_UPDATE = "RollingUpdate"


class PatchPolicy(StrEnum):
    """How a patchPodMetadata annotation meets one the pod already has."""

    RETAIN = "Retain"
    OVERWRITE = "Overwrite"
    MERGE_PATCH_JSON = "MergePatchJson"


class RevisionPolicy(StrEnum):
    """Which new pods get a pinned revision: all of them, or those the update strategy holds back."""

    ALWAYS = "Always"
    PARTIAL = "Partial"


class TargetContainersMode(StrEnum):
    """How resourcesPolicy combines the resources of the target containers."""

    SUM = "sum"
    MAX = "max"


def values(enum: type[StrEnum]) -> list[str]:
    """The wire values in declaration order (as the CRD schema lists them)."""
    return [member.value for member in enum]
