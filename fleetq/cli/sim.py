"""``fleetq sim``: the member-cluster emulator (placeholder; owned by the emulator work)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Member-cluster emulator.", no_args_is_help=True)


@app.command()
def serve() -> None:
    """Serve emulated member clusters."""
    raise typer.Exit(2)
