"""The ``fleetq`` command line (also installed as ``kubectl-fleetq``).

Each sub-command lives in its own module; this one only assembles them.
"""

from __future__ import annotations

import typer

from fleetq.cli import sim, validate

app = typer.Typer(
    name="fleetq",
    help="Multi-cluster gang scheduler for PyTorchJobs, on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
validate.register(app)
app.add_typer(sim.app, name="sim")


def main() -> None:
    app()
