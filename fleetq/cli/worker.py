"""``fleetq worker``: the same process as ``python worker.py`` (every workflow and
activity on the ``fleetq`` task queue), for installs that only have the console script.
Options are passed through unchanged (``--address``, ``--namespace``, ``--task-queue``,
``--fleet-config``, ``--prometheus-port``/``--prometheus-host``, ``--health-port``/
``--health-host`` for /readyz and /livez, ``--versioning``/``--deployment-name``/
``--build-id`` for Worker Versioning); Temporal's env config, ``FLEETQ_CONFIG``,
``FLEETQ_WORKER_VERSIONING``, ``FLEETQ_DEPLOYMENT_NAME`` and ``FLEETQ_BUILD_ID`` apply as
usual. docs/deploy.md has the deployment and the rollout runbook.
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command(
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                          "help_option_names": []},
        add_help_option=False,
    )
    def worker(ctx: typer.Context) -> None:
        """Run a fleetq worker (python worker.py); --help lists its options."""
        import worker as worker_module

        raise typer.Exit(worker_module.main(list(ctx.args), prog_name=ctx.command_path))
