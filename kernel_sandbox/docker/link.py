"""The Docker link: a kernel in a container with no network, reached through Docker exec streams.

Inside the container ipykernel binds its five ports on the container's own loopback. For each
channel the launcher opens an exec stream running :mod:`kernel_sandbox.kernelside.connector`
against that channel's port and speaks ZMTP through it (:mod:`kernel_sandbox.launch.zmtp`): one
stream per channel, so heartbeats and control messages never queue behind a flood of output.
Nothing of the host is mounted into the container for this, and no host path is involved: the
streams are the engine's (their framing: :mod:`.exec_stream`). As root on runc the launcher
connects from a thread inside the container's network namespace instead (:mod:`.netns`).

Each connector is also a lifeline: when the launcher ends, by any signal, the engine closes the
connectors' stdin and they kill every process of the container; the container removes itself
(auto-remove). The kernel can stop those processes (they run as its uid), and a container that is
not started yet has none, so a host process the kernel cannot reach stands behind them: the
launcher's :mod:`~kernel_sandbox.docker.watchdog`, which removes the container once the launcher is
gone. How the kernel ended (out of memory included) is read from the engine's events, since an
auto-removed container cannot be inspected afterwards: an OOM kill of another process of the
container (a child the kernel ran) is told apart by a heartbeat the kernel answers after it; an
engine that stops answering (its connections open, nothing moving) is noticed by a ping every
:data:`~.events.ENGINE_PROBE_INTERVAL` s.

The link is built in layers: its channels and the kernel's end (:mod:`.channels`, each stream a
:class:`~.kernel_stream.ChannelStream`), the engine watched (:mod:`.events`), and here its start
(the container, the egress proxy, ``%checkpoint``'s store), usage, interrupt and stop; the
container's own output is :mod:`.output`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import docker
import docker.errors
import requests.exceptions

from ..egress import WINDOW_REQUEST
from ..errors import KernelLaunchError, KernelSandboxError
from ..kernelside import source
from ..launch import egress
from ..launch.checkpoints import REQUEST, CheckpointStore
from ..launch.messages import DELIM
from ..canonical import PROTOCOL_VERSION
from ..launch.front import Front
from ..metrics import CgroupProbe, MetricsUnavailable, Usage, near_misses
from ..privdir import LAUNCHER_STATE, SECRETS, PrivateDir
from . import watchdog
from .blobs import ContainerFiles
from .checks import applied_limits, check_engine, check_podman, podman_applied, podman_host
from .containers import (
    container_spec,
    for_podman,
    owner_labels,
    remove_container,
    resolve_mounts,
    run_as,
)
from .connect import (
    docker_client,
    concrete_engine,
    is_podman,
    require_image,
)
from .exec_stream import Demux, own_socket
from .channels import CHANNEL_PORTS, EXIT_REPORT_WAIT, PROBE
from .events import WatchedLink
from .output import OutputStream
from .proxy import kernel_env, proxy_for
from .netns import container_netns, listen_in_netns, may_enter_netns

log = logging.getLogger("kernel_sandbox.launch")

PROBE_INTERVAL = 0.5
WELCOME_WAIT = 1.0
"""Seconds to wait, once the heartbeat answers, for ipykernel 7's ``iopub_welcome`` (JEP 65) to
confirm the launcher's IOPub subscription; kernels without it start after this pause."""


