"""``fleetq apply -f``: put manifests into the fleet, like ``kubectl apply``.

Everything is validated first (the same loader as ``fleetq validate``); any problem
prints its lines and nothing is applied. Then quota trees, PriorityClasses and policies
go into the fleet registry workflow (and the tree into its quota workflow), and only then
jobs start, each as its own ``pytorchjob/<ns>/<name>`` workflow. Re-applying is
idempotent: registry objects report ``unchanged``/``configured``, and a job that already
runs is reported, never started twice.
"""

from __future__ import annotations

import io
import json
import sys
import weakref
from dataclasses import dataclass
from typing import Any, TextIO

import typer
import yaml
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError

from fleetq.cli.context import CliError, get_client, guarded, run
from fleetq.client.connection import has_search_attributes
from fleetq.manifests import STDIN, STDIN_NAME, load_manifests
from fleetq.models import (
    ElasticQuotaTree,
    FleetObject,
    PriorityClass,
    PropagationPolicy,
    PyTorchJob,
    gang_of,
)
from fleetq.naming import (
    CONTROL_TASK_QUEUE,
    REGISTRY_WORKFLOW_ID,
    SA_JOB,
    SA_NAMESPACE,
    SA_PRIORITY,
    SA_STATE,
    TASK_QUEUE,
    job_workflow_id,
    quota_workflow_id,
)
from fleetq.resources import format_resources
from workflows.fleet_registry import RegistryState
from workflows.quota_tree import QuotaTreeInput

#: Temporal refuses payloads over 2 MB; leave room for the rest of the workflow input.
MAX_APPLY_BYTES = 1_500_000

RESOURCE_NAMES = {
    "ElasticQuotaTree": "elasticquotatree.scheduling.sigs.k8s.io",
    "PropagationPolicy": "propagationpolicy.policy.one.alibabacloud.com",
    "PriorityClass": "priorityclass.scheduling.k8s.io",
    "PyTorchJob": "pytorchjob.kubeflow.org",
}
#: Apply order: what jobs depend on comes first.
KIND_ORDER = {"ElasticQuotaTree": 0, "PriorityClass": 1, "PropagationPolicy": 2, "PyTorchJob": 3}


def object_line(kind: str, name: str, verb: str) -> str:
    return f"{RESOURCE_NAMES.get(kind, kind.lower())}/{name} {verb}"


