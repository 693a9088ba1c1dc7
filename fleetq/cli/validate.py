"""``fleetq validate``: check manifests offline (placeholder; owned by the manifests work)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def validate(files: list[str] = typer.Option(..., "-f", "--filename")) -> None:
        """Validate manifests."""
        raise typer.Exit(2)
