"""The enumerated values of the SidecarSet API, defined once.

The model, validation, defaults and the CRD generator all read these, so a value added here is
accepted everywhere at once. They are StrEnums: a member compares equal to the string the API
server stores, so raw JSON and the model can be compared without conversion.
"""

from __future__ import annotations

from enum import StrEnum


class InjectPolicy(StrEnum):
    BEFORE_APP = "BeforeAppContainer"
    AFTER_APP = "AfterAppContainer"


class UpgradeType(StrEnum):
    COLD = "ColdUpgrade"
    HOT = "HotUpgrade"


class SharePolicy(StrEnum):
    ENABLED = "enabled"
    DISABLED = "disabled"


class UpdateType(StrEnum):
    NOT_UPDATE = "NotUpdate"
    ROLLING_UPDATE = "RollingUpdate"


class PatchPolicy(StrEnum):
    RETAIN = "Retain"
    OVERWRITE = "Overwrite"
    MERGE_PATCH_JSON = "MergePatchJson"


class RevisionPolicy(StrEnum):
    ALWAYS = "Always"
    PARTIAL = "Partial"


class TargetContainersMode(StrEnum):
    SUM = "sum"
    MAX = "max"


def values(enum: type[StrEnum]) -> list[str]:
    """The wire values in declaration order (as the CRD schema lists them)."""
    return [member.value for member in enum]
