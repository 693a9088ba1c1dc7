"""How every CLI command finds the fleet, and how failures become one line.

A running ``fleetq up`` writes ``<state-dir>/fleetq.json`` (its pid, the Temporal address,
the Web UI URL, the members' kubeconfig and the fleet config). Commands read it to find
the fleet; Temporal's own ``TEMPORAL_ADDRESS`` (and the rest of its client environment)
and ``FLEETQ_CONFIG`` override it, so the same commands work against a real Temporal
cluster and real member clusters. Every command runs through :func:`run`, which turns
known failures (no fleet, NotFound, rejected updates) into one line and an exit code —
never a traceback.

Every command takes ``--state-dir DIR`` (same as ``FLEETQ_STATE_DIR=DIR``; default
``~/.fleetq``): the state dir of the ``fleetq up`` whose fleet it should use.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

import typer

from fleetq.client.errors import ClientError
from fleetq.runtime.fleet_info import (  # noqa: F401 - re-exported for the commands
    INFO_FILE,
    LOCK_FILE,
    STATE_DIR_ENV,
    FleetInfo,
    default_state_dir,
    pid_alive,
    read_info,
    write_info,
)

if TYPE_CHECKING:
    from temporalio.client import Client
    from temporalio.service import RPCError

T = TypeVar("T")

FLEET_CONFIG_ENV = "FLEETQ_CONFIG"
STATE_DIR_HELP = (f"State dir of the fleetq up whose fleet to use (its fleetq.json names "
                  f"Temporal and the fleet config; TEMPORAL_ADDRESS and {FLEET_CONFIG_ENV} "
                  f"override it). Default: ${STATE_DIR_ENV}, else ~/.fleetq")


class CliError(ClientError):
    """A failure to report as one line (``message``) with exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def exit_code(exc: ClientError) -> int:
    """The exit code for a failure: a :class:`CliError`'s own, else 1."""
    return exc.code if isinstance(exc, CliError) else 1


def temporal_address() -> str | None:
    """The address to pass to :func:`connect`: None when ``TEMPORAL_ADDRESS`` is set
    (Temporal's env config applies, TLS included), else the running ``fleetq up``'s
    address, else the default."""
    if os.environ.get("TEMPORAL_ADDRESS"):
        return None
    info = read_info()
    return info.address if info else _default_address()


def _default_address() -> str:
    from fleetq.client.connection import DEFAULT_ADDRESS

    return DEFAULT_ADDRESS


def shown_address() -> str:
    return os.environ.get("TEMPORAL_ADDRESS") or temporal_address() or _default_address()


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
    from fleetq.client.connection import connect

    try:
        return await connect(temporal_address())
    except RuntimeError as exc:
        if "connect" in str(exc).lower():
            raise no_fleet_error() from None
        raise


def _rpc_error(exc: BaseException) -> RPCError | None:
    """``exc`` when it is Temporal's RPCError. Commands import the Temporal client only
    when they talk to Temporal, so without ``temporalio.service`` loaded it cannot be."""
    service = sys.modules.get("temporalio.service")
    if service is not None and isinstance(exc, service.RPCError):
        return exc
    return None


def _rpc_message(exc: RPCError) -> str:
    from temporalio.service import RPCStatusCode

    if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return no_fleet_error().message
    return f"error: {exc.message}"


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run one command's coroutine; known failures become one line on stderr + exit code."""
    import asyncio

    try:
        return asyncio.run(_guard(fn))
    except ClientError as exc:
        typer.echo(exc.message, err=True)
        raise typer.Exit(exit_code(exc)) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except Exception as exc:
        rpc = _rpc_error(exc)
        if rpc is None:
            raise
        typer.echo(_rpc_message(rpc), err=True)
        raise typer.Exit(1) from None


async def _guard(fn: Callable[[], Awaitable[T]]) -> T:
    return await fn()


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for sync command bodies: any unexpected exception is one line, exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except ClientError as exc:
            typer.echo(exc.message, err=True)
            raise typer.Exit(exit_code(exc)) from None
        except Exception as exc:  # a bug of ours must still not print a traceback
            rpc = _rpc_error(exc)
            if rpc is not None:
                typer.echo(_rpc_message(rpc), err=True)
                raise typer.Exit(1) from None
            if os.environ.get("FLEETQ_DEBUG"):
                raise
            typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def is_tty() -> bool:
    with contextlib.suppress(Exception):
        return sys.stdout.isatty()
    return False


#: the widest help text (click's default is 80 columns, wrapping option help early)
HELP_WIDTH = 120


def help_settings() -> dict[str, Any]:
    """click context settings for ``--help``: plain text (no rich panels that cut option
    names to fit), as wide as the terminal up to :data:`HELP_WIDTH`, and that wide when
    not on a terminal (a pipe, a file)."""
    import shutil

    columns = shutil.get_terminal_size((HELP_WIDTH, 24)).columns if is_tty() else HELP_WIDTH
    return {"terminal_width": columns, "max_content_width": HELP_WIDTH}


# --------------------------------------------------------------------------- --state-dir


def use_state_dir(state_dir: Path | str | None) -> None:
    """``--state-dir DIR`` is ``FLEETQ_STATE_DIR=DIR`` for this command (and the processes
    it starts), so every lookup of the running fleet (:func:`read_info`) sees it."""
    if state_dir:
        os.environ[STATE_DIR_ENV] = str(Path(state_dir).expanduser())


def join_running_fleet_env() -> None:
    """For ``fleetq worker``: a running ``fleetq up`` in the state dir supplies
    ``TEMPORAL_ADDRESS`` and ``FLEETQ_CONFIG`` where they are not set."""
    info = read_info()
    if info is None:
        return
    if not os.environ.get("TEMPORAL_ADDRESS") and info.address:
        os.environ["TEMPORAL_ADDRESS"] = info.address
    if not os.environ.get(FLEET_CONFIG_ENV) and info.fleet_config:
        os.environ[FLEET_CONFIG_ENV] = info.fleet_config


def _with_state_dir(fn: Callable[..., Any], join_env: bool) -> Callable[..., Any]:
    """``fn`` with one more option, ``--state-dir`` (env ``FLEETQ_STATE_DIR``)."""
    sig = inspect.signature(fn, eval_str=True)
    hints = get_type_hints(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, state_dir: Path | None = None, **kwargs: Any) -> Any:
        use_state_dir(state_dir)
        if join_env:
            join_running_fleet_env()
        return fn(*args, **kwargs)

    param = inspect.Parameter(
        "state_dir", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
        default=typer.Option(None, "--state-dir", envvar=STATE_DIR_ENV, show_envvar=False,
                             help=STATE_DIR_HELP))
    wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[*sig.parameters.values(), param])
    wrapper.__annotations__ = {**hints, "state_dir": Path | None}
    return wrapper


def add_state_dir_option(app: typer.Typer, join_env: tuple[str, ...] = ("worker",)) -> None:
    """Give every command of ``app`` that has none a ``--state-dir`` option; those named
    in ``join_env`` also take Temporal's address and the fleet config from it."""
    for info in app.registered_commands:
        fn = info.callback
        if fn is None or "state_dir" in inspect.signature(fn).parameters:
            continue
        name = info.name or fn.__name__.replace("_", "-")
        info.callback = _with_state_dir(fn, name in join_env)
