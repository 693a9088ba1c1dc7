"""Benchmark: how long an everyday fleetq command takes next to the temporal CLI (issue 27,
item 6).

On an embedded fleet with the walkthrough applied, wall and CPU times of whole processes:
``fleetq get pytorchjob`` (over the Web UI server's HTTP API, and over the SDK), ``temporal
workflow list`` with the same query, ``fleetq --help`` and two interpreter floors. Method:
BENCHMARKS.md "Bench methods"; figures: §9.

RESULT line: ``RESULT clilatency <median fleetq get (HTTP) ÷ median temporal workflow list>
(target 3.0)``, lower is better; exit code 1 when above the target. Run: ``fleetq bench
cli_latency [--repeat 10]``; ``--fleetq PATH`` times another install's ``fleetq``.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import typer

from bench.command import bench_app, help_text, run_command

TARGET = 3.0
QUERY = 'WorkflowType = "PyTorchJobWorkflow"'


@dataclass
class Timed:
    """One command line and the wall seconds of each of its runs."""

    label: str
    argv: list[str]
    expect: str  # a run must print this (stdout or stderr), or the figure is void
    #: on top of the bench's environment
    env: dict[str, str] = field(default_factory=dict)
    #: a run that prints this is void (the HTTP row falling back to the SDK)
    refuse: str = "\0"
    seconds: list[float] = field(default_factory=list)
    #: CPU seconds (user + system) of each run: less moved by a loaded machine than wall
    cpu: list[float] = field(default_factory=list)

    def run(self, env: dict[str, str]) -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(self.argv, capture_output=True, text=True,
                              env={**env, **self.env}, timeout=120)
        elapsed = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        printed = proc.stdout + proc.stderr
        if proc.returncode != 0 or self.expect not in printed or self.refuse in printed:
            raise RuntimeError(f"{self.label} failed (exit {proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[:300]}")
        return elapsed, cpu

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def line(self) -> str:
        return (f"  {self.label:<34} median {self.median:6.3f} s   min {min(self.seconds):6.3f}"
                f"   max {max(self.seconds):6.3f}   cpu median {statistics.median(self.cpu):6.3f} s"
                f"   (n={len(self.seconds)})")


def fleetq_argv() -> list[str]:
    """The ``fleetq`` console script of this environment (else ``python -m fleetq.cli``)."""
    script = Path(sys.executable).with_name("fleetq")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fleetq.cli"]


def commands(address: str, fleetq: list[str]) -> list[Timed]:
    from fleetq.client.connection import temporal_cli_path

    return [
        # the default: fleetq.json names the dev server's Web UI, whose HTTP API answers
        # (FLEETQ_DEBUG makes a fallback to the SDK say so, which voids the run)
        Timed("fleetq get pytorchjob (HTTP)", [*fleetq, "get", "pytorchjob"], "pytorch-test",
              env={"FLEETQ_DEBUG": "1"}, refuse="reading over the SDK"),
        Timed("fleetq get pytorchjob (SDK)", [*fleetq, "get", "pytorchjob"], "pytorch-test",
              env={"FLEETQ_HTTP_API": "off"}),
        Timed("temporal workflow list (same query)",
              [str(temporal_cli_path()), "workflow", "list", "--address", address,
               "--query", QUERY], "pytorchjob/default/pytorch-test"),
        Timed("fleetq --help", [*fleetq, "--help"], "Usage: fleetq"),
        Timed("python -c pass (interpreter start)", [sys.executable, "-c", "pass"], ""),
        Timed("python: import temporalio.client", [sys.executable, "-c",
              "import temporalio.client"], ""),
    ]


async def _apply_walkthrough(address: str) -> None:
    from fleetq.cli.up import WALKTHROUGH, walkthrough_dir
    from fleetq.client.apply import apply_objects, load_for_apply
    from fleetq.client.connection import connect

    client = await connect(address)
    files = [str(walkthrough_dir() / f) for f in WALKTHROUGH]
    objects, classes, _ = load_for_apply(files)
    for r in await apply_objects(client, objects, priority_classes=classes):
        if not r.ok:
            raise RuntimeError(r.line)


def measure(repeat: int, fleetq: list[str]) -> tuple[list[Timed], str]:
    from fleetq.runtime.embedded import EmbeddedFleet
    from fleetq.runtime.supervisor import free_port

    state = Path(tempfile.mkdtemp(prefix="fleetq-bench-cli-"))
    fleet = EmbeddedFleet(state, port=free_port(), ui_port=free_port())
    try:
        fleet.start()
        asyncio.run(_apply_walkthrough(fleet.address))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "FLEETQ_"))}
        env["FLEETQ_STATE_DIR"] = str(state)  # as a user after `fleetq up --state-dir`
        timed = commands(fleet.address, fleetq)
        for t in timed:  # warm-up: page cache, bytecode, the job's first query
            t.run(env)
        for _ in range(repeat):  # interleaved, so load on the machine hits every command
            for t in timed:
                wall, cpu = t.run(env)
                t.seconds.append(wall)
                t.cpu.append(cpu)
        return timed, fleet.address
    finally:
        fleet.stop(grace=2.0)
        shutil.rmtree(state, ignore_errors=True)


app = bench_app()


@app.command(help=help_text(__doc__))
def _run(repeat: int = typer.Option(10, "--repeat", min=1, help="timed runs of each command"),
         fleetq: Path | None = typer.Option(
             None, "--fleetq", exists=True, dir_okay=False,
             help="the fleetq executable to time (default: this environment's)")) -> None:
    from bench.common import result_line

    argv = [str(fleetq)] if fleetq is not None else fleetq_argv()
    print(f"fleetq: {' '.join(argv)}")
    try:
        timed, address = measure(repeat, argv)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:  # EmbeddedError included
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        raise typer.Exit(1) from None
    get, get_sdk, temporal, help_, floor, sdk = timed
    print(f"wall time of whole processes against one dev server ({address}), "
          f"{repeat} interleaved runs each after a warm-up:")
    for t in timed:
        print(t.line())
    print(f"  fleetq get above the interpreter start: {get.median - floor.median:.3f} s; "
          f"fleetq --help above it: {help_.median - floor.median:.3f} s; fleetq get over the "
          f"SDK above importing temporalio.client: {get_sdk.median - sdk.median:.3f} s")
    cpu = statistics.median(get.cpu) / statistics.median(temporal.cpu)
    print(f"CPU: fleetq get pytorchjob ÷ temporal workflow list: {cpu:.2f} (over the SDK: "
          f"{statistics.median(get_sdk.cpu) / statistics.median(temporal.cpu):.2f})")
    print(f"over the SDK (FLEETQ_HTTP_API=off): fleetq get pytorchjob ÷ temporal workflow "
          f"list: {get_sdk.median / temporal.median:.2f}")
    ratio = get.median / temporal.median
    print(f"fleetq get pytorchjob ÷ temporal workflow list: {ratio:.2f} (target ≤ {TARGET})")
    print(result_line("clilatency", ratio, TARGET))
    raise typer.Exit(0 if ratio <= TARGET else 1)


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "fleetq bench cli_latency")


if __name__ == "__main__":
    raise SystemExit(main())
