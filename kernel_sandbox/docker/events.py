"""How the Docker link watches the engine: the container's events followed from a thread (an OOM
kill, a kill through the engine, an exec's end, the container's death), the kernel's end put in
words from them, a lost event stream explained, and a ping every :data:`ENGINE_PROBE_INTERVAL` s
that ends the kernel when the engine stops answering."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import docker
import docker.errors
import requests.exceptions

from ..errors import EngineUnavailable
from ..launch.front import ExitStatus
from ..parsers import MiB
from .channels import OOM_PROBE, ChannelLink
from .connect import docker_client, engine_address, unpinged_client

log = logging.getLogger("kernel_sandbox.launch")

SIGKILLED = 128 + 9
"""The init's exit code when the kernel's process was killed with SIGKILL."""
INTERRUPTS = ("2", "SIGINT")
"""A ``kill`` event's signal that is an interrupt (the link's own :meth:`interrupt`, or a
``docker kill -s INT``), not a kill."""
ENGINE_CHECK_TIMEOUT = 10
ENGINE_PROBE_INTERVAL = 10.0
"""Seconds between two pings of the engine while the kernel runs: a hung engine (connections
open, nothing answered) reports no event, so it is asked; no answer within
:data:`ENGINE_CHECK_TIMEOUT` s ends the kernel."""


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> None:
    """Call ``callback`` on ``loop`` from another thread; nothing when the loop is closed (the
    launcher is exiting)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


class WatchedLink(ChannelLink):
    """The link's channels (:class:`.channels.ChannelLink`) with the engine watched."""

    def _watch_events(self) -> None:
        """Follow the container's events from a thread (subscribed before it starts: nothing is
        missed)."""
        assert self._client is not None
        stream = self._client.events(filters={"container": self.container_id}, decode=True)
        self._events = stream
        loop = self._loop

        def follow() -> None:
            try:
                for event in stream:
                    _post(loop, self._on_event, event)
            except Exception as exc:  # the stream broke (or stop() closed it): judged on the loop
                _post(loop, self._on_events_lost, exc)
            else:
                _post(loop, self._on_events_lost, None)

        threading.Thread(target=follow, name="docker-events", daemon=True).start()

    def _on_event(self, event: dict[str, Any]) -> None:
        status = event.get("status") or event.get("Action")
        attributes = event.get("Actor", {}).get("Attributes", {})
        if status == "oom":
            self._oom_events += 1
            self.heartbeat([OOM_PROBE, str(self._oom_events).encode()])
        elif status == "kill" and not self._stopping:
            signal = str(attributes.get("signal", "?"))
            if signal not in INTERRUPTS:  # an interrupt earlier in its life is no kill
                self._killed = signal
        elif status == "exec_die":
            stream = self._execs.pop(str(attributes.get("execID")), None)
            if stream is not None:
                stream.abort()
        elif status == "die":
            code = int(attributes.get("exitCode", 1))
            # the kernel's own end, not an earlier OOM kill of another process of its container
            self._oom = code == SIGKILLED and self._oom_events > self._oom_lived
            if self._broken_by is not None and not self._oom and self._killed is None:
                self._end(self._broken_by)
            if code and self._shutdown_asked and not self._oom and self._killed is None:
                # asked to shut down, it did: an abort in the interpreter's teardown is no crash
                log.info("the kernel exited with code %d on its way out after shutdown", code)
                code = 0
            self._end(ExitStatus(code, self._ending(code)))

    def _ending(self, code: int) -> str:
        """How the kernel ended, in words, from what the engine reported (never from the kernel):
        out of memory only when its own process was (the init's exit says SIGKILL, and it answered
        no heartbeat after the container's last OOM kill)."""
        if self._oom:
            limit = f", limit {self.settings.memory // MiB} MiB" if self.settings.memory else ""
            return f"out of memory{limit}; raise memory"
        if self._killed is not None:
            return (
                f"killed through the Docker engine (signal {self._killed}: a `docker kill`, "
                "`docker stop` or `docker rm -f`)"
            )
        if code == SIGKILLED:
            return (
                "killed with SIGKILL by the container runtime or the host's kernel, not through "
                "the engine"
            )
        return "the kernel shut down" if code == 0 else f"exit code {code}"

    def _on_events_lost(self, exc: BaseException | None) -> None:
        if not (self._stopping or self._ended.done()):
            asyncio.ensure_future(self._explain_loss(exc))

    async def _explain_loss(self, exc: BaseException | None) -> None:
        """The event stream ended while the kernel should be running: find out why, in bounded
        time."""
        assert self.container_id is not None  # the events are those of its container
        try:
            client = await asyncio.to_thread(
                functools.partial(docker_client, ENGINE_CHECK_TIMEOUT, engine=self._engine)
            )
            await asyncio.to_thread(client.containers.get, self.container_id)
        except EngineUnavailable as error:
            self._end(
                ExitStatus(1, f"the Docker engine became unreachable ({error.__cause__ or error})")
            )
        except docker.errors.NotFound:
            self._end(ExitStatus(1, "the kernel's container was removed"))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            self._end(ExitStatus(1, f"the Docker engine failed: {error}"))
        else:
            self._end(ExitStatus(1, f"the Docker engine stopped reporting on the kernel ({exc})"))

    async def _probe_engine(self) -> None:
        """Ping the engine now and then; end the kernel when it stops answering.

        The ping runs in a daemon thread with its own client and timeout: a hung engine leaves
        nothing for the launcher's exit to wait for.
        """
        assert self._client is not None
        # no engine call
        client = unpinged_client(self._engine, ENGINE_CHECK_TIMEOUT, self._client.api.api_version)
        while not (self._stopping or self._ended.done()):
            await asyncio.sleep(ENGINE_PROBE_INTERVAL)
            answered: asyncio.Future[bool] = self._loop.create_future()

            def ping() -> None:
                try:
                    client.ping()
                    ok = True
                except Exception:  # any failure is the engine's: reported below as no answer
                    ok = False
                _post(self._loop, lambda: None if answered.done() else answered.set_result(ok))

            threading.Thread(target=ping, name="docker-ping", daemon=True).start()
            try:
                ok = await asyncio.wait_for(asyncio.shield(answered), ENGINE_CHECK_TIMEOUT + 1)
            except asyncio.TimeoutError:
                ok = False
            if not ok and not (self._stopping or self._ended.done()):
                self._engine_hung = True
                self._end(
                    ExitStatus(
                        1,
                        f"the {self._engine.capitalize()} engine at "
                        f"{engine_address(self._engine)} stopped answering (no reply to a ping "
                        f"within {ENGINE_CHECK_TIMEOUT} s); the kernel was stopped",
                    )
                )
