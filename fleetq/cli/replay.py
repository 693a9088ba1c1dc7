"""``fleetq sim replay``: try a quota tree or queue policy on a workload trace before
applying it to the fleet.

Runs :func:`fleetq.simulator.simulate` (the workflows' own admission, preemption and
placement code in virtual time) and prints the report as rich tables or JSON (``-o
json``); ``--preemption``, ``--reclaim`` and ``--starvation-seconds`` override the trace's
tree annotations and starvation bound, to compare policies on one trace; ``--plot FILE``
also writes a PNG of queue lengths and utilisation over time: the queues that waited
longest one by one, the rest summed, the busiest clusters, so it reads the same with 3
queues or 1,000 (matplotlib, the ``fleetq[plot]`` extra, imported only then). A bad trace
ends in one ``error: ...`` line naming the field, and exit code 1.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from fleetq import resources as R
from fleetq.admission import QueuePolicy
from fleetq.cli.output import fail
from fleetq.preemption import PreemptionMode, ReclaimMode
from fleetq.simulator import (
    SimulationError,
    SimulationResult,
    TraceError,
    load_trace,
    simulate,
    with_overrides,
)


class Output(StrEnum):
    TEXT = "text"
    JSON = "json"


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


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def render_text(summary: dict[str, Any], trace: str, console: Console) -> None:
    """The replay's summary as text and tables, section by section."""
    _render_header(summary, trace, console)
    _render_groups(summary, console)
    _render_classes(summary, console)
    _render_queues(summary, console)
    _render_quota(summary, console)
    _render_clusters(summary, console)
    render_preemption(summary, console)
    _render_failures(summary, console)


def _render_header(summary: dict[str, Any], trace: str, console: Console) -> None:
    """The trace, the policy, the makespan and the job counts."""
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
    for row in summary["inadmissible"]["reasons"]:  # (issue 24: this tree never admits them)
        console.print(f"[yellow]inadmissible {row['jobs']}: {row['reason']}[/yellow]")


def _render_groups(summary: dict[str, Any], console: Console) -> None:
    """Time to admission and to start by group."""
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


def _render_classes(summary: dict[str, Any], console: Console) -> None:
    """The same by job class, when the trace has classes."""
    if summary["classes"]:
        t = Table(title="Time to admission and to start by job class (all its groups)")
        for col in ("class", "groups", "jobs", "done", "preempted"):
            t.add_column(col, justify="left" if col == "class" else "right")
        for what in ("admit", "start"):
            for p in ("mean", "p50", "p99"):
                t.add_column(f"{what} {p}", justify="right")
        for c in summary["classes"]:
            adm, start = c["timeToAdmission"], c["timeToStart"]
            t.add_row(
                c["class"], str(c["groups"]), str(c["jobs"]), str(c["completed"]),
                str(c["preempted"]),
                *(_seconds(adm[p]) for p in ("mean", "p50", "p99")),
                *(_seconds(start[p]) for p in ("mean", "p50", "p99")),
            )
        console.print(t)


def _render_queues(summary: dict[str, Any], console: Console) -> None:
    t = Table(title="Queues (waiting jobs)")
    for col in ("queue", "quota node", "max length", "avg length", "waiting at end"):
        t.add_column(col, justify="left" if col in ("queue", "quota node") else "right")
    for q in summary["queues"]:
        t.add_row(q["queue"], q["node"], str(q["maxLength"]), f"{q['averageLength']:.1f}",
                  str(q["waitingAtEnd"]))
    console.print(t)


def _render_quota(summary: dict[str, Any], console: Console) -> None:
    t = Table(title="Quota utilisation (usage / max, time-weighted)")
    for col in ("quota node", "resource", "max", "avg usage", "peak usage", "avg", "peak"):
        t.add_column(col, justify="left" if col in ("quota node", "resource") else "right")
    for node in summary["quota"]:
        for name, r in node["resources"].items():
            t.add_row(node["node"], name, _amount(name, r["max"]),
                      _amount(name, r["averageUsage"]), _amount(name, r["peakUsage"]),
                      _pct(r["averageUtilisation"]), _pct(r["peakUtilisation"]))
    console.print(t)


def _render_clusters(summary: dict[str, Any], console: Console) -> None:
    t = Table(title="Cluster utilisation (allocated / allocatable, time-weighted)")
    for col in ("cluster", "resource", "allocatable", "avg allocated", "avg", "peak"):
        t.add_column(col, justify="left" if col in ("cluster", "resource") else "right")
    for c in summary["clusters"]:
        for name, r in c["resources"].items():
            t.add_row(c["cluster"], name, _amount(name, r["allocatable"]),
                      _amount(name, r["averageAllocated"]), _pct(r["averageUtilisation"]),
                      _pct(r["peakUtilisation"]))
    console.print(t)


