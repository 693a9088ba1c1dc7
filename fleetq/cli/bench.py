"""``fleetq bench NAME [args...]``: run one of fleetq's benchmarks (``bench/NAME.py``).

Each benchmark is a module with ``main(argv) -> int`` that prints its figures and ends
with ``RESULT <name> <ratio> (target <t>)``; options after NAME go to it unchanged
(``fleetq bench e2e --jobs 100``, ``fleetq bench queue --help``). BENCHMARKS.md records
the figures and the commands that produced them.
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

#: name -> what it measures (the module is ``bench.<name>``)
BENCHMARKS: dict[str, str] = {
    "e2e": "end-to-end job throughput vs. plain workflows with as many activities",
    "queue": "10,000 jobs through one max-jobs 100 leaf vs. plain signals into one workflow",
    "placement": "gang placement over 100 x 1,000 nodes vs. one linear numpy pass",
    "capacity": "cold LIST of the fleet vs. the watch-fed capacity cache",
    "history": "history events per job, and per run of a 7-day job",
    "chaos": "scheduling under member-cluster faults",
    "admission": "a quota-workflow task at 1,000 leaves vs. 6, and bytes per waiting job",
    "trace": "a workload trace through the real stack vs. the simulator on the same trace",
    "workers": "many worker processes: enqueue bursts, jobs/s with 2 vs 1, the bind Lease",
    "cli_latency": "fleetq get pytorchjob vs. temporal workflow list on one server; --help",
    "kueue": "Kueue's own scheduler performance harness beside fleetq on the same workloads",
    "sustained": "one tree fed at a steady rate on the production-shaped Temporal, db at 0-20 ms",
}


class BenchError(Exception):
    """A benchmark that cannot be run; the message is one line."""


def listing() -> str:
    width = max(len(n) for n in BENCHMARKS)
    return "\n".join(f"  {n:<{width}}  {what}" for n, what in BENCHMARKS.items())


def resolve(name: str) -> str:
    """The module of benchmark ``name``, or :class:`BenchError`."""
    if name not in BENCHMARKS:
        raise BenchError(f"unknown benchmark {name!r}; choose one of: {', '.join(BENCHMARKS)}")
    module = f"bench.{name}"
    if importlib.util.find_spec(module) is None:
        raise BenchError(f"benchmark {name!r} is not available in this install "
                         f"(bench/{name}.py is missing)")
    return module


def run_benchmark(name: str, argv: list[str]) -> int:
    """Import ``bench.<name>`` and return its ``main(argv)`` exit code."""
    module = importlib.import_module(resolve(name))
    code: int = module.main(argv)
    return code


def register(app: typer.Typer) -> None:
    @app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                          "help_option_names": []},
        add_help_option=False,
    )
    def bench(ctx: typer.Context, name: str = typer.Argument("", show_default=False)) -> None:
        """Run a benchmark: fleetq bench NAME [options]; fleetq bench NAME --help."""
        if name in ("", "-h", "--help", "help"):
            typer.echo("usage: fleetq bench NAME [options]\n\nbenchmarks:\n" + listing())
            raise typer.Exit(0 if name else 2)
        try:
            code = run_benchmark(name, list(ctx.args))
        except BenchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(code)
