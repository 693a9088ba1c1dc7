"""``fleetq apply -f``: put manifests into the fleet, like ``kubectl apply``.

Everything is validated first (the same loader as ``fleetq validate``); any problem
prints its lines and nothing is applied. Then the client library
(:mod:`fleetq.client.apply`) applies the objects in dependency order; this command prints
one kubectl line per object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from fleetq.cli.context import get_client, guarded, run

if TYPE_CHECKING:
    from fleetq.client.apply import Applied


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def apply(
        files: list[str] = typer.Option(
            ..., "-f", "--filename",
            help="Manifest file, directory (read recursively) or - for stdin. Repeatable."),
        run_seconds: int | None = typer.Option(
            None, "--run-seconds",
            help="Emulator hint: the job's pods finish after this many seconds."),
    ) -> None:
        """Apply ElasticQuotaTrees, PriorityClasses, PropagationPolicies and PyTorchJobs."""
        from fleetq.client.admissibility import inadmissible_warnings
        from fleetq.client.apply import apply_objects, load_for_apply

        warnings: list[str] = []
        objects, classes, notes = load_for_apply(files, warnings=warnings)
        for note in notes:
            typer.echo(f"note: {note}", err=True)
        for line in warnings:
            typer.echo(f"warning: {line}", err=True)

        async def body() -> tuple[list[Applied], list[str]]:
            client = await get_client()
            results = await apply_objects(client, objects, run_seconds=run_seconds,
                                          priority_classes=classes)
            warnings = await inadmissible_warnings(client, [o for o, _ in objects], classes)
            return results, warnings

        results, warnings = run(body)
        for r in results:
            typer.echo(r.line, err=not r.ok)
        for line in warnings:  # (issue 24: it would wait until the tree is raised)
            typer.echo(line, err=True)
        if not all(r.ok for r in results):
            raise typer.Exit(1)
