"""Every signal, query and update reference in ``fleetq.handler_refs`` is the handler its
workflow class registers, with the same argument and result types, and every handler has
exactly one reference: a caller that signals ``admitted`` with a ``Grant`` reaches a
handler that takes a ``Grant``."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow

from fleetq import handler_refs as h
from workflows.fleet_registry import FleetRegistryWorkflow
from workflows.pytorch_job import PyTorchJobWorkflow
from workflows.quota_tree import QuotaTreeWorkflow

CLIENT = Path(__file__).resolve().parents[2] / "fleetq" / "client"
REFS: dict[type, type] = {
    PyTorchJobWorkflow: h.JobHandlers,
    QuotaTreeWorkflow: h.QuotaTreeHandlers,
    FleetRegistryWorkflow: h.RegistryHandlers,
}


def refs_of(group: type) -> list[Any]:
    return [
        v for v in vars(group).values()
        if isinstance(v, h.SignalRef | h.QueryRef | h.UpdateRef)
    ]


def handler_types(fn: Any) -> tuple[Any, Any]:
    """(argument type or None, result type) of a handler method."""
    hints = typing.get_type_hints(fn)
    result = hints.pop("return", None)
    args = list(hints.values())
    assert len(args) <= 1, f"{fn.__qualname__} takes more than one argument"
    return (args[0] if args else None), (type(None) if result is None else result)


@pytest.mark.parametrize("cls", list(REFS), ids=lambda c: c.__name__)
def test_every_handler_has_one_reference_with_its_types(cls: type) -> None:
    defn = workflow._Definition.must_from_class(cls)
    refs = refs_of(REFS[cls])
    signals = {r.name: r for r in refs if isinstance(r, h.SignalRef)}
    queries = {r.name: r for r in refs if isinstance(r, h.QueryRef)}
    updates = {r.name: r for r in refs if isinstance(r, h.UpdateRef)}
    assert len(signals) + len(queries) + len(updates) == len(refs), "a name is used twice"
    assert set(signals) == set(defn.signals)
    assert set(queries) == set(defn.queries)
    assert set(updates) == set(defn.updates)
    for name, sig in signals.items():
        arg, result = handler_types(defn.signals[name].fn)
        assert sig.arg == arg, name
        assert result is type(None), f"signal {name} returns a value"
    for name, query in queries.items():
        assert (query.arg, query.result) == handler_types(defn.queries[name].fn), name
    for name, update in updates.items():
        assert (update.arg, update.result) == handler_types(defn.updates[name].fn), name



def test_names_the_light_client_paths_spell_out_are_handlers() -> None:
    """``fleetq get`` and a job's ``apply`` must not load the contracts (they import
    numpy), so a few client calls spell the handler name out; each must be a handler."""
    names = {r.name for group in REFS.values() for r in refs_of(group)}
    call = re.compile(r"""\.(?:query|signal|execute_update)\(\s*["']([a-z_]+)["']""")
    used = {
        (path.name, name)
        for path in CLIENT.glob("*.py")
        for name in call.findall(path.read_text())
    }
    query_running = re.compile(r"""_query_running\([^)]*?["']([a-z_]+)["']""", re.S)
    used |= {("registry.py", n) for n in query_running.findall(
        (CLIENT / "registry.py").read_text())}
    assert used, "no spelled-out handler names found: the pattern is stale"
    assert {(f, n) for f, n in used if n not in names} == set()