class DockerLink(WatchedLink):
    """The kernel in a locked-down container on the Docker engine (see the module docstring)."""

    # -- starting ------------------------------------------------------------------------------

    async def start(self, front: Front) -> None:
        """Create and start the container, open its channels, and return once the kernel answers."""
        self._front = front
        request, settings = self.request, self.settings
        client = self._client = await asyncio.to_thread(
            functools.partial(docker_client, engine=settings.engine)
        )
        info = await asyncio.to_thread(client.info)
        podman = await asyncio.to_thread(is_podman, client)
        self._engine = concrete_engine(settings.engine, podman)
        self._engine_is_podman = podman
        if podman:
            check_podman(await asyncio.to_thread(podman_host, client), settings)
        check_engine(info, settings)
        await asyncio.to_thread(require_image, client, settings.image)
        direct = may_enter_netns(settings, info)
        proxied = settings.network is not True
        # before the container exists: a secret whose value is missing fails the launch
        if settings.secrets:
            from ..launch.intercept import SecretTable

            self._secrets = SecretTable.load(settings.secrets, os.environ)
        kernel_secrets = self._secrets.kernel_env() if self._secrets else {}
        spec = container_spec(
            settings,
            kernel_id=request.kernel_id,
            kernel_key=self._key,
            user=run_as(settings),
            env={
                **request.env,
                **(kernel_env(settings) if proxied else {}),
                **kernel_secrets,
            },
            mounts=resolve_mounts(settings, request.cwd),
            labels=owner_labels(
                request.kernel_id,
                owner_pid=request.client_pid,
                private_dir=request.private.path if request.private else None,
            ),
        )
        if podman:
            spec = for_podman(spec)
        self._watchdog = watchdog.start(request.kernel_id, self._engine)  # before the container
        self._creating = asyncio.ensure_future(
            asyncio.to_thread(client.containers.create, settings.image, **spec)
        )
        try:
            container = await asyncio.shield(self._creating)
        except docker.errors.APIError as exc:
            reason = exc.explanation or exc
            raise KernelLaunchError(
                f"Docker refused to create the kernel's container: {reason}"
            ) from exc
        self.container_id = container.id
        if request.private is not None:
            request.private.write_json(
                LAUNCHER_STATE,
                {"pid": os.getpid(), "container_id": container.id, "engine": self._engine},
            )
        self._keep_checkpoints(front, client, container.id)
        await asyncio.to_thread(self._watch_events)
        await self._attach_output()
        try:
            await asyncio.to_thread(container.start)
        except docker.errors.APIError as exc:
            hint = ""
            if settings.runtime == "runsc":
                hint = (
                    ' (gVisor\'s runsc needs runtimeArgs ["--network=none"] here: see '
                    '`kernel-sandbox doctor`)'
                )
            raise KernelLaunchError(
                f"The kernel's container did not start: {exc.explanation or exc}{hint}"
            ) from exc
        if direct:
            self._netns = await asyncio.to_thread(container_netns, container)
        # while the kernel starts
        serving = asyncio.ensure_future(self._start_egress()) if proxied else None
        opening = [asyncio.ensure_future(self._open_channel(name)) for name in CHANNEL_PORTS]
        self.heartbeat([PROBE, b"ping"])
        try:
            await self._wait_until_ready(container, spec, opening)
            if serving is not None:
                await serving
        finally:
            for task in [*opening, *([serving] if serving is not None else [])]:
                task.cancel()
        self.output.release()
        self._probing = asyncio.ensure_future(self._probe_engine())

    def _keep_checkpoints(self, front: Front, client: Any, container_id: str) -> None:
        """Serve ``%checkpoint`` and ``%restore`` (:mod:`..launch.checkpoints`) from the kernel's
        private directory (a client that ran the kernelspec's argv has none: one of the
        launcher's own, for its life); pass on the offer a predecessor that ran out of memory
        left."""
        private = self.request.private or self.keep_dir
        if private is None:
            private = self._own_dir = PrivateDir.create()
        files = self._files = ContainerFiles(client, container_id, self.settings.image)
        settings = self.settings
        store = CheckpointStore(
            private.path,
            files,
            settings.checkpoint_max_bytes,
            settings.max_checkpoint_bytes,
            "docker",
        )
        self._checkpoints = store
        front.kernel_requests[REQUEST] = store.handle
        front.client_shell.append(store.client_sent)
        offer = store.take_offer()
        if offer is not None:
            front.notice_next_cell(offer)

    def blob_channel(self) -> ContainerFiles:
        """How blobs move into and out of the kernel's container (once it is created)."""
        if self._files is None:
            raise KernelLaunchError("the kernel has no container yet")
        return self._files

    def count_from(self, count: int | None) -> None:
        """Nothing: the kernel counts its cells, and the sleeper's own store no history."""

    async def _start_egress(self) -> None:
        """Serve the kernel's filtering proxy (:mod:`.egress`) on the container's loopback before
        the kernel answers, so before any of the user's code runs (nothing else holds its port
        then): listening in the container's namespace, or through a relay in the container over an
        exec stream (:mod:`.egress_stream`)."""
        front = self._front
        assert front is not None
        proxy = self._egress = proxy_for(self.settings, self._secrets)
        try:
            if self._netns is not None:
                sock = await asyncio.to_thread(listen_in_netns, self._netns, egress.PROXY_PORT)
                await proxy.serve(sock)
            else:
                from ..launch.egress_stream import RelayStream

                await proxy.serve(None)
                command = [
                    "python",
                    "-I",
                    "-S",
                    "-c",
                    source("egress_relay"),
                    str(egress.PROXY_PORT),
                ]
                exec_id, relay = await asyncio.to_thread(self._exec_socket, command)
                transport, stream = await self._loop.connect_accepted_socket(
                    lambda: RelayStream(proxy, Demux, front.notice_next_cell), relay
                )
                self._streams.append(transport)
                self._execs[exec_id] = transport
                failed = await stream.listening  # the kernel's first cell finds its proxy there
                if failed is not None:
                    raise OSError(failed)
        except (OSError, docker.errors.APIError) as exc:
            raise KernelLaunchError(
                f"Could not serve the kernel's egress proxy on its port {egress.PROXY_PORT}: {exc}"
            ) from exc
        front.requests[WINDOW_REQUEST] = proxy.answer
        private = self.request.private or self.keep_dir or self._own_dir
        if private is not None:
            # the secrets' names and use counts, the kernel's and its tool calls', for
            # `kernel-sandbox ps` and metrics() (never a value)
            proxy.on_secret_use = functools.partial(private.write_json, SECRETS)
            if self._secrets is not None:
                private.write_json(SECRETS, proxy.secret_uses())

    async def _channels_failed(self, opening: Sequence[asyncio.Future[None]]) -> None:
        """Raise when a channel could not be opened: the kernel's own end if it died, else the
        error."""
        for task in opening:
            if task.done() and not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                try:
                    await asyncio.wait_for(asyncio.shield(self._ended), EXIT_REPORT_WAIT)
                except asyncio.TimeoutError:
                    reason = getattr(exc, "explanation", None) or exc
                    raise KernelLaunchError(
                        f"Could not reach the kernel's channels: {reason}"
                    ) from exc
                raise self._start_failure() from exc

    def _start_failure(self) -> KernelLaunchError:
        status = self._ended.result()
        return KernelLaunchError(
            f"The kernel exited during start-up ({status.reason}).\n{self.output.text()}".strip()
        )

    async def _attach_output(self) -> None:
        assert self._client is not None and self.container_id is not None
        params = {"stdout": 1, "stderr": 1, "stream": 1, "logs": 0}
        sdk_socket = await asyncio.to_thread(
            self._client.api.attach_socket, self.container_id, params
        )
        transport, _ = await self._loop.connect_accepted_socket(
            lambda: OutputStream(self.output), own_socket(sdk_socket)
        )
        self._streams.append(transport)

    async def _wait_until_ready(
        self, container: Any, spec: dict[str, Any], opening: Sequence[asyncio.Future[None]]
    ) -> None:
        limits = asyncio.ensure_future(asyncio.to_thread(self._check_limits, container, spec))
        deadline = time.monotonic() + self.settings.launch_timeout
        self._ask_kernel_info()
        try:
            while not (self._ready.done() and self._informed.done()) or not all(
                task.done() for task in opening
            ):
                await self._channels_failed(opening)
                if self._ended.done():
                    raise self._start_failure()
                if time.monotonic() >= deadline:
                    raise KernelLaunchError(
                        f"The kernel in image {self.settings.image!r} did not answer within "
                        f"{self.settings.launch_timeout:g} s. Check that the image runs ipykernel "
                        "(`kernel-sandbox doctor`), or raise launch_timeout.\n" + self.output.text()
                    )
                # Only what is still pending: a finished future would end every wait at once (a busy
                # loop).
                watched: list[asyncio.Future[Any]] = [
                    self._ready,
                    self._informed,
                    self._ended,
                    *opening,
                ]
                pending = [f for f in watched if not f.done()]
                await asyncio.wait(
                    pending, timeout=PROBE_INTERVAL, return_when=asyncio.FIRST_COMPLETED
                )
                if not self._ready.done():
                    self.heartbeat([PROBE, b"ping"])
            log.debug("the kernel answers; waiting for its IOPub welcome")
            await asyncio.wait([self._welcomed], timeout=WELCOME_WAIT)
            log.debug(
                "IOPub %s",
                "welcomed" if self._welcomed.done() else "not welcomed: starting without",
            )
            await limits
        finally:
            limits.cancel()

    def _ask_kernel_info(self) -> None:
        """Send the launcher's own kernel_info_request (it waits for the shell stream to open).

        The kernel is ready when it answers: ipykernel's heartbeat and IOPub start before the rest
        of its initialisation, and a signal in between ends it with a traceback (jupyter_client
        interrupts every kernel it shuts down, so a restart right after a start would).
        """
        header = {
            "msg_id": self._info_id,
            "msg_type": "kernel_info_request",
            "username": "kernel-sandbox",
            "session": self._info_id,
            "date": "",
            "version": PROTOCOL_VERSION,
        }
        parts = [json.dumps(header).encode(), b"{}", b"{}", b"{}"]
        self._send("shell", [DELIM, self._signer.sign(parts), *parts])

    def _check_limits(self, container: Any, spec: dict[str, Any]) -> None:
        container.reload()
        if self._engine_is_podman:
            wrong = podman_applied(container.attrs, spec)
        else:
            wrong = applied_limits(container.attrs["HostConfig"], spec)
        if wrong:
            raise KernelLaunchError(
                "The Docker engine did not apply the kernel's limits: " + "; ".join(wrong)
            )
        try:
            self._cgroup = CgroupProbe.for_container(container.attrs)
        except MetricsUnavailable as exc:
            log.info("no usage figures for this kernel: %s", exc)

    # -- usage ---------------------------------------------------------------------------------

    def usage(self) -> Usage | None:
        """The container's usage now, read from its cgroup (None where the host cannot read it)."""
        if self._cgroup is None:
            return None
        try:
            return self._cgroup.read()
        except MetricsUnavailable:
            return None

    def limits_hit(self, error_text: str = "") -> list[str]:
        """The limits the kernel ran into since this was last asked, read from the host (see
        :func:`near_misses`)."""
        usage = self.usage()
        if usage is None:
            return []
        checked, self._checked = self._checked, usage
        return near_misses(checked, usage, error_text)

    async def interrupt(self) -> None:
        """Send SIGINT to the kernel through the container's init, while code of a client's runs.

        ipykernel ignores SIGINT between cells, and jupyter_client interrupts every kernel it
        shuts down: sent to a kernel in the tail of a handler (its reply sent, its idle status
        not yet), the signal logs a false ``KeyboardInterrupt caught in kernel`` error. So a
        kernel with no request of :data:`.channels.RUNS_CODE` open is left alone, and a busy one
        is interrupted at once, as a local one is. A kernel that has ended has nothing to
        interrupt: its end is reported where it is seen.
        """
        if self._client is None or self.container_id is None:
            return
        if not self.running() or self._ended.done():
            log.debug("not interrupting a kernel that runs no code or has ended")
            return
        try:
            await asyncio.to_thread(self._client.api.kill, self.container_id, "SIGINT")
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "is not running" in str(exc.explanation):
                # the container stopped before the engine's event of it came
                log.debug("not interrupting the kernel: its container is not running")
            else:
                log.warning("could not interrupt the kernel: %s", exc.explanation or exc)

    async def stop(self) -> None:  # noqa: C901
        """Close every stream, end the kernel and remove its container."""
        if self._stopping:
            return
        self._stopping = True
        self._cancel.set()
        if self._probing is not None:
            self._probing.cancel()
        for task in self._reopening:
            task.cancel()
        if self._checkpoints is not None:
            await self._checkpoints.close()
            if self._front is not None:  # a link that follows (a wake) registers its own
                with contextlib.suppress(ValueError):
                    self._front.client_shell.remove(self._checkpoints.client_sent)
        for transport in [
            *self._streams,
            *(channel.transport for channel in self._channels.values()),
        ]:
            if transport is not None:
                transport.close()
        if self.container_id is None and self._creating is not None:
            try:
                self.container_id = (await self._creating).id
            except Exception:
                pass
        removed = True
        if self._engine_hung:
            # no call to a hung engine here: the watchdog removes the container when it answers
            removed = False
        elif self._client is not None and self.container_id is not None:
            try:
                container = await asyncio.to_thread(self._client.containers.get, self.container_id)
                await asyncio.to_thread(remove_container, container)
            except docker.errors.NotFound:
                pass
            except (
                KernelSandboxError,
                docker.errors.DockerException,
                requests.exceptions.RequestException,
            ) as exc:
                removed = False
                log.error(
                    "could not remove the kernel's container %s: %s", self.container_id[:12], exc
                )
        if self._egress is not None:
            await self._egress.close()
        if self._own_dir is not None:
            self._own_dir.remove()
        watchdog.release(self._watchdog, done=removed)
        if self._events is not None:
            self._events.close()
        if self._netns is not None:
            os.close(self._netns)
            self._netns = None
