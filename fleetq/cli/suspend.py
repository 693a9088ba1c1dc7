"""``fleetq suspend`` / ``fleetq resume``: Kubeflow's ``runPolicy.suspend`` for a job the
fleet already runs. A suspended job has no copy on any member and holds no quota; a
resumed one queues again with its original submit time. The same as
``temporal workflow signal --name suspend|resume`` on its workflow.
"""

from __future__ import annotations

import typer
from temporalio.client import WorkflowExecutionStatus

from fleetq.cli.context import CliError, get_client, guarded, run
from fleetq.cli.get import JOB_RESOURCE, existing_job, resource_kind

PAST = {"suspend": "suspended", "resume": "resumed"}


async def signal_job(namespace: str, name: str, signal: str) -> str:
    client = await get_client()
    handle, status = await existing_job(client, namespace, name)
    if status != WorkflowExecutionStatus.RUNNING:
        raise CliError(f"error: PyTorchJob {namespace}/{name} has finished; nothing to {signal}")
    await handle.signal(signal)
    return f"{JOB_RESOURCE}/{name} {PAST[signal]}"


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
            if resource_kind(resource) != "pytorchjob":
                raise CliError(f"error: only a pytorchjob can be {PAST[_verb]}")

            async def body() -> str:
                return await signal_job(namespace, name, _verb)

            typer.echo(run(body))

        app.command(name=verb, help=help_text)(guarded(command))
