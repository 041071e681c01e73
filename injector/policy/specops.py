"""CEL for the pod spec's lists in a policy: the injected containers and init containers placed as
the engine places them, then the volumes and image pull secrets they need.

One part of the policy generator (injector.policy.generate), the largest: the container literals,
the shared volumes and their subPathExpr env vars, transferred env vars, and the JSONPatch
operations that put each list together.
"""

from __future__ import annotations

from injector.policy import cel, podfields
from injector.policy.build import Part, V
from kuberuntime.jsontypes import JsonObj
from sidecarsets.spec import names
from sidecarsets.spec.enums import InjectPolicy
from sidecarsets.spec.sidecar import SidecarContainer

_LISTS = ("env", "volumeMounts", "volumeDevices")


class SpecOps(Part):
    """Containers, init containers, volumes and pull secrets of the policy's patch."""

    # -- containers ---------------------------------------------------------------------------------
    def _shared(self, apps: str) -> tuple[str | None, str | None, str | None]:
        every = [sc for ss in self.group for sc in ss.containers + ss.init_containers]
        mounts = env = devices = None
        if any(sc.share_volumes for sc in every):
            mounts = self.b.var(
                "sharedMounts",
                f"{apps}.map(c, has(c.volumeMounts) ? c.volumeMounts : []).flatten().map(m, {podfields.mount('m')})",
            )
            refs = 'm.subPathExpr.findAll("\\\\$\\\\([^()]+\\\\)").map(r, r.substring(2, size(r) - 1))'
            env = self.b.var(
                "sharedEnv",
                f'{apps}.map(c, has(c.volumeMounts) && has(c.env) ? c.volumeMounts.map(m, has(m.subPathExpr) && m.subPathExpr != "" ? '
                f"c.env.filter(e, e.name in {refs}) : []).flatten() : []).flatten().map(e, {podfields.env('e')})",
            )
        if any(sc.share_volume_devices for sc in every):
            devices = self.b.var(
                "sharedDevices",
                f"{apps}.map(c, has(c.volumeDevices) ? c.volumeDevices : []).flatten().map(d, {podfields.device('d')})",
            )
        return mounts, env, devices

    def _transferred(self, sc: SidecarContainer, labels: str, anns: str) -> list[str]:
        parts = []
        for te in sc.transfer_env:
            if te.source_field_path is None:
                source = cel.string(te.source_container_name or "")
            elif te.source_field_path == "metadata.name":
                source = '(has(object.metadata.name) ? string(object.metadata.name) : "")'
            else:
                section, _, rest = te.source_field_path.partition("['")
                key = rest[:-2]
                where = labels if section.endswith("labels") else anns
                source = f'({cel.string(key)} in {where} ? string({where}[{cel.string(key)}]) : "")'
            # As the engine: in the (sorted) order of the names, each var's last definition in the source.
            parts.append(
                f"object.spec.containers.filter(c, c.name == {source}).map(c, has(c.env) ? "
                f"{cel.strings(te.env_names)}.map(n, c.env.filter(e, e.name == n)).filter(l, size(l) > 0)"
                f".map(l, l[size(l) - 1]) : []).flatten().map(e, {podfields.env('e')})"
            )
        return parts

    def _container(
        self, key: str, image_key: str, sc: SidecarContainer, shared: tuple[str | None, str | None, str | None]
    ) -> str:
        """CEL for the container as it goes into the pod (engine._sidecar). Its image is read from the
        parameter object under `image_key`, so a new image rewrites no CEL."""
        mounts, shared_env, devices = shared
        c = sc.fresh_container()
        own_env = [e for e in c.get("env") or [] if e.get("name") != names.ENV_IS_INJECTED]
        own_env.append({"name": names.ENV_IS_INJECTED, "value": "true"})
        items = [
            f"{cel.string(k)}: dyn({self.b.param(image_key, v) if k == 'image' and isinstance(v, str) else cel.literal(v)})"
            for k, v in c.items()
            if k not in _LISTS
        ]
        parts = self._transferred(sc, V + "labels", V + "anns")
        if sc.share_volumes and shared_env is not None:
            parts.append(shared_env)
        env = cel.literal(own_env)
        if parts:
            extra = self.b.var(f"extraEnv{key}", " + ".join(parts))
            env += " + " + _unique(extra, "name", [e["name"] for e in own_env])
        items.append(f'"env": dyn({env})')
        own_mounts = c.get("volumeMounts") or []
        if sc.share_volumes and mounts is not None:
            unique = _unique(mounts, "mountPath", [m["mountPath"] for m in own_mounts])
            items.append(f'"volumeMounts": dyn({cel.literal(own_mounts)} + {unique})')
        elif "volumeMounts" in c:
            items.append(f'"volumeMounts": dyn({cel.literal(own_mounts)})')
        own_devices = c.get("volumeDevices") or []
        if sc.share_volume_devices and devices is not None:
            unique = _unique(devices, "devicePath", [d["devicePath"] for d in own_devices])
            items.append(f'"volumeDevices": dyn({cel.literal(own_devices)} + {unique})')
        elif "volumeDevices" in c:
            items.append(f'"volumeDevices": dyn({cel.literal(own_devices)})')
        return self.b.var(f"c{key}", "{" + ", ".join(items) + "}")

    def _place(
        self, path: str, existing: str, items: list[tuple[str, InjectPolicy, str, str]], *, optional: bool
    ) -> None:
        """Operations for one container list (engine placement): replace same names, Before block, append."""
        if not items:
            return

        def when(ok: str, more: str) -> str:
            return more if ok == "true" else f"{ok} && {more}"

        item = cel.string(path + "/")
        replace = " + ".join(
            f"({when(ok, f'{cel.string(n)} in {existing}')} ? "
            f"[{cel.patch_op('replace', item + ' + string(' + existing + '.indexOf(' + cel.string(n) + '))', e)}] : [])"
            for ok, _, n, e in items
        )
        absent = [(ok, p, f"({when(ok, f'!({cel.string(n)} in {existing})')} ? [{e}] : [])") for ok, p, n, e in items]
        key = path.rsplit("/", 1)[1]
        before = self.b.var(
            f"before_{key}", " + ".join(x for _, p, x in absent if p == InjectPolicy.BEFORE_APP) or "[]"
        )
        after = self.b.var(f"after_{key}", " + ".join(x for _, p, x in absent if p != InjectPolicy.BEFORE_APP) or "[]")
        adds = (
            f"lists.range(size({before})).map(j, {cel.patch_op('add', item + ' + string(j)', before + '[j]')})"
            f" + {after}.map(x, {cel.patch_op('add', cel.string(path + '/-'), 'x')})"
        )
        if optional:  # the whole list is added when the pod has none
            whole = f"[{cel.patch_op('add', cel.string(path), f'{before} + {after}')}]"
            self.b.ops.append(
                f"(size({existing}) == 0 ? (size({before}) + size({after}) > 0 ? {whole} : []) : ({replace}) + {adds})"
            )
        else:
            self.b.ops.append(f"({replace}) + {adds}")

    def _containers(self, apps: str, cnames: str, inames: str) -> None:
        shared = self._shared(apps)
        inits: list[tuple[str, InjectPolicy, str, str]] = []
        conts: list[tuple[str, InjectPolicy, str, str]] = []
        for i, ss in enumerate(self.group):
            for k, sc in enumerate(ss.init_containers):
                c = self._container(f"{i}_i{k}", f"{ss.name}:init-image:{sc.name}", sc, shared)
                inits.append((self.ok(i), sc.inject_policy, sc.name, c))
            for k, sc in enumerate(ss.containers):
                c = self._container(f"{i}_c{k}", f"{ss.name}:image:{sc.name}", sc, shared)
                conts.append((self.ok(i), sc.inject_policy, sc.name, c))
        inits.sort(key=lambda t: t[2])  # the engine sorts injected init containers by name
        self._place("/spec/initContainers", inames, inits, optional=True)
        self._place("/spec/containers", cnames, conts, optional=False)

    # -- volumes and pull secrets --------------------------------------------------------------------
    def _append_named(self, path: str, list_field: str, per_member: list[list[JsonObj]]) -> None:
        if not any(per_member):
            return
        have = self.b.var(
            f"have_{list_field}", f"has(object.spec.{list_field}) ? object.spec.{list_field}.map(v, v.name) : []"
        )
        if self.single:
            first: list[JsonObj] = []
            for v in per_member[0]:
                if all(x["name"] != v["name"] for x in first):
                    first.append(v)
            new = self.b.var(f"new_{list_field}", f"{cel.literal(first)}.filter(v, !(v.name in {have}))")
        else:
            candidates = " + ".join(f"({self.ok(i)} ? {cel.literal(v)} : [])" for i, v in enumerate(per_member) if v)
            every = self.b.var(f"all_{list_field}", candidates)
            new = self.b.var(
                f"new_{list_field}",
                f"lists.range(size({every})).filter(j, !({every}[j].name in {have}) && "
                f"!{every}.slice(0, j).exists(x, x.name == {every}[j].name)).map(j, {every}[j])",
            )
        self.b.ops.append(
            f"(size({new}) == 0 ? [] : size({have}) == 0 ? [{cel.patch_op('add', cel.string(path), new)}] : "
            f"{new}.map(x, {cel.patch_op('add', cel.string(path + '/-'), 'x')}))"
        )

    def _volumes(self) -> None:
        volumes = []
        for ss in self.group:
            mounted = [ss.volume(n) for sc in ss.init_containers + ss.containers for n in sc.mounted_volume_names()]
            volumes.append([v for v in mounted if v is not None])
        self._append_named("/spec/volumes", "volumes", volumes)
        self._append_named(
            "/spec/imagePullSecrets", "imagePullSecrets", [list(ss.image_pull_secrets) for ss in self.group]
        )


def _unique(values: str, key: str, taken: list[str]) -> str:
    """The items of `values` whose `key` is not in `taken` and not seen earlier in `values`."""
    return (
        f"lists.range(size({values})).filter(j, !({values}[j].{key} in {cel.strings(taken)}) && "
        f"!{values}.slice(0, j).exists(x, x.{key} == {values}[j].{key})).map(j, {values}[j])"
    )
