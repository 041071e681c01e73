"""Both roles and the probes in one asyncio process: the manager as the tests start it in-process.

`sidecarctl run` runs the same roles in processes of their own (sidecarctl.manager.supervisor): the
control role in one, the webhook role in each admission worker. Here they share one loop, which
keeps the end-to-end tests able to look inside (the store, the syncer, the controller).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path
from typing import Any

from cabundle.syncer import CABundleSyncer
from kuberuntime import kubeapi, kubeconfig
from kuberuntime.informer import Informer
from sidecarctl.manager import api_client
from sidecarctl.manager.control import ControlRole
from sidecarctl.manager.healthport import create_probe_app, serve_plain, tls_self_check
from sidecarctl.manager.options import ManagerOptions
from sidecarctl.manager.webhook import WebhookRole
from sidecarsets.controller.controller import Controller
from sidecarsets.store import TemplateStore

log = logging.getLogger("sidecarctl.manager")


def cert_dir_of(opts: ManagerOptions) -> Path:
    if opts.tls.cert_dir:
        return Path(opts.tls.cert_dir)
    if opts.tls.self_signed:
        return Path(tempfile.mkdtemp(prefix="sidecarctl-certs-"))
    raise ValueError("either --cert-dir or --self-signed is required")


class Manager:
    def __init__(self, opts: ManagerOptions, *, client: kubeapi.KubeClient | None = None) -> None:
        self.opts = opts
        self.cert_dir = cert_dir_of(opts)
        self.client = client or api_client(kubeconfig.load_config(opts.kubeconfig))
        self.control = ControlRole(opts, self.cert_dir, client=self.client)
        self.webhook = WebhookRole(opts, self.cert_dir, client=self.client)

    @property
    def store(self) -> TemplateStore:
        return self.webhook.store

    @property
    def syncer(self) -> CABundleSyncer | None:
        return self.control.syncer

    @property
    def leading(self) -> bool:
        return self.control.leading

    @property
    def controller(self) -> Controller | None:
        return self.control.controller

    @property
    def pod_informer(self) -> Informer[Any]:
        """The controller's pod watch, kept by every replica (sidecarctl.manager.warm)."""
        return self.control.caches.pods

    async def readiness(self) -> tuple[bool, str]:
        for role in (self.control, self.webhook):
            ok, why = role.readiness()
            if not ok:
                return ok, why
        current = self.webhook.reloader.current
        assert current is not None  # the webhook role is ready only with a certificate
        return await tls_self_check(self.opts.serving.webhook_bind, current.ca_pem)

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [
            asyncio.create_task(self.control.run(stop), name="control"),
            asyncio.create_task(self.webhook.run(stop), name="webhook"),
            asyncio.create_task(
                serve_plain(create_probe_app(ready=self.readiness), self.opts.serving.probe_bind, stop), name="probes"
            ),
        ]
        log.info("manager started", extra={"object": f"webhook={self.opts.serving.webhook_bind} (one process)"})
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed: %s", t.get_name(), t.exception())
        stop.set()
        _, pending = await asyncio.wait(tasks, timeout=15)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        log.info("manager stopped")