def manifest_of(obj: FleetObject, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest as the user wrote it (aliases and all), JSON-compatible."""
    if raw is not None:
        return raw
    return obj.model_dump(mode="json", by_alias=True, exclude_none=True)


def job_summary(job: PyTorchJob, priority_classes: dict[str, int] | None = None) -> str:
    """The workflow's static summary in the Web UI, e.g. ``PyTorchJob default/pytorch-test:
    1 master + 2 workers, cpu 4.01, memory 4Gi``."""
    return gang_of(job, priority_classes).summary_line(job.metadata.namespace, job.metadata.name)


def update_error(exc: WorkflowUpdateFailedError) -> str:
    cause = exc.cause
    message = getattr(cause, "message", None) or str(cause or exc)
    return message.splitlines()[0] if message else str(exc)


def job_details(job: PyTorchJob, priority_classes: dict[str, int] | None = None) -> str:
    """The workflow's static details in the Web UI: the gang, in Markdown."""
    gang = gang_of(job, priority_classes)
    lines = ["| role | replicas | requests per pod |", "|---|---|---|"]
    requests: dict[str, str] = {}
    for pod in gang.pods:
        requests.setdefault(pod.role, format_resources(pod.requests) or "-")
    lines += [f"| {role} | {count} | {requests.get(role, '-')} |"
              for role, count in gang.declared_role_counts().items()]
    lines += ["", f"{gang.minimum_line().capitalize()}: placed on one member cluster or not at "
                  f"all; priority {gang.priority}."]
    return "\n".join(lines)


async def registry(client: Client) -> WorkflowHandle[Any, Any]:
    """The fleet registry workflow, started if absent."""
    return await client.start_workflow(
        "FleetRegistryWorkflow",
        RegistryState(),
        id=REGISTRY_WORKFLOW_ID,
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary="fleetq registry: PropagationPolicies, PriorityClasses, quota tree",
    )


@dataclass
class Applied:
    line: str
    ok: bool = True


async def apply_registry_object(client: Client, manifest: dict[str, Any]) -> str:
    handle = await registry(client)
    result: str = await handle.execute_update("apply", manifest, result_type=str)
    return result


async def apply_tree(client: Client, tree: ElasticQuotaTree, manifest: dict[str, Any]) -> str:
    verb = await apply_registry_object(client, manifest)
    handle = await client.start_workflow(
        "QuotaTreeWorkflow",
        QuotaTreeInput(tree=manifest),
        id=quota_workflow_id(tree.metadata.namespace, tree.metadata.name),
        task_queue=CONTROL_TASK_QUEUE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"ElasticQuotaTree {tree.metadata.namespace}/{tree.metadata.name}: "
                       "quota and queues",
    )
    quota_verb: str = await handle.execute_update("apply_tree", manifest, result_type=str)
    return "created" if verb == "created" else quota_verb


async def start_job(
    client: Client,
    job: PyTorchJob,
    manifest: dict[str, Any],
    *,
    run_seconds: int | None = None,
    priority_classes: dict[str, int] | None = None,
) -> str:
    """Start the job's workflow; ``created``, or ``unchanged (already exists)`` when a run
    of it is still going."""
    arg: dict[str, Any] = {"manifest": manifest}
    if run_seconds is not None:
        arg["run_seconds"] = run_seconds
    extra: dict[str, Any] = {}
    if await _has_search_attributes(client):
        extra["search_attributes"] = start_search_attributes(job, priority_classes)
    try:
        await client.start_workflow(
            "PyTorchJobWorkflow",
            arg,
            id=job_workflow_id(job.metadata.namespace, job.metadata.name),
            task_queue=TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            static_summary=job_summary(job, priority_classes),
            static_details=job_details(job, priority_classes),
            **extra,
        )
    except WorkflowAlreadyStartedError:
        return "unchanged (already exists)"
    return "created"


_SA_SUPPORT: weakref.WeakKeyDictionary[Client, bool] = weakref.WeakKeyDictionary()


async def _has_search_attributes(client: Client) -> bool:
    """Whether fleetq's search attributes are registered (asked once per client)."""
    if client not in _SA_SUPPORT:
        _SA_SUPPORT[client] = await has_search_attributes(client)
    return _SA_SUPPORT[client]


def start_search_attributes(
    job: PyTorchJob, priority_classes: dict[str, int] | None = None
) -> TypedSearchAttributes:
    """The Web UI's filters as far as they are known at submission: the job, its
    namespace and priority, and state Queued (waiting to be admitted and placed). The
    workflow only upserts what changes after this, so a job that is admitted and starts
    running at once costs no upsert for the states it passes through."""
    ns, name = job.metadata.namespace, job.metadata.name
    return TypedSearchAttributes([
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_JOB), f"{ns}/{name}"),
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_NAMESPACE), ns),
        SearchAttributePair(SearchAttributeKey.for_keyword(SA_STATE), "Queued"),
        SearchAttributePair(SearchAttributeKey.for_int(SA_PRIORITY),
                            gang_of(job, priority_classes).priority),
    ])


async def apply_objects(
    client: Client,
    objects: list[tuple[FleetObject, dict[str, Any]]],
    *,
    run_seconds: int | None = None,
    priority_classes: dict[str, int] | None = None,
) -> list[Applied]:
    """Apply validated objects in dependency order; one result line per object."""
    out: list[Applied] = []
    ordered = sorted(objects, key=lambda o: KIND_ORDER.get(o[0].kind, 9))
    for obj, manifest in ordered:
        name = obj.metadata.name
        try:
            if isinstance(obj, ElasticQuotaTree):
                verb = await apply_tree(client, obj, manifest)
            elif isinstance(obj, (PropagationPolicy, PriorityClass)):
                verb = await apply_registry_object(client, manifest)
            elif isinstance(obj, PyTorchJob):
                verb = await start_job(client, obj, manifest, run_seconds=run_seconds,
                                       priority_classes=priority_classes)
            else:  # pragma: no cover - the loader only yields the kinds above
                out.append(Applied(f"error: {obj.kind} is not supported by apply", ok=False))
                continue
        except WorkflowUpdateFailedError as exc:
            out.append(Applied(f"Error from server (Invalid): {update_error(exc)}", ok=False))
            continue
        out.append(Applied(object_line(obj.kind, name, verb)))
    return out