def _render_failures(summary: dict[str, Any], console: Console) -> None:
    """Placement failures by reason (or none)."""
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


def render_preemption(summary: dict[str, Any], console: Console) -> None:
    """The tree's preemption policy, then (when it preempted) preemptions by reason
    and by group with the work they wasted."""
    p = summary["preemption"]
    policy = f"preemption {p['preemption']}, reclaim {p['reclaim']}"
    if p["fairShareWeights"]:
        policy += ", fair-share weights " + ", ".join(
            f"{k}={v:g}" for k, v in p["fairShareWeights"].items()
        )
    if not p["preempted"] and not p["preemptors"]:
        console.print(f"Preemption ({policy}): no job was preempted")
        return
    reasons = ", ".join(f"{k} {v}" for k, v in p["byReason"].items()) or "none"
    console.print(
        f"Preemption ({policy}): {_count(p['preemptors'], 'preemptor')}, "
        f"{_count(p['preempted'], 'run')} preempted ({reasons}), "
        f"{_count(p['finishedDuringGrace'], 'victim')} finished during the grace period; "
        f"wasted work {p['wastedCpuSeconds']:,.0f} cpu·s ({_pct(p['wastedShare'])} of the "
        "cpu·s run)"
    )
    t = Table(title="Groups that lost runs to preemption (a preempted job waits again from "
              "its original submit time)")
    for col in ("group", "namespace", "jobs", "preempted", "wasted cpu·s"):
        t.add_column(col, justify="left" if col in ("group", "namespace") else "right")
    for g in summary["groups"]:
        if not g["preempted"]:
            continue
        t.add_row(g["group"], g["namespace"], str(g["jobs"]), str(g["preempted"]),
                  f"{g['wastedCpuSeconds']:,.0f}",
                  style="bold" if g["group"] == "all" and not g["namespace"] else None)
    console.print(t)


# --------------------------------------------------------------------------- plot

#: lines drawn per panel; the rest are summed (queues) or averaged (clusters) into one
#: "others" line, so the figure reads the same with 3 queues or 1,000
PLOT_TOP_QUEUES = 8
PLOT_TOP_CLUSTERS = 4
UNPLACED = "admitted, unplaced"
PLOT_MISSING = "--plot needs matplotlib: pip install 'fleetq[plot]'"


