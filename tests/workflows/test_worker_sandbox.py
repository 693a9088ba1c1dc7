"""The worker's workflow sandbox: what it takes from the host instead of executing again for
every workflow run, and that recorded histories replay on exactly the runner and data
converter the worker uses (a cheaper job must not be a different one)."""

from __future__ import annotations

import ast
import collections
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
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox._runner import _fake_info
from temporalio.worker.workflow_sandbox._runner import _Instance as SdkInstance
from temporalio.workflow import _Definition

import worker
from fleetq.client.connection import DATA_CONVERTER
from fleetq.runtime import sandbox
from workflows import ALL_WORKFLOWS
from workflows.pytorch_job import PyTorchJobWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


@pytest.mark.parametrize("runner", ["worker", "strict"])
@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem.split("@")[0] for p in HISTORIES])
async def test_history_replays_on_the_workers_runner_and_converter(path: Path, runner: str) -> None:
    """Every recorded history replays on the worker's runner, and on the SDK's strict
    sandbox: default restrictions, the workflow modules executed again inside it, so a
    call the sandbox forbids (the clock, randomness, I/O) in a recorded path fails here
    although the worker passes the ``workflows`` package through."""
    workflow_id = path.stem.split("@", 1)[1].replace("~", "/")
    history = WorkflowHistory.from_json(workflow_id, path.read_text())
    replayer = Replayer(
        workflows=ALL_WORKFLOWS,
        data_converter=DATA_CONVERTER,
        workflow_runner=(
            worker.workflow_runner() if runner == "worker" else SandboxedWorkflowRunner()
        ),
    )
    await replayer.replay_workflow(history)  # raises on any nondeterminism


def test_the_workers_sandbox_passes_every_workflow_module_through() -> None:
    """The job workflow's module and the parts it is built on are taken from the worker,
    not executed again per run (creating a job's sandbox: 6.7 ms of CPU against 0.2)."""
    runner = worker.workflow_runner()
    for name in ("workflows.pytorch_job", "workflows.job_watching", "workflows.job_effects",
                 "workflows.quota_tree", "workflows.job_purge", "workflows.fleet_registry"):
        assert any(name == p or name.startswith(p + ".")
                   for p in runner.restrictions.passthrough_modules), name


#: module-level names of the ``workflows`` package that may hold a mutable object:
#: the package's lazy-import table, and the metrics registry the host keeps on purpose
MUTABLE_ALLOWED = {
    ("workflows", "_MODULES"), ("workflows.metrics", "_TREES"), ("workflows.metrics", "BUCKETS")
}


def test_workflow_modules_keep_no_state_of_their_own() -> None:
    """Passed through, a workflow module is shared by every run in the worker: a mutable
    module-level object would carry one run's state into another (the sandbox used to
    give each run a fresh copy)."""
    import workflows

    for wf in ALL_WORKFLOWS:
        importlib.import_module(wf.__module__)
    modules = [m for n, m in sys.modules.items() if n == "workflows" or n.startswith("workflows.")]
    assert len(modules) > 5 and workflows in modules
    for module in modules:
        for attr, value in vars(module).items():
            if attr.startswith("__"):  # the module's own attributes, __all__
                continue
            if isinstance(value, (dict, list, set, bytearray, collections.deque)):
                assert (module.__name__, attr) in MUTABLE_ALLOWED, (
                    f"{module.__name__}.{attr} is a mutable module-level object"
                )


#: calls whose answer differs between a run and its replay; the SDK's sandbox refuses
#: them in workflow code (temporalio.worker.workflow_sandbox.SandboxRestrictions.default)
NONDETERMINISTIC = {"now", "utcnow", "today", "time", "monotonic", "perf_counter",
                    "random", "randint", "uuid1", "uuid4", "urandom", "getenv", "sleep"}
FORBIDDEN_IMPORTS = {"random", "uuid", "time", "os", "socket", "subprocess", "requests",
                     "kubernetes", "urllib3", "secrets"}


def test_workflow_code_makes_no_nondeterministic_call() -> None:
    """A static guard beside the strict replay above, for paths no recorded history takes:
    no workflow module imports the clock, randomness or I/O, or calls ``now()``-like
    functions (workflow.now() and workflow.random() are the deterministic ones)."""
    found = []
    for path in sorted(Path(worker.__file__).parent.joinpath("workflows").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    node.module or ""]
                found += [f"{path.name}: import {n}" for n in names
                          if n.split(".")[0] in FORBIDDEN_IMPORTS]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if (node.func.attr in NONDETERMINISTIC
                        and not (isinstance(owner, ast.Name) and owner.id == "workflow")
                        and not (isinstance(owner, ast.Attribute) and owner.attr == "workflow")):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node.func)}()")
    assert found == []


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


def test_every_model_is_complete_once_its_module_is_imported() -> None:
    """A pydantic model naming a model defined after it is completed at import
    (``model_rebuild`` at its module's end): completed lazily on first use, inside a
    workflow passed through the sandbox, it failed with "`JobProgress` is not fully
    defined" and the job's workflow task failed on every attempt."""
    import pkgutil

    import pydantic

    import fleetq

    for info in pkgutil.walk_packages(fleetq.__path__, "fleetq."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    incomplete = [
        f"{name}.{value.__name__}"
        for name, module in list(sys.modules.items())
        if name.startswith(("fleetq.", "workflows.", "activities."))
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, pydantic.BaseModel)
        and value.__module__ == name and not value.__pydantic_complete__
    ]
    assert incomplete == []
