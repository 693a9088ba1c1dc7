"""``fleetq webui``: the Temporal Web UI as a browser shows it.

``fleetq webui build`` makes sure a headless Chromium is there (Debian's ``chromium``,
installed with apt-get when missing and run as root; a present one returns at once): the
Web UI tests (tests/webui) need it, and ``.ci/run`` runs this step. ``fleetq webui show
pytorchjob NAME`` loads the job's workflow page in that browser and prints what its
"User Metadata" tab renders (summary, details, current details), tables as tab-separated
rows -- what a user sees, not the Markdown fleetq sent.
"""

from __future__ import annotations

from typing import Annotated

import typer

from fleetq.cli.output import fail

app = typer.Typer(help="The Temporal Web UI as a browser renders it (headless Chromium).",
                  no_args_is_help=True, rich_markup_mode=None)


@app.command("build")
def build_cmd() -> None:
    """Install (or find) headless Chromium; prints its path and version."""
    from fleetq.runtime.browser import BrowserError, build, chromium_version

    try:
        binary = build(progress=lambda msg: typer.echo(msg, err=True))
    except BrowserError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"{binary} ({chromium_version(binary)})")


@app.command("show")
def show_cmd(
    resource: Annotated[str, typer.Argument(help="pytorchjob")],
    name: Annotated[str, typer.Argument(help="Job name")],
    namespace: Annotated[str, typer.Option("-n", "--namespace", help="Namespace")] = "default",
    ui: Annotated[str | None, typer.Option(
        "--ui", help="Web UI address (default: the running fleetq up's)")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the page")] = 60.0,
) -> None:
    """Print what the Web UI renders for a job's summary and details."""
    import asyncio

    from fleetq.cli.get import resource_kind
    from fleetq.naming import job_workflow_id
    from fleetq.runtime.browser import BrowserError, Chromium, user_metadata
    from fleetq.runtime.fleet_info import default_state_dir, read_info

    if resource_kind(resource) != "pytorchjob":
        raise fail("fleetq webui show supports pytorchjob only")
    url = ui
    if url is None:
        info = read_info(default_state_dir())
        if info is None or not info.ui_url:
            raise fail("no running fleetq up here: give the Web UI with --ui URL")
        url = info.ui_url

    async def body() -> list[str]:
        async with Chromium() as browser, browser.page() as page:
            frames = await user_metadata(
                page, url, job_workflow_id(namespace, name), timeout=timeout,
                ready=lambda fs: all(f["text"].strip() for f in fs))
        out: list[str] = []
        for frame in frames:
            out.append(f"{frame['title'] or 'Details'}:")
            out.extend(f"  {line}" for line in frame["text"].strip().splitlines()
                       if line.strip())
        return out

    try:
        lines = asyncio.run(body())
    except BrowserError as exc:
        raise fail(str(exc)) from None
    for line in lines:
        typer.echo(line)
