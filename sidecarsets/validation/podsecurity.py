"""The Pod Security Standards (baseline, restricted) applied to what a SidecarSet puts into pods.

A namespace that enforces `restricted` refuses every pod whose sidecar runs as root, keeps its
capabilities or lacks a seccomp profile; the user learns it from failed ReplicaSets, long after
the SidecarSet was applied. Here the same checks as kube-apiserver's PodSecurity admission
(k8s.io/pod-security-admission, latest version: the check names, conditions and messages are its
own) run over the SidecarSet's containers, init containers, volumes and patched annotations, so the
validating webhook can warn when the SidecarSet is applied and the controller can say which
namespaces it would break.

A sidecar is judged on its own, as if the pod set nothing at pod level: a pod whose own
securityContext sets runAsNonRoot or a seccomp profile satisfies those two checks for the sidecar
too, which these checks cannot know (they say so: "pod or container ... must set"). Checks of pod
fields a SidecarSet never sets (host namespaces, sysctls) are not run. Pure functions of the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kuberuntime.jsontypes import mapping, resolve
from sidecarsets.spec import names
from sidecarsets.spec.model import SidecarSet

PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)
MODES = ("enforce", "warn", "audit")
LABEL = "pod-security.kubernetes.io/"

_BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
     "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
_RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim", "projected",
     "secret"}
)  # fmt: skip
_VOLUME_SOURCES = ("hostPath", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "nfs", "iscsi", "glusterfs",
                   "rbd", "flexVolume", "cinder", "cephfs", "flocker", "fc", "azureFile", "vsphereVolume", "quobyte",
                   "azureDisk", "photonPersistentDisk", "portworxVolume", "scaleIO", "storageos")  # fmt: skip
_APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


@dataclass(frozen=True)
class Violation:
    """One failed check: PodSecurity's reason ("allowPrivilegeEscalation != false") and detail."""

    level: str
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})"


def namespace_policy(labels: Mapping[str, str]) -> dict[str, str]:
    """The level each mode (enforce, warn, audit) applies in a namespace with these labels, as the API
    server reads them: absent is privileged, an invalid enforce level is restricted (fail closed), an
    invalid warn or audit level privileged, and warn defaults to a stricter enforce level."""
    policy = {}
    for mode in MODES:
        value = labels.get(LABEL + mode)
        if value is None:
            policy[mode] = PRIVILEGED
        elif value in LEVELS:
            policy[mode] = value
        else:
            policy[mode] = RESTRICTED if mode == "enforce" else PRIVILEGED
    if LABEL + "warn" not in labels and LEVELS.index(policy["enforce"]) > LEVELS.index(policy["warn"]):
        policy["warn"] = policy["enforce"]
    return policy


def violations(ss: SidecarSet, level: str) -> list[Violation]:
    """What the SidecarSet's sidecars violate at `level` (restricted includes baseline)."""
    if level not in (BASELINE, RESTRICTED):
        return []
    containers = [c.fresh_container() for c in (*ss.init_containers, *ss.containers)]
    mounted = {n for sc in (*ss.init_containers, *ss.containers) for n in sc.mounted_volume_names()}
    volumes = [v for v in ss.volumes if v.get("name") in mounted]  # only what the pods get
    annotations = {k: v for patch in ss.patch_pod_metadata for k, v in patch.annotations}
    found = _baseline(containers, volumes, annotations, restricted=level == RESTRICTED)
    if level == RESTRICTED:
        found += _restricted(containers, volumes)
    return found


def _names(items: Iterable[Mapping[str, Any]]) -> list[str]:
    return [str(c.get("name")) for c in items]


