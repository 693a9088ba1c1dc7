"""``fleetq setup``: prepare a real Temporal namespace for fleetq — register the custom
search attributes (so the Web UI can filter ``FleetqState="Queued"``) and start the fleet
registry workflow; with ``--set-current BUILD``, make that build the current version of
the Worker Deployment (what a first ``fleetq worker --versioning`` does by itself when
the deployment has none; docs/deploy.md). Idempotent; ``fleetq up`` does the same for
the embedded server.
"""

from __future__ import annotations

import typer

from fleetq.cli.context import get_client, guarded, run
from fleetq.client.errors import InvalidInput


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def setup(
        set_current: str | None = typer.Option(
            None, "--set-current", metavar="BUILD",
            help="make BUILD the current version of the Worker Deployment (its workers "
                 "must poll already)"),
        deployment_name: str | None = typer.Option(
            None, "--deployment-name",
            help="Worker Deployment name (default: FLEETQ_DEPLOYMENT_NAME, else fleetq)"),
    ) -> None:
        """Register fleetq's search attributes, start the registry workflow and, with
        --set-current, route new workflows to a build."""
        from fleetq.client.connection import (
            deployment_name_from_env,
            describe_deployment,
            ensure_search_attributes,
            set_current_version,
        )
        from fleetq.client.registry import registry


        async def body() -> tuple[str, str, list[str], str | None]:
            client = await get_client()
            added = await ensure_search_attributes(client)
            current = None
            if set_current is not None:
                name = deployment_name or deployment_name_from_env()
                desc = await describe_deployment(client, name)
                known = [] if desc is None else [
                    v.deployment_version.build_id
                    for v in desc.worker_deployment_info.version_summaries]
                if set_current not in known:
                    raise InvalidInput(
                        f"error: Worker Deployment {name} has no version {set_current} "
                        f"(known: {', '.join(known) or 'none'}): start its workers with "
                        f"fleetq worker --versioning --build-id {set_current} first")
                current = await set_current_version(client, name, set_current)
                current = f"{name}.{current}"
            await registry(client)
            return client.service_client.config.target_host, client.namespace, added, current

        target, namespace, added, current = run(body)
        if added:
            typer.echo(f"search attributes registered in namespace {namespace}: "
                       f"{', '.join(added)}")
        else:
            typer.echo(f"search attributes already registered in namespace {namespace}")
        if current is not None:
            typer.echo(f"current version: {current}")
        typer.echo(f"registry workflow fleetq/registry running on {target}")
