"""``apply``: put validated manifests into the fleet, like ``kubectl apply``.

Quota trees, PriorityClasses and policies go into the fleet registry workflow (and the
tree into its quota workflow), and only then jobs start, each as its own workflow.
Re-applying is idempotent: registry objects report ``unchanged``/``configured``, and a
job that already runs is reported, never started twice. Manifests are loaded and checked
here first (the same loader as ``fleetq validate``), and what is sent is each document
exactly as written.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import yaml
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy

from fleetq.client.errors import ClientError, InvalidInput
from fleetq.client.jobs import delete_job, start_job
from fleetq.client.registry import delete_registry_object, registry
from fleetq.manifests import STDIN, STDIN_NAME, load_manifests, preemption_annotation_error
from fleetq.models import (
    CLUSTER_SCOPED,
    ElasticQuotaTree,
    FleetObject,
    PriorityClass,
    PropagationPolicy,
    PyTorchJob,
    object_ref,
)
from fleetq.naming import CONTROL_TASK_QUEUE, quota_workflow_id

#: Temporal refuses payloads over 2 MB; leave room for the rest of the workflow input.
MAX_APPLY_BYTES = 1_500_000

RESOURCE_NAMES = {
    "ElasticQuotaTree": "elasticquotatree.scheduling.sigs.k8s.io",
    "PropagationPolicy": "propagationpolicy.policy.one.alibabacloud.com",
    "ClusterPropagationPolicy": "clusterpropagationpolicy.policy.one.alibabacloud.com",
    "PriorityClass": "priorityclass.scheduling.k8s.io",
    "PyTorchJob": "pytorchjob.kubeflow.org",
}
#: Apply order: what jobs depend on comes first.
KIND_ORDER = {"ElasticQuotaTree": 0, "PriorityClass": 1, "PropagationPolicy": 2,
              "ClusterPropagationPolicy": 2, "PyTorchJob": 3}


def object_line(kind: str, name: str, verb: str) -> str:
    """kubectl's result line, e.g. ``pytorchjob.kubeflow.org/x created``."""
    return f"{RESOURCE_NAMES.get(kind, kind.lower())}/{name} {verb}"


@dataclass(frozen=True)
class Applied:
    """What applying one object did: its ``verb`` (``created``, ``configured``,
    ``unchanged``...), or the ``error`` the fleet refused it with."""

    kind: str
    name: str
    verb: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def line(self) -> str:
        """kubectl's line for it (the error line when it was refused)."""
        return self.error if self.error is not None else object_line(self.kind, self.name,
                                                                      self.verb)


