"""JupyterLab's status-bar memory with the sandboxed kernels' containers counted: a Jupyter server
extension.

jupyter-resource-usage's ``/api/metrics/v1`` counts the server's process tree (psutil), but a
sandboxed kernel's memory lives in its container, under the Docker engine. This extension serves
that path with jupyter-resource-usage's own handler plus the memory in use of the server's
sandboxed kernels' containers (read from their cgroups, as ``docker stats`` shows it), so the
figure, its limit and its warning count them. ``kernel-sandbox lab`` enables it when
jupyter-resource-usage is installed; for a server you run yourself::

    c.ServerApp.jpserver_extensions = {"kernel_sandbox.statusbar": True}

A kernel whose container cannot be read (a remote engine, an OpenSandbox sandbox, a kernel
starting or gone) counts 0 and is logged at debug level; reading never fails the request.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from typing import Any

from jupyter_resource_usage.api import ApiHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .backends import by_provisioner
from .metrics import CgroupProbe, MetricsUnavailable
from .provisioners.launched import LaunchedProvisioner

NAME = __name__
"""The extension's name, as ``ServerApp.jpserver_extensions`` enables it."""
READ_SECONDS = 2.0
"""The longest one request waits for the containers' figures (then they count 0)."""
METRICS_PATH = "/api/metrics/v1"
USAGE_CONFIG = "jupyter_resource_usage_display_config"
"""Where jupyter-resource-usage keeps its configuration in the web app's settings."""


class SandboxesMemory:
    """The memory in use of a server's sandboxed kernels' containers, read from their cgroups.

    Each container's cgroup is found once (one engine call) and then read from its files; the
    probes of containers no longer among the kernels are dropped.
    """

    def __init__(self, log: Any) -> None:
        self.log = log
        self._probes: dict[str, CgroupProbe] = {}
        self._lock = threading.Lock()

    async def total(self, kernel_manager: Any) -> int:
        """Bytes in use by the containers of ``kernel_manager``'s sandboxed kernels now (at most
        :data:`READ_SECONDS` waited for; 0 for those not read by then)."""
        kernels = []
        for kernel_id in kernel_manager.list_kernel_ids():
            provisioner = getattr(kernel_manager.get_kernel(kernel_id), "provisioner", None)
            if isinstance(provisioner, LaunchedProvisioner):
                kernels.append((kernel_id, provisioner))
        if not kernels:
            return 0
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._read, kernels), READ_SECONDS)
        except asyncio.TimeoutError:
            self.log.debug("kernel-sandbox: the containers' memory took over %s s", READ_SECONDS)
            return 0

    def _read(self, kernels: Sequence[tuple[str, LaunchedProvisioner]]) -> int:
        if not self._lock.acquire(timeout=READ_SECONDS):
            return 0  # an earlier read still waits for the engine
        try:
            total, seen = 0, set()
            for kernel_id, provisioner in kernels:
                try:
                    container_id = getattr(provisioner, "container_id", None)
                    probe = self._probes.get(container_id or "")
                    if probe is None:
                        probe = _probe(provisioner)
                        self._probes[probe.container_id] = probe
                    seen.add(probe.container_id)
                    total += probe.read().memory or 0
                # whatever the engine or the files say, the status bar gets its figure
                except Exception as exc:
                    self.log.debug(
                        "kernel-sandbox: kernel %s counts 0 in the status bar's memory: %s",
                        kernel_id,
                        exc,
                    )
            for gone in self._probes.keys() - seen:
                del self._probes[gone]
            return total
        finally:
            self._lock.release()


def _probe(provisioner: LaunchedProvisioner) -> CgroupProbe:
    """The cgroup reader of the provisioner's container, as its backend finds it."""
    from .execution.adapters import adapter  # the execution API, loaded when a kernel is probed

    entry = by_provisioner(provisioner.backend)
    if entry is None:
        raise MetricsUnavailable(f"no backend has the provisioner {provisioner.backend!r}")
    return adapter(entry.name).probe(provisioner)


class SandboxedMetricsHandler(ApiHandler):
    """jupyter-resource-usage's ``/api/metrics/v1`` with the sandboxes' memory added to ``rss`` (and
    ``pss``), and its memory warning decided on that sum."""

    _sandboxes = 0

    @web.authenticated
    async def get(self) -> None:
        """The server's metrics, as jupyter-resource-usage computes them, with the containers'
        memory."""
        if USAGE_CONFIG not in self.settings:
            raise web.HTTPError(404, "jupyter-resource-usage is not enabled on this server")
        memory: SandboxesMemory = self.settings[NAME]
        self._sandboxes = await memory.total(self.kernel_manager)
        await super().get()

    def write(self, chunk: Any) -> None:
        """Add the containers' memory to the metrics jupyter-resource-usage's ``get`` writes."""
        if self._sandboxes and isinstance(chunk, str):
            metrics = json.loads(chunk)
            if isinstance(metrics, dict) and "rss" in metrics:  # not an error reply
                chunk = json.dumps(self._with_sandboxes(metrics))
                self._sandboxes = 0
        super().write(chunk)

    def _with_sandboxes(self, metrics: dict[str, Any]) -> dict[str, Any]:
        config = self.settings[USAGE_CONFIG]
        metrics["rss"] += self._sandboxes
        if metrics.get("pss") is not None:
            metrics["pss"] += self._sandboxes
        limit = config.mem_limit
        if callable(limit):
            limit = limit(rss=metrics["rss"], pss=metrics.get("pss"))
        memory = metrics["limits"]["memory"]
        memory["rss"] = memory["pss"] = limit
        if "warn" in memory:  # where jupyter-resource-usage decided it
            memory["warn"] = (limit - metrics["rss"]) < limit * config.mem_warning_threshold
        return metrics


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": NAME}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Serve ``/api/metrics/v1`` with :class:`SandboxedMetricsHandler`, ahead of
    jupyter-resource-usage's own handler whichever extension loads first."""
    web_app = serverapp.web_app
    web_app.settings[NAME] = SandboxesMemory(serverapp.log)
    path = url_path_join(web_app.settings["base_url"], METRICS_PATH)
    web_app.add_handlers(".*$", [(path, SandboxedMetricsHandler)])
    # tornado tries host rules in the order they were added (each before its catch-all last
    # rule): this one goes first, before jupyter-resource-usage's, which is loaded before it
    rules = web_app.default_router.rules
    rules.insert(0, rules.pop(-2))
    serverapp.log.info("kernel-sandbox: the status bar's memory counts the sandboxed kernels")