def _quote(values: Iterable[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _containers(names: Sequence[str]) -> str:
    return f"{'container' if len(names) == 1 else 'containers'} {_quote(names)}"


def _baseline(
    containers: Sequence[Mapping[str, Any]],
    volumes: Sequence[Mapping[str, Any]],
    annotations: Mapping[str, str],
    *,
    restricted: bool,
) -> list[Violation]:
    out: list[Violation] = []

    def add(reason: str, detail: str) -> None:
        out.append(Violation(BASELINE, reason, detail))

    privileged = [c for c in containers if resolve(c, "securityContext", "privileged") is True]
    if privileged:
        add("privileged", f"{_containers(_names(privileged))} must not set securityContext.privileged=true")
    if not restricted:  # restricted's capabilities check replaces this one
        bad, caps = [], set()
        for c in containers:
            added = {
                str(x) for x in resolve(c, "securityContext", "capabilities", "add") or []
            } - _BASELINE_CAPABILITIES
            if added:
                bad.append(str(c.get("name")))
                caps |= added
        if bad:
            add(
                "non-default capabilities",
                f"{_containers(bad)} must not include {_quote(sorted(caps))} in securityContext.capabilities.add",
            )
    host_ports: dict[str, list[str]] = {}
    for c in containers:
        for p in c.get("ports") or []:
            if isinstance(p, Mapping) and p.get("hostPort"):
                host_ports.setdefault(str(c.get("name")), []).append(str(p["hostPort"]))
    if host_ports:
        ports = [p for ps in host_ports.values() for p in ps]
        add("hostPort", f"{_containers(list(host_ports))} {'uses' if len(host_ports) == 1 else 'use'} "
            f"{'hostPort' if len(ports) == 1 else 'hostPorts'} {', '.join(ports)}")  # fmt: skip
    if not restricted:  # restricted's volume check replaces this one
        host_path = [str(v.get("name")) for v in volumes if "hostPath" in v]
        if host_path:
            add("hostPath volumes", f"{'volume' if len(host_path) == 1 else 'volumes'} {_quote(host_path)}")
    proc = [c for c in containers if resolve(c, "securityContext", "procMount") not in (None, "", "Default")]
    if proc:
        add("procMount", f"{_containers(_names(proc))} must not set securityContext.procMount to "
            f"{_quote(sorted({str(resolve(c, 'securityContext', 'procMount')) for c in proc}))}")  # fmt: skip
    selinux = [c for c in containers if not _selinux_ok(resolve(c, "securityContext", "seLinuxOptions"))]
    if selinux:
        add("seLinuxOptions", f"{_containers(_names(selinux))} set forbidden securityContext.seLinuxOptions")
    if not restricted:
        unconfined = [c for c in containers if resolve(c, "securityContext", "seccompProfile", "type") == "Unconfined"]
        if unconfined:
            add(
                "seccompProfile",
                f'{_containers(_names(unconfined))} must not set securityContext.seccompProfile.type to "Unconfined"',
            )
    apparmor = _apparmor(containers, annotations)
    if apparmor:
        add("forbidden AppArmor profile", apparmor)
    host_process = [c for c in containers if resolve(c, "securityContext", "windowsOptions", "hostProcess") is True]
    if host_process:
        add(
            "hostProcess",
            f"{_containers(_names(host_process))} must not set securityContext.windowsOptions.hostProcess=true",
        )
    hosts = _probe_hosts(containers)
    if hosts:
        add("probe or lifecycle host", hosts)
    return out


def _apparmor(containers: Sequence[Mapping[str, Any]], annotations: Mapping[str, str]) -> str | None:
    """The baseline AppArmor check's detail, or None when it passes."""
    apparmor = [c for c in containers if resolve(c, "securityContext", "appArmorProfile", "type") == "Unconfined"]
    apparmor_annotations = [
        f'{k}="{v}"' for k, v in annotations.items()
        if k.startswith(_APPARMOR_ANNOTATION) and v != "runtime/default" and not v.startswith("localhost/")
    ]  # fmt: skip
    if not apparmor and not apparmor_annotations:
        return None
    profiles = (
        [f'{_containers(_names(apparmor))} must not set securityContext.appArmorProfile.type to "Unconfined"']
        if apparmor
        else []
    )
    profiles += [f"forbidden annotation {a}" for a in apparmor_annotations]
    return "; ".join(profiles)


def _probe_hosts(containers: Sequence[Mapping[str, Any]]) -> str | None:
    """The baseline probe/lifecycle host check's detail, or None when it passes."""
    hosts: dict[str, list[str]] = {}
    for c in containers:
        for handler in _handlers(c):
            for kind in ("httpGet", "tcpSocket"):
                host = resolve(handler, kind, "host")
                if host:
                    hosts.setdefault(str(c.get("name")), []).append(str(host))
    if not hosts:
        return None
    every = sorted({h for hs in hosts.values() for h in hs})
    uses = "uses" if len(hosts) == 1 else "use"
    what = "probe or lifecycle host" if len(every) == 1 else "probe or lifecycle hosts"
    return f"{_containers(list(hosts))} {uses} {what} {_quote(every)}"


def _handlers(c: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = [c.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
    lifecycle = c.get("lifecycle")
    if isinstance(lifecycle, Mapping):
        found += [lifecycle.get("postStart"), lifecycle.get("preStop")]
    return [h for h in found if isinstance(h, Mapping)]


def _selinux_ok(opts: Any) -> bool:
    if not isinstance(opts, Mapping):
        return True
    return str(opts.get("type") or "") in _SELINUX_TYPES and not opts.get("user") and not opts.get("role")


def _restricted(containers: Sequence[Mapping[str, Any]], volumes: Sequence[Mapping[str, Any]]) -> list[Violation]:
    out: list[Violation] = []

    def add(reason: str, detail: str) -> None:
        out.append(Violation(RESTRICTED, reason, detail))

    bad_volumes = [v for v in volumes if not (set(v) & _RESTRICTED_VOLUMES)]
    if bad_volumes:
        types = sorted({next((s for s in _VOLUME_SOURCES if s in v), "unknown") for v in bad_volumes})
        plural = len(bad_volumes) != 1
        kinds = "restricted volume types" if len(types) != 1 else "restricted volume type"
        add(
            "restricted volume types",
            f"{'volumes' if plural else 'volume'} {_quote(_names(bad_volumes))} {'use' if plural else 'uses'} "
            f"{kinds} {_quote(types)}",
        )
    escalating = [c for c in containers if resolve(c, "securityContext", "allowPrivilegeEscalation") is not False]
    if escalating:
        add("allowPrivilegeEscalation != false",
            f"{_containers(_names(escalating))} must set securityContext.allowPrivilegeEscalation=false")  # fmt: skip
    missing_drop, adding, caps = [], [], set()
    for c in containers:
        capabilities = mapping(c, "securityContext", "capabilities")
        if "ALL" not in (capabilities.get("drop") or []):
            missing_drop.append(str(c.get("name")))
        added = {str(x) for x in capabilities.get("add") or []} - {"NET_BIND_SERVICE"}
        if added:
            adding.append(str(c.get("name")))
            caps |= added
    details = []
    if missing_drop:
        details.append(f'{_containers(missing_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(
            f"{_containers(adding)} must not include {_quote(sorted(caps))} in securityContext.capabilities.add"
        )
    if details:
        add("unrestricted capabilities", "; ".join(details))
    explicit_root = [c for c in containers if resolve(c, "securityContext", "runAsNonRoot") is False]
    implicit_root = [c for c in containers if resolve(c, "securityContext", "runAsNonRoot") is None]
    if explicit_root:
        add(
            "runAsNonRoot != true",
            f"{_containers(_names(explicit_root))} must not set securityContext.runAsNonRoot=false",
        )
    elif implicit_root:
        add(
            "runAsNonRoot != true",
            f"pod or {_containers(_names(implicit_root))} must set securityContext.runAsNonRoot=true",
        )
    uid0 = [c for c in containers if resolve(c, "securityContext", "runAsUser") == 0]
    if uid0:
        add("runAsUser=0", f"{_containers(_names(uid0))} must not set runAsUser=0")
    bad_seccomp = [
        c
        for c in containers
        if resolve(c, "securityContext", "seccompProfile", "type") not in (None, "RuntimeDefault", "Localhost")
    ]
    no_seccomp = [c for c in containers if not resolve(c, "securityContext", "seccompProfile")]
    if bad_seccomp:
        values = sorted({str(resolve(c, "securityContext", "seccompProfile", "type")) for c in bad_seccomp})
        add(
            "seccompProfile",
            f"{_containers(_names(bad_seccomp))} must not set securityContext.seccompProfile.type to {_quote(values)}",
        )
    elif no_seccomp:
        add(
            "seccompProfile",
            f"pod or {_containers(_names(no_seccomp))} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost"',
        )
    return out


@dataclass(frozen=True)
class Finding:
    """Pods of `namespace` would meet these violations of the level its `mode` applies."""

    namespace: str
    mode: str
    level: str
    violations: tuple[Violation, ...]

    @property
    def outcome(self) -> str:
        return {"enforce": "refused", "warn": "admitted with a warning", "audit": "audited"}[self.mode]


def has_policy(labels: Mapping[str, str]) -> bool:
    """The namespace sets a Pod Security level for some mode (otherwise everything is privileged)."""
    return any(LABEL + mode in labels for mode in MODES)


def findings(ss: SidecarSet, namespaces: Mapping[str, Mapping[str, str]], *, skip: Iterable[str] = ()) -> list[Finding]:
    """For each namespace `ss` selects (the ones in `skip` never get sidecars), the strictest mode
    its sidecars violate: enforce (pods refused), else warn, else audit."""
    by_level: dict[str, tuple[Violation, ...]] = {}
    skipped = set(skip)
    out = []
    for name in sorted(namespaces):
        labels = namespaces[name]
        if name in skipped or not has_policy(labels) or not ss.matches_namespace(name, labels):
            continue
        policy = namespace_policy(labels)
        for mode in MODES:
            level = policy[mode]
            if level not in by_level:
                by_level[level] = tuple(violations(ss, level))
            if by_level[level]:
                out.append(Finding(name, mode, level, by_level[level]))
                break
    return out


def warnings(found: Sequence[Finding], *, limit: int = 10) -> list[str]:
    """Admission warnings: one per (mode, level), naming up to `limit` namespaces and every violation."""
    grouped: dict[tuple[str, str], list[Finding]] = {}
    for f in found:
        grouped.setdefault((f.mode, f.level), []).append(f)
    out = []
    for (mode, level), group in grouped.items():
        shown = ", ".join(f.namespace for f in group[:limit])
        more = f" and {len(group) - limit} more" if len(group) > limit else ""
        details = "; ".join(str(v) for v in group[0].violations)
        out.append(
            f'PodSecurity "{level}" ({mode}) in namespace{"s" if len(group) > 1 else ""} {shown}{more}: '
            f"pods with these sidecars would be {group[0].outcome}: {details}"
        )
    return out


def condition(found: Sequence[Finding], *, limit: int = 10) -> dict[str, str]:
    """The SidecarSet's `PodSecurity` status condition (type, status, reason, message)."""
    if not found:
        return {
            "type": names.CONDITION_POD_SECURITY,
            "status": "True",
            "reason": "Compliant",
            "message": "the sidecars meet the Pod Security level of every selected namespace",
        }
    parts = [f"{f.namespace} ({f.mode} {f.level}): {f.violations[0]}" for f in found[:limit]]
    more = f"; and {len(found) - limit} more namespaces" if len(found) > limit else ""
    return {
        "type": names.CONDITION_POD_SECURITY,
        "status": "False",
        "reason": "Violations",
        "message": f"{len(found)} selected namespace(s) whose Pod Security level the sidecars violate: "
        + "; ".join(parts)
        + more,
    }
