"""Temporal's workflow sandbox minus a compile per call (``FleetqSandboxRunner``).

Built on names the Python SDK keeps private (``temporalio.worker.workflow_sandbox.
_runner._Instance``, ``temporalio.worker._command_aware_visitor.CommandInfo``,
``temporalio.converter._extstore``; SDK 1.35): importing this module raises ImportError
when an SDK lacks them, and ``worker.workflow_runner`` then uses the SDK's own runner,
so another SDK version is only slower, never broken.
"""

from __future__ import annotations

import dataclasses
import functools
from types import CodeType
from typing import Any

from temporalio.converter import SerializationContext
from temporalio.converter._extstore import StorageDriverStoreContext
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox._runner import _Instance as _SandboxInstance

#: the SDK's name for the workflow's object inside a sandbox instance's globals
_IN_SANDBOX = "__temporal_in_sandbox"


@functools.lru_cache(maxsize=64)
def _sandbox_code(source: str) -> CodeType:
    # the file name exec() gives a string, so tracebacks read as before
    return compile(source, "<string>", "exec")


class _CompiledSandboxInstance(_SandboxInstance):
    """The SDK's sandboxed workflow instance, minus two costs per call: its fixed snippets
    run from code objects compiled once instead of source strings compiled on every
    call, and the serialization-context lookups (SDK bookkeeping that reads the pending
    command's activity or target workflow) call the instance directly instead of going
    through a snippet. Each override falls back to the SDK's own code when the names it
    relies on are not there, so another SDK version is only slower, never different."""

    def _run_code(self, code: str, **extra_globals: Any) -> None:
        super()._run_code(_sandbox_code(code), **extra_globals)  # type: ignore[arg-type]

    def get_serialization_context(
        self, command_info: CommandInfo | None
    ) -> SerializationContext | None:
        inside: Any = self.globals_and_locals.get(_IN_SANDBOX)
        if inside is None:
            return super().get_serialization_context(command_info)
        context: SerializationContext | None = inside.get_serialization_context(command_info)
        return context

    def get_external_store_context(
        self, command_info: CommandInfo | None
    ) -> StorageDriverStoreContext:
        inside: Any = self.globals_and_locals.get(_IN_SANDBOX)
        if inside is None:
            return super().get_external_store_context(command_info)
        context: StorageDriverStoreContext = inside.get_external_store_context(command_info)
        return context


@dataclasses.dataclass(frozen=True)
class FleetqSandboxRunner(SandboxedWorkflowRunner):
    """Temporal's workflow sandbox, with the same restrictions and the same code run in
    it, minus a compile per call.

    The SDK (1.35) runs a short snippet through ``exec(<str>)`` inside the sandbox for
    every activation and, when it encodes or decodes a workflow's payloads, for every
    payload sequence (``get_serialization_context``, ``get_external_store_context``), so
    each call compiled the snippet again (~10 % of the worker's busy CPU in ``fleetq
    bench e2e``, py-spy, BENCHMARKS.md) and patched the sandbox's builtins in and out
    around a dictionary lookup (another ~14 %). ``exec`` accepts a code object, so the
    snippets are compiled once and run on the same globals under the same importer;
    the context lookups, which run no workflow code, call the SDK's instance directly.
    Workflow code (its module, its activations, its queries) still runs in the sandbox
    exactly as before."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledSandboxInstance(det, self.runner_class, self.restrictions)
