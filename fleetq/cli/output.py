"""Printing like kubectl: aligned tables, human ages, ``-o yaml|json``.

On a terminal tables are drawn with rich (bold headers); otherwise they are plain
columns separated by three spaces, exactly like kubectl's tabwriter output, so scripts
and tests can split them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import typer

from fleetq.cli.context import CliError, is_tty
from fleetq.kube_values import human_duration, parse_rfc3339

OUTPUT_FORMATS = ("wide", "yaml", "json")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: <message>`` on stderr; returns the Exit (status ``code``) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def say(message: str) -> None:
    """Progress, on stderr (stdout stays for what the command answers)."""
    typer.echo(message, err=True)


def check_output(fmt: str | None) -> str | None:
    if fmt is None or fmt == "":
        return None
    if fmt not in OUTPUT_FORMATS:
        raise CliError(
            f'error: unable to match a printer suitable for the output format "{fmt}", '
            f"allowed formats are: {','.join(OUTPUT_FORMATS)}"
        )
    return fmt


def parse_time(value: Any) -> datetime | None:
    """A datetime or RFC 3339 text as an aware datetime (``fleetq.kube_values``)."""
    return parse_rfc3339(value)


def age(since: Any, now: datetime | None = None) -> str:
    """Age of a timestamp (datetime or RFC 3339 text); ``<unknown>`` when absent."""
    t = parse_time(since)
    if t is None:
        return "<unknown>"
    return human_duration(((now or datetime.now(UTC)) - t).total_seconds())


def namespaced(headers: list[str], rows: list[tuple[str, list[Any]]], all_namespaces: bool
               ) -> tuple[list[str], list[list[Any]]]:
    """A table of ``(namespace, row)`` s; with ``all_namespaces`` (kubectl's ``-A``) the
    namespace is its first column, NAMESPACE."""
    if all_namespaces:
        return ["NAMESPACE", *headers], [[ns, *row] for ns, row in rows]
    return headers, [row for _ns, row in rows]


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(headers)] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.ljust(w) for c, w in zip(r, widths, strict=True)]
        lines.append("   ".join(parts).rstrip())
    return lines


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    if is_tty():
        from rich.console import Console
        from rich.table import Table, box

        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      header_style="bold")
        for h in headers:
            table.add_column(h, no_wrap=h in ("NAME", "AGE", "CLUSTER"))
        for r in rows:
            table.add_row(*(str(c) for c in r))
        Console().print(table)
        return
    for line in plain_table(headers, rows):
        typer.echo(line)


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2, default=str)
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def print_object(obj: Any, fmt: str) -> None:
    text = dump(obj, fmt)
    typer.echo(text.rstrip("\n"))


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """kubectl's ``kind: List`` wrapper for several objects."""
    return {"apiVersion": "v1", "kind": "List", "items": items,
            "metadata": {"resourceVersion": ""}}
