"""``fleetq suspend`` / ``fleetq resume``: Kubeflow's ``runPolicy.suspend`` for a job the
fleet already runs. A suspended job has no copy on any member and holds no quota; a
resumed one queues again with its original submit time. The same as
``temporal workflow signal --name suspend|resume`` on its workflow.
"""

from __future__ import annotations

import typer

from fleetq.cli.context import CliError, get_client, guarded, run
from fleetq.cli.get import resource_kind

PAST = {"suspend": "suspended", "resume": "resumed"}


def register(app: typer.Typer) -> None:
    for verb, help_text in (
        ("suspend", "Suspend a job: purge its member copies, release its quota."),
        ("resume", "Resume a suspended job: it queues again with its submit time."),
    ):
        def command(
            resource: str = typer.Argument(..., help="pytorchjob"),
            name: str = typer.Argument(..., help="Job name"),
            namespace: str = typer.Option("default", "-n", "--namespace"),
            _verb: str = typer.Option(verb, hidden=True),
        ) -> None:
            from fleetq.client.jobs import JOB_RESOURCE, JobSignal, signal_job

            if resource_kind(resource) != "pytorchjob":
                raise CliError(f"error: only a pytorchjob can be {PAST[_verb]}")
            signal: JobSignal = "suspend" if _verb == "suspend" else "resume"

            async def body() -> None:
                await signal_job(await get_client(), namespace, name, signal)

            run(body)
            typer.echo(f"{JOB_RESOURCE}/{name} {PAST[_verb]}")

        app.command(name=verb, help=help_text)(guarded(command))
