"""Where the placement activity reads and records capacity preemptions' room claims.

``RegistryClaims`` keeps them in the fleet registry workflow (``claim_room`` /
``release_room`` updates, ``room_claims`` query), so every worker sees each claim and a
claim is durable before the placement that made it returns its plan. A placement reads
them afresh whenever the registry says some may exist (``fleetq.registry.may_hold_claims``;
a stale "no claim" would hand the room to an evicted victim). ``LocalClaims`` is the same
logic in one process, for a worker without a Temporal client (tests).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from fleetq.handler_refs import RegistryHandlers
from fleetq.naming import REGISTRY_WORKFLOW_ID
from fleetq.room_claims import RoomClaim, RoomClaims

#: a claim read or write waits this long at most for the registry workflow
CLAIM_TIMEOUT = 10.0
T = TypeVar("T")


def run_on_loop(loop: asyncio.AbstractEventLoop | None, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on the worker's event loop from an activity thread and wait for it."""
    if loop is None or loop.is_closed():
        work.close()
        raise ApplicationError("no event loop to reach the fleet registry on")
    future = asyncio.run_coroutine_threadsafe(work, loop)
    try:
        return future.result(timeout=CLAIM_TIMEOUT)
    except BaseException:
        future.cancel()
        raise


class ClaimStore(Protocol):
    def read(self) -> list[RoomClaim]:
        """Every live claim."""

    def claim(self, claim: RoomClaim) -> None:
        """Record ``claim`` (durably, before returning)."""

    def release(self, preemptor: str) -> None:
        """Drop ``preemptor``'s claim."""


class LocalClaims:
    """Claims in this process's memory (a worker without a Temporal client)."""

    def __init__(self) -> None:
        self._claims = RoomClaims()
        self._lock = threading.Lock()

    def read(self) -> list[RoomClaim]:
        now = datetime.now(UTC)
        with self._lock:
            self._claims.expire(now)
            return list(self._claims.claims.values())

    def claim(self, claim: RoomClaim) -> None:
        with self._lock:
            self._claims.claim(claim, datetime.now(UTC))

    def release(self, preemptor: str) -> None:
        with self._lock:
            self._claims.release(preemptor)


class RegistryClaims:
    """Claims in the fleet registry workflow, shared by every worker."""

    def __init__(self, client: Client, loop: Callable[[], asyncio.AbstractEventLoop | None]
                 ) -> None:
        self._client = client
        self._loop = loop

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return run_on_loop(self._loop(), work)

    def read(self) -> list[RoomClaim]:
        now = datetime.now(UTC)
        return [c for c in self._run(self._query()) if c.live(now)]

    async def _query(self) -> list[RoomClaim]:
        handle = self._client.get_workflow_handle(REGISTRY_WORKFLOW_ID)
        try:
            ref = RegistryHandlers.ROOM_CLAIMS
            return await handle.query(ref.name, result_type=ref.result)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # no registry yet: nothing claimed
                return []
            raise

    def claim(self, claim: RoomClaim) -> None:
        self._run(self._update(RegistryHandlers.CLAIM_ROOM.name, claim))

    def release(self, preemptor: str) -> None:
        self._run(self._update("release_room", preemptor))

    async def _update(self, name: str, arg: Any) -> None:
        handle = self._client.get_workflow_handle(REGISTRY_WORKFLOW_ID)
        await handle.execute_update(name, arg)
