"""Fixtures for the execution API tests: a shared Docker sandbox and this process's containers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kernel_sandbox.docker.containers import LABEL, LABEL_OWNER_PID
from kernel_sandbox.execution import Sandbox
from kernel_sandbox.docker.containers import kernel_of


@pytest.fixture(scope="module")
def sandbox(docker_engine) -> Iterator[Sandbox]:
    """One Docker sandbox shared by a module's tests (for tests that do not depend on state).

    ``interrupt_grace`` is generous so that an interrupted call never loses the kernel merely
    because the machine is busy.
    """
    with Sandbox(timeout=60, interrupt_grace=30) as sb:
        yield sb


@pytest.fixture
def own_containers(docker_engine):
    """A function returning the ids of this process's kernel-sandbox containers (idle standbys left out:
    they come and go with the provisioner's pool, see test_standby.py)."""

    def ids() -> set[str]:
        found = docker_engine.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_OWNER_PID}={os.getpid()}"})
        return {c.id for c in found if c.labels.get(LABEL) == "true" and kernel_of(c.labels) is not None}

    return ids