def _plot_unavailable() -> str | None:
    """Why ``--plot`` cannot work here (matplotlib is the ``plot`` extra), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        broken = exc.name is not None and exc.name.split(".")[0] != "matplotlib"
        return PLOT_MISSING + (f" (matplotlib does not import: {exc})" if broken else "")
    return None


def _stepped(series: Any, end: float) -> tuple[list[float], list[float]]:
    """A step series as ``(xs, ys)`` for ``step(where="post")``, held until ``end``."""
    return [*series.times, max(end, series.times[-1])], [*series.values, series.values[-1]]


def _combined(series: list[Any], scale: float = 1.0) -> Any:
    """The sum of step series (times ``scale``) as one step series: every change point
    of every input is a change point of the result, in O(points log points)."""
    import numpy as np

    from fleetq.simulator import StepSeries

    times = np.concatenate([np.asarray(s.times, dtype=float) for s in series])
    deltas = np.concatenate([np.diff(np.asarray(s.values, dtype=float), prepend=0.0)
                             for s in series])
    order = np.argsort(times, kind="stable")
    times, values = times[order], np.cumsum(deltas[order]) * scale
    last = np.append(times[1:] != times[:-1], True)  # the value after all changes at t
    out = StepSeries(float(times[0]), float(values[last][0]))
    for t, v in zip(times[last][1:], values[last][1:], strict=True):
        out.set(float(t), float(v))
    return out


@dataclass
class PlotLines:
    """What the plot draws, decided without matplotlib (testable on its own)."""

    queue_count: int
    #: the queues with the most job-seconds of waiting, at most PLOT_TOP_QUEUES
    top: list[tuple[str, Any]]
    #: the other queues that had waiting jobs, summed into one line (None: none left)
    others: tuple[str, Any] | None
    #: every queue summed, and the jobs admitted but not placed yet
    total: Any | None
    unplaced: Any | None
    waiting_queue_count: int
    cluster_count: int
    #: ``(cluster label, resource, utilisation 0..1)``: the busiest clusters, then the
    #: rest averaged per resource as ``others (N clusters, mean)``
    clusters: list[tuple[str, str, Any]] = field(default_factory=list)


def plot_lines(result: SimulationResult) -> PlotLines:
    end = result.end
    qseries = {k: v for k, v in result.series["queueLength"].items() if k != UNPLACED}
    waited = {q: s.integral(end) for q, s in qseries.items()}
    ranked = sorted((q for q in qseries if waited[q] > 0), key=lambda q: (-waited[q], q))
    top, rest = ranked[:PLOT_TOP_QUEUES], ranked[PLOT_TOP_QUEUES:]
    span = max(end - result.t0, 1e-9)
    unplaced = result.series["queueLength"].get(UNPLACED)
    lines = PlotLines(
        queue_count=len(qseries),
        top=[(f"{q} (avg {waited[q] / span:.1f})", qseries[q]) for q in top],
        others=(f"others ({len(rest)} queues, summed)", _combined([qseries[q] for q in rest]))
        if rest else None,
        total=_combined([qseries[q] for q in ranked]) if ranked else None,
        unplaced=unplaced if unplaced is not None and unplaced.peak() > 0 else None,
        waiting_queue_count=len(ranked),
        cluster_count=0,
    )

    by_cluster: dict[str, dict[str, Any]] = {}
    for name, s in result.series["clusterUtilisation"].items():
        cluster, _, resource = name.partition("/")
        if resource != R.PODS:
            by_cluster.setdefault(cluster, {})[resource] = s
    busy = {c: sum(s.average(end) for s in rs.values()) / len(rs)
            for c, rs in by_cluster.items()}
    order = sorted(by_cluster, key=lambda c: (-busy[c], c))
    shown, others = order[:PLOT_TOP_CLUSTERS], order[PLOT_TOP_CLUSTERS:]
    if len(others) == 1:  # one more line says more than an "average of 1"
        shown, others = order, []
    lines.cluster_count = len(by_cluster)
    lines.clusters = [(c, r, s) for c in sorted(shown) for r, s in by_cluster[c].items()]
    if others:
        label = f"others ({len(others)} clusters, mean)"
        for r in sorted({r for c in others for r in by_cluster[c]}, key=_resource_order):
            members = [by_cluster[c][r] for c in others if r in by_cluster[c]]
            lines.clusters.append((label, r, _combined(members, 1.0 / len(members))))
    return lines


def _resource_order(name: str) -> tuple[int, str]:
    known = (R.CPU, R.MEMORY, R.GPU)
    return (known.index(name) if name in known else len(known), name)


def write_plot(result: SimulationResult, path: Path, title: str) -> None:
    """Stacked panels sharing the time axis, legends outside on the right: the queues
    that waited longest (one line each); when there are more queues than that, a panel
    above with every queue summed, the rest as "others" and the admitted-but-unplaced
    jobs (summed over hundreds of queues they would flatten the single queues' scale);
    and cluster utilisation per resource (the busiest clusters, the rest averaged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = plot_lines(result)
    panels = 3 if lines.others is not None else 2
    fig, axes = plt.subplots(panels, 1, figsize=(12, 3.2 * panels + 0.6), sharex=True)
    totals, top, bottom = (axes[0], axes[1], axes[2]) if panels == 3 else (None, *axes)
    legend: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0),
                              "fontsize": "small", "title_fontsize": "small",
                              "borderaxespad": 0}
    unplaced_style = {"color": "black", "linestyle": "--", "linewidth": 1.0}
    try:
        end = result.end
        axes[0].set_title(title)
        if totals is not None:
            _plot_totals(totals, lines, end, legend, unplaced_style)
        _plot_queues(top, lines, end, legend, unplaced_style, with_totals=totals is not None)
        _plot_clusters(bottom, lines, end, legend)
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)


def _plot_totals(totals: Any, lines: Any, end: float, legend: dict[str, Any],
                 unplaced_style: dict[str, Any]) -> None:
    """The fleet-wide panel: every queue summed, the rest as "others", the unplaced."""
    if lines.others is None or lines.total is None:
        return
    n, waiting = lines.queue_count, lines.waiting_queue_count
    totals.step(*_stepped(lines.total, end), where="post", color="C0", linewidth=1.4,
                label=f"all {waiting} queues that had waiting jobs")
    label, s = lines.others
    totals.step(*_stepped(s, end), where="post", color="0.45", linewidth=1.2,
                label=f"{label[:-1]}: all but the top {len(lines.top)})")
    if lines.unplaced is not None:
        totals.step(*_stepped(lines.unplaced, end), where="post", label=UNPLACED,
                    **unplaced_style)
    totals.set_ylabel("waiting jobs")
    totals.grid(alpha=0.3)
    totals.legend(title=f"fleet-wide: {n} queues", **legend)


