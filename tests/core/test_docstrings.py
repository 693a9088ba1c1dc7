"""Every module says what it is and why in at most 12 lines (issue 25 item 7).

Measurements live in BENCHMARKS.md and design history in docs/decisions/, so a module
docstring that grows past a screenful is a sign that one of them leaked back in.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 12


def _modules() -> list[Path]:
    files = [ROOT / "worker.py"]
    for package in ("fleetq", "workflows", "activities"):
        files.extend(sorted((ROOT / package).rglob("*.py")))
    return files


def test_every_module_docstring_is_at_most_twelve_lines() -> None:
    too_long = []
    for path in _modules():
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if docstring is not None and len(docstring.splitlines()) > MAX_LINES:
            lines = len(docstring.splitlines())
            too_long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not too_long, "module docstrings over 12 lines:\n" + "\n".join(too_long)


def test_the_modules_are_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in _modules()}
    assert {"worker.py", "fleetq/admission.py", "workflows/pytorch_job.py"} <= names
