"""The worker's workflow sandbox: what it takes from the host instead of executing again for
every workflow run, and that recorded histories replay on exactly the runner and data
converter the worker uses (a cheaper job must not be a different one)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import CommandType
from temporalio.api.failure.v1 import Failure
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import Replayer, WorkflowInstanceDetails
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox._runner import _fake_info
from temporalio.worker.workflow_sandbox._runner import _Instance as SdkInstance
from temporalio.workflow import _Definition

import worker
from fleetq.client.connection import DATA_CONVERTER
from fleetq.runtime import sandbox
from workflows import ALL_WORKFLOWS
from workflows.pytorch_job import PyTorchJobWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem.split("@")[0] for p in HISTORIES])
async def test_history_replays_on_the_workers_runner_and_converter(path: Path) -> None:
    workflow_id = path.stem.split("@", 1)[1].replace("~", "/")
    history = WorkflowHistory.from_json(workflow_id, path.read_text())
    replayer = Replayer(
        workflows=ALL_WORKFLOWS,
        data_converter=DATA_CONVERTER,
        workflow_runner=worker.workflow_runner(),
    )
    await replayer.replay_workflow(history)  # raises on any nondeterminism


def test_passed_through_modules_exist_and_are_workflow_helpers() -> None:
    """Every module the runner passes through is importable and part of ``workflows``
    (a typo would silently fall back to re-executing it per run)."""
    for name in worker.SANDBOX_PASSTHROUGH:
        module = importlib.import_module(name)
        assert module.__name__.startswith("workflows.")
        assert not any(
            getattr(obj, "__temporal_workflow_definition", None) is not None
            for obj in vars(module).values()
        ), f"{name} defines a workflow: its module must be re-executed per run"


def test_bytecode_cache_covers_the_modules_a_workflow_module_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With bytecode writing off (PYTHONDONTWRITEBYTECODE), the sandbox compiled a
    workflow module's sibling from source on every run; the worker now writes the cache
    of every loaded module of the workflow's package."""
    pkg = tmp_path / "bytecodepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("def help() -> int:\n    return 1\n")
    (pkg / "flow.py").write_text(
        "from bytecodepkg.helper import help\n\nclass Flow:\n    value = help()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    try:
        flow = importlib.import_module("bytecodepkg.flow")
        helper_cache = importlib.util.cache_from_source(str(pkg / "helper.py"))
        assert not Path(helper_cache).exists()

        written = worker.warm_workflow_bytecode([flow.Flow])

        assert helper_cache in written
        assert worker._bytecode_fresh(str(pkg / "helper.py"), helper_cache)
        assert worker.warm_workflow_bytecode([flow.Flow]) == []  # fresh: nothing rewritten
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "bytecodepkg"]:
            del sys.modules[name]


def test_the_workers_runner_compiles_each_sandbox_snippet_once() -> None:
    """The runner's instances run the SDK's fixed snippets from cached code objects (the
    SDK compiled its source string on every activation and every payload sequence)."""
    runner = worker.workflow_runner()
    assert isinstance(runner, sandbox.FleetqSandboxRunner)
    sandbox._sandbox_code.cache_clear()
    first = sandbox._sandbox_code("x = 1\n")
    assert sandbox._sandbox_code("x = 1\n") is first
    assert sandbox._sandbox_code.cache_info().misses == 1


async def test_the_workers_runner_answers_context_lookups_as_the_sdk_does() -> None:
    """The serialization-context lookups skip the sandbox snippet, and answer exactly
    what the SDK's own path through the sandbox answers."""
    runner = worker.workflow_runner()
    instance = runner.create_instance(
        WorkflowInstanceDetails(
            payload_converter_factory=DataConverter.default._new_payload_converter,
            failure_converter_class=DataConverter.default.failure_converter_class,
            interceptor_classes=[],
            defn=_Definition.must_from_class(PyTorchJobWorkflow),
            info=_fake_info,
            randomness_seed=-1,
            extern_functions={},
            disable_eager_activity_execution=False,
            worker_level_failure_exception_types=[],
            patch_activation_callback=None,
            last_completion_result=Payloads(),
            last_failure=Failure(),
        )
    )
    assert isinstance(instance, SdkInstance)
    for info in (
        None,
        CommandInfo(command_type=CommandType.COMMAND_TYPE_SCHEDULE_ACTIVITY_TASK, command_seq=1),
    ):
        ours = instance.get_serialization_context(info)
        assert ours is not None
        assert ours == SdkInstance.get_serialization_context(instance, info)
        assert instance.get_external_store_context(info) == (
            SdkInstance.get_external_store_context(instance, info)
        )
