"""``fleetq setup``: prepare a real Temporal namespace for fleetq — register the custom
search attributes (so the Web UI can filter ``FleetqState="Queued"``) and start the fleet
registry workflow. Idempotent; ``fleetq up`` does the same for the embedded server.
"""

from __future__ import annotations

import typer

from fleetq.cli.context import get_client, guarded, run
from fleetq.client.connection import ensure_search_attributes
from fleetq.client.registry import registry


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def setup() -> None:
        """Register fleetq's search attributes and start the registry workflow."""

        async def body() -> tuple[str, str, list[str]]:
            client = await get_client()
            added = await ensure_search_attributes(client)
            await registry(client)
            return client.service_client.config.target_host, client.namespace, added

        target, namespace, added = run(body)
        if added:
            typer.echo(f"search attributes registered in namespace {namespace}: "
                       f"{', '.join(added)}")
        else:
            typer.echo(f"search attributes already registered in namespace {namespace}")
        typer.echo(f"registry workflow fleetq/registry running on {target}")
