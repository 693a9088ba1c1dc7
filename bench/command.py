"""How a benchmark's command line runs: each ``bench/<name>.py`` declares its options as
a typer command (the CLI's library) and its ``main(argv) -> int`` runs it with
:func:`run_command`, so ``fleetq bench NAME --help`` and ``python -m bench.NAME`` parse
the same way and a usage error is exit code 2, as the CLI's are."""

from __future__ import annotations

from collections.abc import Sequence

import typer

from fleetq.cli.context import help_settings


def bench_app() -> typer.Typer:
    """A one-command typer app for a benchmark, with the CLI's help layout."""
    return typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                       rich_markup_mode=None, context_settings=help_settings())


def help_text(doc: str | None) -> str:
    """A module docstring as command help: each paragraph on one line (the terminal
    wraps it), paragraphs apart."""
    paragraphs = (doc or "").strip().split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def run_command(app: typer.Typer, argv: Sequence[str] | None, prog_name: str) -> int:
    """Run ``app`` on ``argv`` (default: the process's arguments) and return its exit
    code: the command's own (it ends with ``typer.Exit(code)``), 0 after ``--help``, 2
    for a usage error."""
    try:
        app(args=None if argv is None else list(argv), prog_name=prog_name)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code)
        return 1
    return 0