def manifest_of(obj: FleetObject, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest as the user wrote it (aliases and all), JSON-compatible."""
    if raw is not None:
        return raw
    return obj.model_dump(mode="json", by_alias=True, exclude_none=True)


def update_error(exc: WorkflowUpdateFailedError) -> str:
    cause = exc.cause
    message = getattr(cause, "message", None) or str(cause or exc)
    return message.splitlines()[0] if message else str(exc)


async def apply_registry_object(client: Client, manifest: dict[str, Any]) -> str:
    """Apply a (Cluster)PropagationPolicy, PriorityClass or ElasticQuotaTree to the
    registry (``RegistryHandlers.APPLY`` of fleetq.handler_refs, whose contracts are not
    loaded for a job's apply)."""
    handle = await registry(client)
    result: str = await handle.execute_update("apply", manifest, result_type=str)
    return result


async def apply_tree(client: Client, tree: ElasticQuotaTree, manifest: dict[str, Any]) -> str:
    """Apply the ElasticQuotaTree to the registry and to its quota workflow (started if
    absent). (fleetq.messages, whose contracts import placement and numpy, is loaded
    here: applying a job alone does not need it.)"""
    from fleetq.handler_refs import QuotaTreeHandlers
    from fleetq.messages import QuotaTreeInput

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
    quota_verb: str = await handle.execute_update(
        QuotaTreeHandlers.APPLY_TREE.name, manifest, result_type=str)
    return "created" if verb == "created" else quota_verb


async def apply_objects(
    client: Client,
    objects: list[tuple[FleetObject, dict[str, Any]]],
    *,
    run_seconds: int | None = None,
    priority_classes: dict[str, int] | None = None,
) -> list[Applied]:
    """Apply validated objects in dependency order; one result per object.

    Objects built without the loader are checked first as it checks them: a bad
    preemption annotation (:func:`~fleetq.manifests.preemption_annotation_error`) raises
    :class:`InvalidInput`, one line per object, and nothing is applied."""
    refused = [str(e) for e in map(preemption_annotation_error, (o for o, _ in objects)) if e]
    if refused:
        raise InvalidInput("\n".join(refused))
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
                out.append(Applied(obj.kind, name,
                                   error=f"error: {obj.kind} is not supported by apply"))
                continue
        except WorkflowUpdateFailedError as exc:
            out.append(Applied(obj.kind, name,
                               error=f"Error from server (Invalid): {update_error(exc)}"))
            continue
        out.append(Applied(obj.kind, name, verb))
    return out


#: Delete order (``delete -f``): jobs first, then policies and classes, the tree last.
DELETE_ORDER = {"PyTorchJob": 0, "PropagationPolicy": 1, "ClusterPropagationPolicy": 1,
                "PriorityClass": 2, "ElasticQuotaTree": 3}


async def delete_object(client: Client, kind: str, namespace: str, name: str, *,
                        wait: bool, timeout: float) -> None:
    """Delete one object: a PyTorchJob by :func:`~fleetq.client.jobs.delete_job`, any other
    kind from the registry (:func:`~fleetq.client.registry.delete_registry_object`)."""
    if kind == "PyTorchJob":
        await delete_job(client, namespace, name, wait=wait, timeout=timeout)
    else:
        await delete_registry_object(client, kind, namespace, name)


async def delete_objects(client: Client, objects: list[tuple[FleetObject, dict[str, Any]]],
                         *, wait: bool, timeout: float
                         ) -> tuple[list[tuple[str, str]], list[str]]:
    """``delete -f``: ``([(kind, name) deleted], [one line per failure])``."""
    done: list[tuple[str, str]] = []
    errors: list[str] = []
    for obj, _ in sorted(objects, key=lambda o: DELETE_ORDER.get(o[0].kind, 9)):
        ns = getattr(obj.metadata, "namespace", None) or "default"
        try:
            await delete_object(client, obj.kind, ns, obj.metadata.name, wait=wait,
                                timeout=timeout)
        except ClientError as exc:
            errors.append(exc.message)
        else:
            done.append((obj.kind, obj.metadata.name))
    return done, errors


# --------------------------------------------------------------------------- loading


def load_for_apply(
    files: list[str], stdin: TextIO | None = None, *, warnings: list[str] | None = None
) -> tuple[list[tuple[FleetObject, dict[str, Any]]], dict[str, int], list[str]]:
    """Validate ``files``; returns ``(objects with their manifests as written,
    PriorityClasses in the input, notes)`` or raises :class:`InvalidInput` carrying every
    problem line. The loader's warnings (fields accepted but not used) are appended to
    ``warnings`` when a list is given."""
    stdin_text: str | None = None
    if STDIN in files:
        stdin_text = (stdin or sys.stdin).read()
    result = load_manifests(files, stdin=io.StringIO(stdin_text or ""))
    if result.errors:
        raise InvalidInput("\n".join(result.errors))
    if warnings is not None:
        warnings.extend(result.warnings)
    raw = _RawDocs(stdin_text)
    objects: list[tuple[FleetObject, dict[str, Any]]] = []
    too_big: list[str] = []
    for source, obj in result.objects:
        manifest = raw.find(source.path, obj) or manifest_of(obj)
        size = len(json.dumps(manifest, separators=(",", ":")).encode())
        if size > MAX_APPLY_BYTES:
            too_big.append(
                f"{object_ref(manifest)}: is "
                f"{size / 1e6:.1f} MB as JSON; fleetq accepts at most 1.5 MB per object "
                "(Temporal payloads are limited to 2 MB)"
            )
            continue
        objects.append((obj, manifest))
    if too_big:
        raise InvalidInput("\n".join(too_big))
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
                    and (obj.kind in CLUSTER_SCOPED
                         or (meta.get("namespace") or "default") == ns)):
                found = d  # the last copy wins, as in the loader
        if found is None:
            return None
        doc = json.loads(json.dumps(found, default=str))
        if obj.kind == "ClusterPropagationPolicy":  # cluster-scoped: no namespace, as the
            (doc.get("metadata") or {}).pop("namespace", None)  # API server clears it
        elif obj.kind != "PriorityClass":
            doc.setdefault("metadata", {}).setdefault("namespace", ns)
        return doc  # type: ignore[no-any-return]
