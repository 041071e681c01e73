"""What one manual-injection run works with, and what it collects: the Context (SidecarSets,
namespaces, revisions, time), the Notes said once at the end, the Stats of each file.

Kept apart from the injection itself (injector.manifests.manifests): the CLI builds the Context and reports
the Notes and Stats, and pin resolution (injector.manifests.manifestpins) reads the Context as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

TemplateKey = tuple[str, str]  # (API group, kind); "" is the core group

# Where each workload kind keeps its pod template; () is the object itself (a Pod).
WORKLOAD_TEMPLATES: dict[TemplateKey, tuple[str, ...]] = {
    ("", "Pod"): (),
    ("", "ReplicationController"): ("spec", "template"),
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}

_MAX_SUBJECTS = 3


class ManifestError(ValueError):
    """An object that cannot be injected; the message names the object and the field."""


@dataclass(frozen=True, slots=True)
class Note:
    """A warning about something that was not injected, or not as asked; said once per run."""

    message: str
    level: str = "warning"


class Notes:
    """Warnings collected over a run: each said once, naming the objects (or files) it concerns."""

    def __init__(self) -> None:
        self._subjects: dict[Note, list[str]] = {}

    def add(self, message: str, subject: str | None = None, *, level: str = "warning") -> None:
        subjects = self._subjects.setdefault(Note(message, level), [])
        if subject is not None and subject not in subjects:
            subjects.append(subject)

    def lines(self) -> list[str]:
        """`level: subjects: message`, in the order first seen; long subject lists are cut short."""
        out = []
        for note, subjects in self._subjects.items():
            shown = ", ".join(subjects[:_MAX_SUBJECTS])
            if len(subjects) > _MAX_SUBJECTS:
                shown += f" and {len(subjects) - _MAX_SUBJECTS} more"
            out.append(f"{note.level}: {shown}: {note.message}" if shown else f"{note.level}: {note.message}")
        return out

    def __bool__(self) -> bool:
        return bool(self._subjects)


@dataclass(slots=True)
class Stats:
    """What happened to the pods of a file, for the "nothing matched" warning."""

    pods: int = 0
    injected: int = 0
    already: int = 0
    unmatched: int = 0

    def add(self, other: Stats) -> None:
        self.pods += other.pods
        self.injected += other.injected
        self.already += other.already
        self.unmatched += other.unmatched


@dataclass(slots=True)
class Context:
    """What manual injection knows: the SidecarSets, the declared namespaces, revisions and time."""

    sidecarsets: Sequence[SidecarSet]
    # A fixed `updateTimestamp`; None: each SidecarSet's own last change (`last_change`).
    now: str | None = None
    # Labels per namespace name; `default_labels` for any namespace not listed; None = unknown.
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    default_labels: Mapping[str, str] | None = None
    manager_namespace: str = names.DEFAULT_MANAGER_NAMESPACE
    # The namespace of objects that name none (`-n`); None: such objects are not namespace-scoped.
    default_namespace: str | None = None
    templates: Mapping[TemplateKey, tuple[str, ...]] = field(default_factory=lambda: dict(WORKLOAD_TEMPLATES))
    # ControllerRevision name → object; None: none were given (pins then use the current spec).
    revisions: Mapping[str, JsonObj] | None = None
    notes: Notes = field(default_factory=Notes)
    _pinned: dict[tuple[str, str], SidecarSet] = field(default_factory=dict)
    _stamps: dict[str, str] = field(default_factory=dict)
    _by_name: dict[str, SidecarSet] = field(default_factory=dict)

    def labels_of(self, namespace: str) -> Mapping[str, str] | None:
        return self.namespace_labels.get(namespace, self.default_labels)

    def sidecarset(self, name: str) -> SidecarSet | None:
        if not self._by_name:
            self._by_name.update((ss.name, ss) for ss in self.sidecarsets)
        return self._by_name.get(name)
