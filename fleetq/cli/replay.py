"""``fleetq sim replay``: try a quota tree or queue policy on a workload trace before
applying it to the fleet.

Runs :func:`fleetq.simulator.simulate` (the workflows' own admission and placement code in
virtual time) and prints the report as rich tables or JSON (``-o json``); ``--plot FILE``
also writes a PNG of queue lengths and utilisation over time (matplotlib, imported only
then). A bad trace ends in one ``error: ...`` line naming the field, and exit code 1.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from fleetq import resources as R
from fleetq.admission import QueuePolicy
from fleetq.simulator import SimulationResult, TraceError, load_trace, simulate


class Output(StrEnum):
    TEXT = "text"
    JSON = "json"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


# --------------------------------------------------------------------------- text


def _seconds(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 100:
        return f"{v:.1f}s"
    if v < 3600:
        return f"{v / 60:.1f}m"
    return f"{v / 3600:.2f}h"


def _amount(name: str, v: float | None) -> str:
    """A quantity in canonical units (cores, bytes, GPUs, jobs) for humans."""
    if v is None:
        return "-"
    if name == R.MEMORY or name.endswith("storage"):
        for suffix, factor in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
            if v >= (10 * factor if suffix == "Ti" else factor):
                return f"{v / factor:.1f}{suffix}".replace(".0" + suffix, suffix)
        return f"{v:.0f}"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def render_text(summary: dict[str, Any], trace: str, console: Console) -> None:
    jobs = summary["jobs"]
    console.print(
        f"[bold]Replay of {trace}[/bold]: policy {summary['policy']}, "
        f"starvation bound {summary['starvationSeconds']:g}s, seed {summary['seed']}"
    )
    console.print(
        f"makespan {_seconds(summary['makespan'])} ({summary['makespan']:g}s); "
        f"jobs submitted {jobs['submitted']}, admitted {jobs['admitted']}, "
        f"started {jobs['started']}, completed {jobs['completed']}"
        + (
            f"; [yellow]still waiting for quota {jobs['waitingForQuotaAtEnd']}, "
            f"admitted but never placed {jobs['unplacedAtEnd']}[/yellow]"
            if jobs["waitingForQuotaAtEnd"] or jobs["unplacedAtEnd"]
            else ""
        )
    )

    t = Table(title="Time to admission (submit -> quota) and to start (submit -> bound)")
    for col in ("group", "namespace", "jobs", "done"):
        t.add_column(col, justify="left" if col in ("group", "namespace") else "right")
    for what in ("admit", "start"):
        for p in ("mean", "p50", "p90", "p99"):
            t.add_column(f"{what} {p}", justify="right")
    for g in summary["groups"]:
        adm, start = g["timeToAdmission"], g["timeToStart"]
        t.add_row(
            g["group"], g["namespace"], str(g["jobs"]), str(g["completed"]),
            *(_seconds(adm[p]) for p in ("mean", "p50", "p90", "p99")),
            *(_seconds(start[p]) for p in ("mean", "p50", "p90", "p99")),
            style="bold" if g["group"] == "all" and not g["namespace"] else None,
        )
    console.print(t)

    t = Table(title="Queues (waiting jobs)")
    for col in ("queue", "quota node", "max length", "avg length", "waiting at end"):
        t.add_column(col, justify="left" if col in ("queue", "quota node") else "right")
    for q in summary["queues"]:
        t.add_row(q["queue"], q["node"], str(q["maxLength"]), f"{q['averageLength']:.1f}",
                  str(q["waitingAtEnd"]))
    console.print(t)

    t = Table(title="Quota utilisation (usage / max, time-weighted)")
    for col in ("quota node", "resource", "max", "avg usage", "peak usage", "avg", "peak"):
        t.add_column(col, justify="left" if col in ("quota node", "resource") else "right")
    for node in summary["quota"]:
        for name, r in node["resources"].items():
            t.add_row(node["node"], name, _amount(name, r["max"]),
                      _amount(name, r["averageUsage"]), _amount(name, r["peakUsage"]),
                      _pct(r["averageUtilisation"]), _pct(r["peakUtilisation"]))
    console.print(t)

    t = Table(title="Cluster utilisation (allocated / allocatable, time-weighted)")
    for col in ("cluster", "resource", "allocatable", "avg allocated", "avg", "peak"):
        t.add_column(col, justify="left" if col in ("cluster", "resource") else "right")
    for c in summary["clusters"]:
        for name, r in c["resources"].items():
            t.add_row(c["cluster"], name, _amount(name, r["allocatable"]),
                      _amount(name, r["averageAllocated"]), _pct(r["averageUtilisation"]),
                      _pct(r["peakUtilisation"]))
    console.print(t)

    failures = summary["placementFailures"]
    if failures["reasons"]:
        t = Table(
            title=f"Placement failures by reason: {failures['delayedJobs']} jobs held quota "
            f"but fitted no cluster at first ({failures['failedAttempts']} failed attempts); "
            "a job counts under every reason a cluster gave"
        )
        for col in ("reason", "jobs", "clusters", "example"):
            t.add_column(col, justify="right" if col == "jobs" else "left")
        for r in failures["reasons"]:
            t.add_row(r["reason"], str(r["jobs"]), ", ".join(r["clusters"]), r["example"])
        console.print(t)
    else:
        console.print("Placement failures: none (every admitted job fitted at once)")


# --------------------------------------------------------------------------- plot


def write_plot(result: SimulationResult, path: Path, title: str) -> None:
    """Two stacked subplots: queue lengths, and cluster utilisation per resource."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    try:
        end = result.end

        def steps(ax: Any, series: Any, label: str, **kw: Any) -> None:
            xs = [*series.times, max(end, series.times[-1])]
            ys = [*series.values, series.values[-1]]
            ax.step(xs, ys, where="post", label=label, linewidth=1.2, **kw)

        for name, s in result.series["queueLength"].items():
            steps(top, s, name, linestyle="--" if name == "admitted, unplaced" else "-")
        top.set_ylabel("waiting jobs")
        top.set_title(title)
        top.legend(loc="upper right", fontsize="small")
        top.grid(alpha=0.3)
        colours: dict[str, str] = {}
        styles = {R.CPU: "-", R.MEMORY: ":", R.GPU: "--"}
        for name, s in result.series["clusterUtilisation"].items():
            cluster, _, resource = name.partition("/")
            if resource == R.PODS:
                continue
            colour = colours.setdefault(cluster, f"C{len(colours) % 10}")
            steps(bottom, _percent(s), name, color=colour,
                  linestyle=styles.get(resource, "-."))
        bottom.set_ylabel("allocated / allocatable (%)")
        bottom.set_xlabel("time (s)")
        bottom.set_ylim(0, 105)
        bottom.legend(loc="upper right", fontsize="small", ncol=2)
        bottom.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def _percent(s: Any) -> Any:
    from fleetq.simulator import StepSeries

    out = StepSeries(s.times[0], s.values[0] * 100)
    out.times = list(s.times)
    out.values = [v * 100 for v in s.values]
    return out