def _plot_queues(top: Any, lines: Any, end: float, legend: dict[str, Any],
                 unplaced_style: dict[str, Any], *, with_totals: bool) -> None:
    """The queues that waited longest, one line each (and the unplaced, without the
    fleet-wide panel)."""
    n, waiting = lines.queue_count, lines.waiting_queue_count
    for i, (label, s) in enumerate(lines.top):
        top.step(*_stepped(s, end), where="post", label=label, color=f"C{i % 10}",
                 linewidth=1.2)
    if not with_totals and lines.unplaced is not None:
        top.step(*_stepped(lines.unplaced, end), where="post", label=UNPLACED,
                 **unplaced_style)
    top.set_ylabel("waiting jobs")
    top.grid(alpha=0.3)
    if lines.top:
        heading = (f"top {len(lines.top)} of {n} queues by waiting time"
                   if lines.others is not None
                   else f"{waiting} of {n} queues had jobs waiting")
        top.legend(title=heading, **legend)
    else:
        top.text(0.5, 0.5, f"no job waited in any of the {n} queues",
                 transform=top.transAxes, ha="center", va="center")


def _plot_clusters(bottom: Any, lines: Any, end: float, legend: dict[str, Any]) -> None:
    """Cluster utilisation per resource: the busiest clusters, the rest averaged."""
    colours: dict[str, str] = {}
    styles = {R.CPU: "-", R.MEMORY: ":", R.GPU: "--"}
    for cluster, resource, s in lines.clusters:
        colour = ("0.45" if cluster.startswith("others (")
                  else colours.setdefault(cluster, f"C{len(colours) % 10}"))
        xs, ys = _stepped(s, end)
        bottom.step(xs, [100 * y for y in ys], where="post", color=colour,
                    linestyle=styles.get(resource, "-."), linewidth=1.2,
                    label=f"{cluster} {resource}")
    count = lines.cluster_count
    heading = (f"busiest {min(count, PLOT_TOP_CLUSTERS)} of {count} clusters"
               if any(c.startswith("others (") for c, _, _ in lines.clusters)
               else f"{count} clusters")
    bottom.set_ylabel("allocated / allocatable (%)")
    bottom.set_xlabel("time (s)")
    bottom.set_ylim(0, 105)
    bottom.grid(alpha=0.3)
    if lines.clusters:
        bottom.legend(title=heading, **legend)


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
        preemption: Annotated[
            PreemptionMode | None,
            typer.Option("--preemption",
                         help="Override the tree's fleetq.io/preemption annotation"),
        ] = None,
        reclaim: Annotated[
            ReclaimMode | None,
            typer.Option("--reclaim", help="Override the tree's fleetq.io/reclaim annotation"),
        ] = None,
        starvation_seconds: Annotated[
            float | None,
            typer.Option("--starvation-seconds", min=0,
                         help="Override the trace's starvationSeconds (Priority policy)"),
        ] = None,
    ) -> None:
        """What-if: replay a workload trace with the scheduler's own quota/placement code.

        Reports makespan, quota and cluster utilisation, time to admission and to start,
        placement failures by reason, queue lengths, and preemptions with the work they
        wasted, in virtual time."""
        if plot is not None and (missing := _plot_unavailable()):
            raise fail(missing, 1)  # before a simulation that may take a while
        try:
            tr = with_overrides(
                load_trace(trace),
                preemption=preemption,
                reclaim=reclaim,
                starvation_seconds=starvation_seconds,
            )
        except TraceError as exc:
            raise fail(str(exc), 1) from None
        try:
            result = simulate(tr, policy)
        except SimulationError as exc:
            raise fail(str(exc), 1) from None
        summary = result.summary()
        if plot is not None:
            try:
                write_plot(result, plot, f"{trace.name} ({summary['policy']})")
            except OSError as exc:
                raise fail(f"--plot {plot}: cannot write ({exc.strerror})", 1) from None
        if output is Output.JSON:
            typer.echo(json.dumps(summary, indent=2))
        else:
            console = Console(width=None if sys.stdout.isatty() else 160)
            render_text(summary, str(trace), console)
            if plot is not None:
                console.print(f"plot written to {plot}")
