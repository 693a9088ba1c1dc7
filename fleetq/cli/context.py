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
from fleetq.runtime.fleet_info import STATE_DIR_ENV, read_info

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


# --------------------------------------------------------------------------- parsing


def plain_params(command: Any) -> None:
    """Coerce ``command``'s plain parameters (``str``, ``Path`` and bool flags) without
    pydantic.

    typer 0.29 coerces every parsed value, ``None`` included, through a pydantic
    TypeAdapter it builds the first time the command runs: importing pydantic and
    building one adapter per parameter is ~0.1 s of CPU, half of a whole ``fleetq get
    pytorchjob`` (BENCHMARKS.md section 9). For a ``str`` the adapter is typer's
    ``_parse_cli_str`` (bytes decoded, else ``str(value)``) and for a ``Path`` it is
    ``Path(value)`` followed by typer's own checks (``coerce_cli_path``), which is what
    this does. Every other parameter (numbers, choices, files, custom parsers) keeps
    typer's coercion, as does a typer without this layout (older ones coerce with click
    types, no pydantic)."""
    try:
        from typer._coercion import RuntimeParam
        from typer._param_types import coerce_cli_path
    except ImportError:
        return
    plain = _plain_runtime_params(RuntimeParam, coerce_cli_path)
    for param in getattr(command, "params", ()):
        _plain_param(param, plain)
    get_help_option = getattr(command, "get_help_option", None)
    if get_help_option is None or getattr(get_help_option, "plain", False):
        return

    def plain_help_option(ctx: Any) -> Any:  # typer makes it when first asked
        option = get_help_option(ctx)
        if option is not None:
            _plain_param(option, plain)
        return option

    plain_help_option.plain = True  # type: ignore[attr-defined]
    command.get_help_option = plain_help_option


def _plain_param(param: Any, plain: dict[Any, Any]) -> None:
    desc: Any = getattr(param, "type_descriptor", None)
    info = getattr(desc, "parameter_info", None)
    if (info is None or getattr(param, "_runtime_param", False) is not None
            or desc.file_annotation is not None or getattr(info, "parser", None) is not None
            or getattr(info, "click_type", None) is not None
            or getattr(info, "path_type", None) is not None):
        return
    cls = plain.get(desc.annotation)
    if cls is not None:
        param._runtime_param = cls(parameter_info=info, annotation=desc.annotation)


@functools.cache
def _plain_runtime_params(base: Any, coerce_cli_path: Any) -> dict[Any, Any]:
    """typer ``RuntimeParam`` classes for ``str`` and ``Path`` (and their optional forms)."""

    class PlainStr(base):  # type: ignore[misc, valid-type]
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, bytes):  # as typer._adapters._parse_cli_str
                from typer._click import _compat

                enc = _compat._get_argv_encoding()
                try:
                    return value.decode(enc)
                except UnicodeError:
                    return value.decode(sys.getfilesystemencoding(), "replace")
            return str(value)

    class PlainPath(base):  # type: ignore[misc, valid-type]
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, str):
                value = Path(value)
            return coerce_cli_path(value, self.parameter_info, path_type=Path, param=param,
                                   ctx=ctx)

    class PlainBool(base):  # type: ignore[misc, valid-type]
        """A flag's value is a bool already; anything else (text from an env var) goes
        to typer's own coercion."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, bool):
                return value
            from typer._coercion import build_runtime_param

            return build_runtime_param(param.type_descriptor)._coerce_value(value, param, ctx)

    return {str: PlainStr, str | None: PlainStr, Path: PlainPath, Path | None: PlainPath,
            bool: PlainBool}
