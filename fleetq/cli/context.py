"""How every CLI command finds the fleet, and how failures become one line.

A running ``fleetq up`` writes ``<state-dir>/fleetq.json`` (its pid, the Temporal address,
the Web UI URL, the members' kubeconfig and the fleet config). Commands read it to find
the fleet; Temporal's own ``TEMPORAL_ADDRESS`` (and the rest of its client environment)
and ``FLEETQ_CONFIG`` override it, so the same commands work against a real Temporal
cluster and real member clusters. Every command runs through :func:`run`, which turns
known failures (no fleet, NotFound, rejected updates) into one line and an exit code —
never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from fleetq.embedded import (  # noqa: F401 - re-exported for the commands
    INFO_FILE,
    LOCK_FILE,
    FleetInfo,
    default_state_dir,
    pid_alive,
    read_info,
    write_info,
)
from fleetq.temporal_client import DEFAULT_ADDRESS, connect

T = TypeVar("T")

FLEET_CONFIG_ENV = "FLEETQ_CONFIG"


class CliError(Exception):
    """A failure to report as one line (``message``) with exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def not_found(resource: str, name: str) -> CliError:
    """kubectl's NotFound line, e.g. ``pytorchjobs.kubeflow.org "x" not found``."""
    return CliError(f'Error from server (NotFound): {resource} "{name}" not found')


def temporal_address() -> str | None:
    """The address to pass to :func:`connect`: None when ``TEMPORAL_ADDRESS`` is set
    (Temporal's env config applies, TLS included), else the running ``fleetq up``'s
    address, else the default."""
    if os.environ.get("TEMPORAL_ADDRESS"):
        return None
    info = read_info()
    return info.address if info else DEFAULT_ADDRESS


def shown_address() -> str:
    return os.environ.get("TEMPORAL_ADDRESS") or temporal_address() or DEFAULT_ADDRESS


def fleet_config_path() -> str:
    """``FLEETQ_CONFIG``, else the fleet config of the running ``fleetq up``."""
    env = os.environ.get(FLEET_CONFIG_ENV)
    if env:
        return env
    info = read_info()
    if info and info.fleet_config:
        return info.fleet_config
    raise CliError(
        f"error: no fleet config: set {FLEET_CONFIG_ENV} or start a fleet with: fleetq up"
    )


def no_fleet_error(address: str | None = None) -> CliError:
    return CliError(
        f"error: no fleetq found at {address or shown_address()} (start one with: fleetq up)"
    )


async def get_client() -> Client:
    """Connect with the pydantic data converter, or fail with the one-line no-fleet error."""
    try:
        return await connect(temporal_address())
    except RuntimeError as exc:
        if "connect" in str(exc).lower():
            raise no_fleet_error() from None
        raise


def _rpc_message(exc: RPCError) -> str:
    if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return no_fleet_error().message
    return f"error: {exc.message}"


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run one command's coroutine; known failures become one line on stderr + exit code."""
    try:
        return asyncio.run(_guard(fn))
    except CliError as exc:
        typer.echo(exc.message, err=True)
        raise typer.Exit(exc.code) from None
    except RPCError as exc:
        typer.echo(_rpc_message(exc), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


async def _guard(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for sync command bodies: any unexpected exception is one line, exit 1."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except CliError as exc:
            typer.echo(exc.message, err=True)
            raise typer.Exit(exc.code) from None
        except RPCError as exc:
            typer.echo(_rpc_message(exc), err=True)
            raise typer.Exit(1) from None
        except Exception as exc:  # a bug of ours must still not print a traceback
            if os.environ.get("FLEETQ_DEBUG"):
                raise
            typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def is_tty() -> bool:
    with contextlib.suppress(Exception):
        return sys.stdout.isatty()
    return False