def load_for_apply(
    files: list[str], stdin: TextIO | None = None
) -> tuple[list[tuple[FleetObject, dict[str, Any]]], dict[str, int], list[str]]:
    """Validate ``files``; returns ``(objects with their manifests as written,
    PriorityClasses in the input, notes)`` or raises :class:`CliError` carrying every
    problem line."""
    stdin_text: str | None = None
    if STDIN in files:
        stdin_text = (stdin or sys.stdin).read()
    result = load_manifests(files, stdin=io.StringIO(stdin_text or ""))
    if result.errors:
        raise CliError("\n".join(result.errors))
    raw = _RawDocs(stdin_text)
    objects: list[tuple[FleetObject, dict[str, Any]]] = []
    too_big: list[str] = []
    for source, obj in result.objects:
        manifest = raw.find(source.path, obj) or manifest_of(obj)
        size = len(json.dumps(manifest, separators=(",", ":")).encode())
        if size > MAX_APPLY_BYTES:
            too_big.append(
                f"{obj.kind} {obj.metadata.namespace}/{obj.metadata.name}: is "
                f"{size / 1e6:.1f} MB as JSON; fleetq accepts at most 1.5 MB per object "
                "(Temporal payloads are limited to 2 MB)"
            )
            continue
        objects.append((obj, manifest))
    if too_big:
        raise CliError("\n".join(too_big))
    return objects, result.priority_classes(), result.notes


class _NoDates(yaml.SafeLoader):
    """Safe YAML that leaves timestamps as text (as JSON and the validating loader do)."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


class _RawDocs:
    """The documents exactly as written, to send to Temporal and the member clusters
    (the validated models add defaults and normalise fields such as purgeMode). Only read
    after :func:`load_manifests` accepted the input, so it is known to be safe."""

    def __init__(self, stdin_text: str | None) -> None:
        self._stdin = stdin_text
        self._cache: dict[str, list[dict[str, Any]]] = {}

    def _docs(self, path: str) -> list[dict[str, Any]]:
        if path not in self._cache:
            if path == STDIN_NAME:
                text = self._stdin or ""
            else:
                with open(path, encoding="utf-8-sig") as fh:
                    text = fh.read()
            docs: list[Any]
            if text.lstrip().startswith(("{", "[")):
                try:
                    docs = [json.loads(text)]
                except ValueError:
                    docs = list(yaml.load_all(text, Loader=_NoDates))
            else:
                docs = list(yaml.load_all(text, Loader=_NoDates))
            flat: list[dict[str, Any]] = []
            for d in docs:
                if isinstance(d, dict) and d.get("kind") == "List" and isinstance(
                        d.get("items"), list):
                    flat.extend(i for i in d["items"] if isinstance(i, dict))
                elif isinstance(d, dict):
                    flat.append(d)
            self._cache[path] = flat
        return self._cache[path]

    def find(self, path: str, obj: FleetObject) -> dict[str, Any] | None:
        try:
            docs = self._docs(path)
        except (OSError, ValueError, yaml.YAMLError):
            return None
        ns = getattr(obj.metadata, "namespace", None)
        found = None
        for d in docs:
            meta = d.get("metadata") or {}
            if (d.get("kind") == obj.kind and meta.get("name") == obj.metadata.name
                    and (obj.kind == "PriorityClass"
                         or (meta.get("namespace") or "default") == ns)):
                found = d  # the last copy wins, as in the loader
        if found is None:
            return None
        doc = json.loads(json.dumps(found, default=str))
        if obj.kind != "PriorityClass":
            doc.setdefault("metadata", {}).setdefault("namespace", ns)
        return doc  # type: ignore[no-any-return]


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def apply(
        files: list[str] = typer.Option(
            ..., "-f", "--filename",
            help="Manifest file, directory (read recursively) or - for stdin. Repeatable."),
        run_seconds: int | None = typer.Option(
            None, "--run-seconds",
            help="Emulator hint: the job's pods finish after this many seconds."),
    ) -> None:
        """Apply ElasticQuotaTrees, PriorityClasses, PropagationPolicies and PyTorchJobs."""
        objects, classes, notes = load_for_apply(files)
        for note in notes:
            typer.echo(f"note: {note}", err=True)

        async def body() -> list[Applied]:
            client = await get_client()
            return await apply_objects(client, objects, run_seconds=run_seconds,
                                       priority_classes=classes)

        results = run(body)
        for r in results:
            typer.echo(r.line, err=not r.ok)
        if not all(r.ok for r in results):
            raise typer.Exit(1)
