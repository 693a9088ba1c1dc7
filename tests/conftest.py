"""Shared fixtures: a real Temporal dev server and a time-skipping test server, both
started from the binaries our dependencies ship (nothing is downloaded at run time)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
import yaml
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.runtime import Runtime
from temporalio.testing import WorkflowEnvironment

from fleetq.client.connection import (
    DATA_CONVERTER,
    ensure_search_attributes,
    search_attribute_keys,
    temporal_cli_path,
    test_server_path,
)
from tests import tiers

if TYPE_CHECKING:
    from fleetq.controlplane.build import Build
    from fleetq.runtime.embedded import EmbeddedFleet

#: test directories whose fixtures start real control planes or the production-shaped
#: Temporal (built from Go modules; a cold build takes minutes)
_BUILDS = {"adapter", "controlplane", "reliability", "temporal_cluster"}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build (or find cached) what the collected tests need before any test runs, so a
    cold build on a fresh machine (``pip install -e '.[test]' && python -m pytest``, the
    README's command) is not cut by a test's timeout. CI builds them beforehand
    (``.ci/run``); a warm cache is a stamp read. A build that fails is reported by the
    fixtures that need it, with the build's own message."""
    dirs = {part for item in session.items for part in item.path.parts}
    if not dirs & _BUILDS:
        return
    from fleetq.controlplane import build as controlplane
    from fleetq.temporal_cluster import build as temporal_cluster

    wanted = [controlplane] if dirs & (_BUILDS - {"temporal_cluster"}) else []
    if "temporal_cluster" in dirs:
        wanted.append(temporal_cluster)
    for module in wanted:
        if module.cached() is not None:
            continue
        name = module.__name__.split(".")[1]
        print(f"\n[{name}] not built yet: building it once (cached afterwards)", flush=True)
        try:
            module.build(progress=lambda msg, n=name: print(f"[{n}] {msg}", flush=True))
        except module.BuildError as exc:
            print(f"[{name}] build failed: {exc}", flush=True)


def real_control_plane(say: bool = False) -> Build:
    """The control-plane build (built now if the cache is cold, its progress printed when
    ``say``); the test fails saying what to run when it cannot be built."""
    from fleetq.controlplane.build import BuildError, build

    try:
        return build(progress=(lambda msg: print(f"[controlplane] {msg}", flush=True))
                     if say else None)
    except BuildError as exc:
        pytest.fail(f"no real control plane (fleetq controlplane build, needs Go >= 1.26): {exc}")


@contextlib.contextmanager
def embedded_fleet(state_dir: Path, timeout: float, grace: float = 2.0,
                   **options: Any) -> Iterator[EmbeddedFleet]:
    """``fleetq up``'s embedded fleet in ``state_dir`` on free ports (``options``: the
    rest of :class:`EmbeddedFleet`'s), started within ``timeout`` s, stopped after."""
    from fleetq.runtime.embedded import EmbeddedFleet
    from fleetq.runtime.supervisor import free_port

    fleet = EmbeddedFleet(state_dir, port=free_port(), ui_port=free_port(), **options)
    fleet.start(timeout=timeout)
    try:
        yield fleet
    finally:
        fleet.stop(grace=grace)


async def start_dev_server(*namespaces: str, data_converter: DataConverter = DATA_CONVERTER,
                           search_attributes: bool = True, **options: Any
                           ) -> WorkflowEnvironment:
    """A Temporal dev server (in memory) of the pinned CLI with ``namespaces`` besides
    ``default`` and (unless told not to) fleetq's search attributes registered; ``options``
    are ``WorkflowEnvironment.start_local``'s."""
    extra = [arg for ns in namespaces for arg in ("--namespace", ns)]
    extra += options.pop("dev_server_extra_args", [])
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(temporal_cli_path()), data_converter=data_converter,
        search_attributes=search_attribute_keys() if search_attributes else (),
        dev_server_extra_args=extra, **options)


#: Namespaces created on the session dev server, one per test area.
TEST_NAMESPACES = ("e2e", "cli", "reliability", "bench", "security")


@pytest_asyncio.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """A Temporal dev server (in-memory) with fleetq's search attributes registered."""
    env = await start_dev_server(*TEST_NAMESPACES)
    try:
        yield env
    finally:
        await env.shutdown()


async def namespace_client(
    env: WorkflowEnvironment, namespace: str, runtime: Runtime | None = None
) -> Client:
    """A client of the session dev server bound to one of TEST_NAMESPACES, with fleetq's
    search attributes registered there. Each test area gets its own namespace so that the
    fleet-wide workflows (``fleetq/registry``, the quota tree) never leak between areas."""
    assert namespace in TEST_NAMESPACES, namespace
    client = await Client.connect(
        env.client.service_client.config.target_host,
        namespace=namespace,
        data_converter=DATA_CONVERTER,
        runtime=runtime,
    )
    await ensure_search_attributes(client)
    return client


@pytest_asyncio.fixture(scope="session")
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server: durable timers of minutes or days pass instantly."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(test_server_path()),
        data_converter=DATA_CONVERTER,
    )
    try:
        yield env
    finally:
        await env.shutdown()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="the quick tier: the pure core and the workflow tests on the time-skipping "
        "server (no Go build, no dev server, no member cluster); see README 'Tests'",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--quick"):  # before any test module is imported
        tiers.QUICK = True


def _quick(item: pytest.Item) -> bool:
    """In the quick tier: a pure-core test, or one whose only Temporal is the
    time-skipping server."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("full_tier") is not None:
        return False
    if "core" in item.path.parts:
        return True
    return "ts_env" in fixtures and "dev_env" not in fixtures


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--quick"):
        slow = [item for item in items if not _quick(item)]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if _quick(item)]
    for item in items:
        if (
            "dev_env" in getattr(item, "fixturenames", ())
            and item.get_closest_marker("timeout") is None
        ):
            item.add_marker(pytest.mark.timeout(240))


def quick_fleet_config(fleet_config: Path, out: Path, connect_s: float, read_s: float) -> Path:
    """A copy of an emulated fleet's config at ``out`` with short member timeouts and a
    half-second capacity cache, so faults show within a test's patience."""
    doc = yaml.safe_load(fleet_config.read_text())
    doc["timeouts"] = {"connectSeconds": connect_s, "readSeconds": read_s}
    doc["cacheTTLSeconds"] = 0.5
    out.write_text(yaml.safe_dump(doc))
    return out