# --------------------------------------------------------------------------- command


def register(app: typer.Typer) -> None:
    @app.command()
    def replay(
        trace: Annotated[Path, typer.Option("--trace", help="Workload trace YAML")],
        output: Annotated[Output, typer.Option("-o", "--output", help="text or json")] = (
            Output.TEXT
        ),
        plot: Annotated[
            Path | None, typer.Option("--plot", help="Write a PNG of queues and utilisation")
        ] = None,
        policy: Annotated[
            QueuePolicy | None,
            typer.Option("--policy", help="Override the trace's queuePolicy"),
        ] = None,
    ) -> None:
        """What-if: replay a workload trace with the scheduler's own quota/placement code.

        Reports makespan, quota and cluster utilisation, time to admission and to start,
        placement failures by reason and queue lengths, in virtual time."""
        try:
            tr = load_trace(trace)
        except TraceError as exc:
            raise _fail(str(exc)) from None
        result = simulate(tr, policy)
        summary = result.summary()
        if plot is not None:
            try:
                write_plot(result, plot, f"{trace.name} ({summary['policy']})")
            except ImportError:
                raise _fail("--plot needs matplotlib (pip install 'fleetq[plot]')") from None
            except OSError as exc:
                raise _fail(f"--plot {plot}: cannot write ({exc.strerror})") from None
        if output is Output.JSON:
            typer.echo(json.dumps(summary, indent=2))
        else:
            console = Console(width=None if sys.stdout.isatty() else 160)
            render_text(summary, str(trace), console)
            if plot is not None:
                console.print(f"plot written to {plot}")
