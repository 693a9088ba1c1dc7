"""``fleetq sim``: run the member-cluster emulator and inject faults into it.

``fleetq sim serve`` runs emulated clusters in the foreground (Ctrl-C/SIGTERM stops
them cleanly, saving ``--state``); ``fleetq sim fault`` talks to a running emulator's
control endpoint, found with ``--control URL``, else like every other command finds the
fleet (``--state-dir`` / ``FLEETQ_STATE_DIR``, ``FLEETQ_CONFIG``): the ``emulator.json``
beside the fleet config (``<state-dir>/sim/`` of a ``fleetq up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer

from fleetq.cli.output import fail
from fleetq.emulator.faults import ACTIONS
from fleetq.emulator.fleet import INFO_FILE, Emulator, EmulatorError
from fleetq.topology import TopologyError, default_topology, load_topology

app = typer.Typer(help="Member-cluster emulator (loopback Kubernetes API servers).",
                  no_args_is_help=True, rich_markup_mode=None)

DEFAULT_DIR = Path(os.environ.get("FLEETQ_SIM_DIR", "~/.fleetq/sim")).expanduser()


@app.command()
def serve(
    topology: Annotated[Path | None, typer.Option(help="Topology YAML (default: shipped)")] = None,
    out_dir: Annotated[
        Path, typer.Option(help="Where kubeconfig and fleet config go")
    ] = DEFAULT_DIR,
    state: Annotated[Path | None, typer.Option(help="Persist objects here across restarts")] = None,
    host: Annotated[str, typer.Option(help="Address the cluster APIs listen on")] = "127.0.0.1",
    base_port: Annotated[
        int | None, typer.Option(help="Cluster i listens on BASE+i; control on BASE+N")
    ] = None,
    start_delay: Annotated[float, typer.Option(help="Seconds a bound pod stays Pending")] = 0.2,
) -> None:
    """Serve emulated member clusters in the foreground."""
    try:
        topo = load_topology(topology) if topology else default_topology()
    except TopologyError as exc:
        raise fail(str(exc)) from None
    if base_port is not None and not 1 <= base_port <= 65535 - len(topo.clusters):
        raise fail("--base-port must leave room for one port per cluster plus one")
    emu = Emulator(topo, out_dir, state_file=state, host=host, base_port=base_port,
                   start_delay=start_delay)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await emu.start()
        try:
            for name, c in emu.clusters.items():
                role = "member" if c.spec.member else "source (hub)"
                typer.echo(f"cluster {name:<16} {c.url}  {role}, {len(c.controller.nodes)} nodes")
            typer.echo(f"control      {emu.control_url}")
            typer.echo(f"kubeconfig   {emu.kubeconfig_path}")
            typer.echo(f"fleet config {emu.fleet_config_path}")
            if state:
                typer.echo(f"state        {state.resolve()}")
            typer.echo("serving; Ctrl-C to stop", err=True)
            await emu.run_forever(stop)
        finally:
            await emu.stop()
        typer.echo("stopped", err=True)

    try:
        asyncio.run(main())
    except EmulatorError as exc:
        raise fail(str(exc)) from None


def _emulator_info_candidates(state_dir: Path | None) -> list[Path]:
    """Where a running emulator's ``emulator.json`` may be, in the order the other
    commands look for the fleet: ``--state-dir`` (a ``fleetq up`` state dir, whose
    emulator lives in ``sim/``, or a ``sim serve --out-dir``); else next to
    ``FLEETQ_CONFIG``; else the running ``fleetq up`` of ``$FLEETQ_STATE_DIR`` (or
    ``~/.fleetq``); else ``$FLEETQ_SIM_DIR`` (``~/.fleetq/sim``)."""
    from fleetq.cli.context import FLEET_CONFIG_ENV
    from fleetq.runtime.fleet_info import default_state_dir, read_info

    out: list[Path] = []
    if state_dir is not None:
        directory = state_dir.expanduser()
        info = read_info(directory)
        if info and info.fleet_config:
            out.append(Path(info.fleet_config).parent / INFO_FILE)
        out += [directory / "sim" / INFO_FILE, directory / INFO_FILE]
        return out
    env = os.environ.get(FLEET_CONFIG_ENV)
    if env:
        out.append(Path(env).expanduser().parent / INFO_FILE)
    info = read_info()
    if info and info.fleet_config:
        out.append(Path(info.fleet_config).parent / INFO_FILE)
    out += [default_state_dir() / "sim" / INFO_FILE, DEFAULT_DIR / INFO_FILE]
    return list(dict.fromkeys(out))


def _control_url(control: str | None, state_dir: Path | None) -> str:
    """The control URL of the emulator of the fleet the other commands use."""
    from fleetq.runtime.fleet_info import pid_alive

    if control:
        return control.rstrip("/")
    candidates = _emulator_info_candidates(state_dir)
    for info in candidates:
        try:
            data = json.loads(info.read_text())
            url = str(data["controlUrl"]).rstrip("/")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(data.get("pid"), int) and not pid_alive(data["pid"]):
            continue  # left behind by an emulator that was killed
        return url
    looked = ", ".join(str(c) for c in candidates)
    raise fail(f"no running emulator found (looked for {looked}); pass --control URL or "
                "--state-dir DIR")


@app.command()
def fault(
    cluster: Annotated[str, typer.Argument(help="Cluster name")],
    action: Annotated[str, typer.Argument(help=" | ".join(ACTIONS))],
    target: Annotated[
        str | None, typer.Argument(help="NS/NAME for fail-job, NODE for cordon/uncordon")
    ] = None,
    control: Annotated[str | None, typer.Option(help="Control URL of the emulator")] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="State dir of the fleetq up whose emulator to use (or a sim "
                          "serve --out-dir). Default: the fleet the other commands use "
                          "(FLEETQ_CONFIG, else $FLEETQ_STATE_DIR, else ~/.fleetq)"),
    ] = None,
    status: Annotated[int, typer.Option(help="errors: HTTP status to answer")] = 500,
    rate: Annotated[float, typer.Option(help="errors: fraction of requests that fail")] = 1.0,
    retry_after: Annotated[float | None, typer.Option(help="errors: Retry-After seconds")] = None,
    seconds: Annotated[float, typer.Option(help="latency: added seconds per request")] = 0.0,
) -> None:
    """Inject or clear a fault in a running emulator."""
    body = _fault_body(action, target, status=status, rate=rate, retry_after=retry_after,
                       seconds=seconds)
    _post_fault(f"{_control_url(control, state_dir)}/clusters/{cluster}/faults", body)


def _fault_body(action: str, target: str | None, *, status: int, rate: float,
                retry_after: float | None, seconds: float) -> dict[str, Any]:
    """The emulator's fault request for ``action`` (one line on bad input)."""
    if action not in ACTIONS:
        raise fail(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
    body: dict[str, Any] = {"action": action}
    if action == "fail-job":
        if not target:
            raise fail("fail-job needs NAMESPACE/NAME")
        body["job"] = target
    elif action in ("cordon", "uncordon"):
        if not target:
            raise fail(f"{action} needs a NODE")
        body["node"] = target
    elif action == "errors":
        body.update(status=status, rate=rate, retry_after=retry_after)
    elif action == "latency":
        body["seconds"] = seconds
    return body


def _post_fault(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            typer.echo(json.loads(resp.read()).get("message", "ok"))
    except urllib.error.HTTPError as exc:
        try:
            msg = json.loads(exc.read()).get("error", str(exc))
        except ValueError:
            msg = str(exc)
        raise fail(msg) from None
    except (urllib.error.URLError, OSError) as exc:
        raise fail(f"cannot reach the emulator at {url}: {exc}") from None


from fleetq.cli import replay as _replay  # noqa: E402

_replay.register(app)
