"""The workload trace a simulation replays: its model, validation and loading.

A trace (see ``examples/traces/``) names a topology, an optional quota tree, a queue
policy and groups of identical jobs. :func:`parse_trace` validates it with pydantic into a
:class:`Trace` whose problems end in one line naming the field (:class:`TraceError`), and
turns each job group into the PyTorchJob it stands for, so :func:`fleetq.models.gang_of`
derives its gang exactly as the workflows do. The preemption policy is read the same way:
the tree's ``fleetq.io/preemption``, ``fleetq.io/reclaim`` and
``fleetq.io/fair-share-weight`` annotations by :func:`fleetq.preemption.tree_policy`, a
group's ``annotations`` (``fleetq.io/preemptible``,
``fleetq.io/preemption-grace-seconds``) by :func:`fleetq.preemption.job_policy`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from fleetq.admission import QueuePolicy
from fleetq.models import (
    DEFAULT_STARVATION_SECONDS,
    DNS1035_LABEL,
    DNS1123_LABEL,
    ClusterAffinity,
    ElasticQuotaTree,
    Gang,
    ManifestError,
    ManifestErrors,
    Toleration,
    _loc_to_path,
    _pydantic_message,
    gang_of,
    parse_job,
    parse_tree,
    resource_map,
)
from fleetq.preemption import (
    PREEMPTION_ANNOTATION,
    RECLAIM_ANNOTATION,
    JobPreemptionPolicy,
    PreemptionMode,
    ReclaimMode,
    TreePreemptionPolicy,
    job_policy,
    tree_policy,
)
from fleetq.topology import (
    Topology,
    TopologyError,
    default_topology,
    load_topology,
    parse_topology,
)

__all__ = [
    "MAX_JOBS",
    "JobGroupSpec",
    "RunRange",
    "Trace",
    "TraceError",
    "TraceSpec",
    "load_trace",
    "parse_trace",
    "with_overrides",
]

#: Most jobs one trace may expand to (keeps a typo like ``count: 1e9`` from hanging).
MAX_JOBS = 2_000_000


class TraceError(ValueError):
    """A trace that cannot be simulated; the message is one line naming the field."""


# --------------------------------------------------------------------------- trace model


class RunRange(BaseModel):
    """``runSeconds: {min: 300, max: 900}``: drawn uniformly per job (seeded)."""

    model_config = ConfigDict(extra="forbid")
    min: float = Field(ge=0, allow_inf_nan=False)
    max: float = Field(ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _order(self) -> RunRange:
        if self.min > self.max:
            raise ValueError(f"@min {self.min:g} exceeds max {self.max:g}")
        return self


def _message(err: Any) -> str:
    kind = err.get("type", "")
    if kind in ("float_type", "float_parsing"):
        return "must be a number"
    if kind == "finite_number":
        return "must be a finite number"
    return _pydantic_message(err)


def _check_requests(v: Any) -> dict[str, Any]:
    """A job's requests: any non-empty resource name (traces name their own), each a
    valid quantity (``fleetq.models.resource_map``)."""
    return resource_map(v, valid_name=lambda name: isinstance(name, str) and bool(name))


class JobGroupSpec(BaseModel):
    """``count`` identical jobs submitted every ``interval`` seconds from ``start``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    namespace: str = "default"
    annotations: dict[str, str] = Field(default_factory=dict)  # the jobs' annotations
    #: the job class this group belongs to (``small``, ``large``...): the report also
    #: gives the times of each class, all its groups together
    jobClass: str | None = Field(None, min_length=1, max_length=63)
    count: StrictInt = Field(ge=0, le=MAX_JOBS)
    start: float = Field(0.0, ge=0, allow_inf_nan=False)
    interval: float = Field(0.0, ge=0, allow_inf_nan=False)
    priority: StrictInt = Field(0, ge=-2_147_483_648, le=1_000_000_000)
    master: StrictInt = Field(1, ge=1, le=1)
    workers: StrictInt = Field(0, ge=0, le=10_000)
    requests: dict[str, Any] = Field(default_factory=dict)  # per pod
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    clusterAffinity: ClusterAffinity | None = None
    runSeconds: float | RunRange

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        # job names are made from it, and a PyTorchJob's name is a DNS-1035 label
        if len(v) > 40 or not DNS1035_LABEL.fullmatch(v):
            raise ValueError(
                f"{v[:64]!r} is not a valid group name (lowercase DNS-1035 label: a letter "
                "first, at most 40 characters)"
            )
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if len(v) > 63 or not DNS1123_LABEL.fullmatch(v):
            raise ValueError(f"{v[:64]!r} is not a valid namespace (lowercase DNS label)")
        return v

    @field_validator("requests", mode="before")
    @classmethod
    def _requests(cls, v: Any) -> dict[str, Any]:
        return _check_requests(v)

    @field_validator("runSeconds", mode="before")
    @classmethod
    def _run(cls, v: Any) -> Any:
        if isinstance(v, bool) or v is None:
            raise ValueError("must be a number of seconds or {min, max}")
        if isinstance(v, int | float):
            if not math.isfinite(v) or v < 0:
                raise ValueError("must be a finite number >= 0")
            return float(v)
        if isinstance(v, Mapping):
            try:
                return RunRange.model_validate(dict(v))
            except ValidationError as exc:
                err = exc.errors()[0]
                where = _loc_to_path(err.get("loc", ()))
                msg = _message(err)
                if msg.startswith("@"):
                    raise ValueError(msg) from None
                raise ValueError(f"@{where} {msg}" if where else msg) from None
        raise ValueError("must be a number of seconds or {min, max}")


class TraceSpec(BaseModel):
    """The trace file as written (see ``examples/traces/``)."""

    model_config = ConfigDict(extra="forbid")
    topology: Any = "default"
    quota: dict[str, Any] | None = None
    queuePolicy: QueuePolicy = QueuePolicy.PRIORITY
    starvationSeconds: float = Field(DEFAULT_STARVATION_SECONDS, ge=0, allow_inf_nan=False)
    seed: StrictInt = 0
    jobs: list[JobGroupSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _groups(self) -> TraceSpec:
        seen: set[str] = set()
        total = 0
        for i, g in enumerate(self.jobs):
            if g.name in seen:
                raise ValueError(f"@jobs[{i}].name {g.name!r} is used twice")
            seen.add(g.name)
            total += g.count
        if total > MAX_JOBS:
            raise ValueError(f"@jobs has {total} jobs in all, at most {MAX_JOBS} are allowed")
        return self


@dataclass
class Trace:
    """A validated trace with its topology, quota tree and one gang per job group, the
    tree's preemption policy and each group's own (``jobs`` gives one per group; a
    trace built without them has every group preemptible with the default grace)."""

    spec: TraceSpec
    topology: Topology
    tree: ElasticQuotaTree | None
    gangs: list[Gang]
    preemption: TreePreemptionPolicy = field(default_factory=TreePreemptionPolicy)
    jobs: list[JobPreemptionPolicy] = field(default_factory=list)

    @property
    def policy(self) -> QueuePolicy:
        return self.spec.queuePolicy

    def job_policy(self, gid: int) -> JobPreemptionPolicy:
        """The preemption policy of job group ``gid``."""
        return self.jobs[gid] if gid < len(self.jobs) else JobPreemptionPolicy()

    @property
    def job_count(self) -> int:
        return sum(g.count for g in self.spec.jobs)


def _first_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return "is invalid"
    more = f" (+{len(lines) - 1} more problems)" if len(lines) > 1 else ""
    return lines[0] + more


def _validation_line(source: str, exc: ValidationError) -> str:
    errors = exc.errors()
    err = errors[0]
    path = _loc_to_path(err.get("loc", ()))
    # Union members add their type name to the location; users never wrote those.
    path = re.sub(r"\.(float|RunRange|function-[a-z]+\[[^\]]*\])", "", path)
    msg = _message(err)
    m = re.match(r"^@([\w.\[\]/\-]+) (.*)$", msg, re.S)
    if m:
        sub = m.group(1)
        path = (f"{path}{sub}" if sub.startswith("[") else f"{path}.{sub}") if path else sub
        msg = m.group(2)
    more = f" (+{len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{source} {path} {msg}{more}".replace("  ", " ")


def _job_doc(g: JobGroupSpec) -> dict[str, Any]:
    """The PyTorchJob a trace group stands for, so :func:`gang_of` derives the gang."""
    pod: dict[str, Any] = {
        "containers": [
            {"name": "pytorch", "image": "fleetq/sim", "resources": {"requests": g.requests}}
        ],
        "priority": g.priority,
    }
    if g.nodeSelector:
        pod["nodeSelector"] = dict(g.nodeSelector)
    if g.tolerations:
        pod["tolerations"] = [t.model_dump(exclude_none=True) for t in g.tolerations]
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": g.name, "namespace": g.namespace, "annotations": g.annotations},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": g.master, "template": {"spec": pod}},
                # the training-operator webhook refuses a Worker with replicas below 1
                **({"Worker": {"replicas": g.workers, "template": {"spec": pod}}}
                   if g.workers else {}),
            }
        },
    }


def parse_trace(doc: Any, source: str = "trace", base_dir: Path | None = None) -> Trace:
    """Validate a decoded trace; raise :class:`TraceError` (one line) on any problem.
    A ``topology`` string other than ``default`` is a topology file, relative to
    ``base_dir``."""
    if not isinstance(doc, Mapping):
        raise TraceError(f"{source}: must be a mapping with 'topology', 'quota' and 'jobs'")
    try:
        spec = TraceSpec.model_validate(dict(doc))
    except ValidationError as exc:
        raise TraceError(_validation_line(source, exc)) from None
    topo = _trace_topology(spec, source, base_dir)
    if not any(c.nodeGroups for c in topo.members):
        raise TraceError(f"{source} topology has no member cluster with nodes")
    tree, preemption = _trace_tree(spec, source)
    gangs, jobs = _trace_jobs(spec, source)
    return Trace(spec, topo, tree, gangs, preemption, jobs)


def _trace_topology(spec: TraceSpec, source: str, base_dir: Path | None) -> Topology:
    """The trace's topology: the default one, a topology file or an inline one."""
    try:
        if spec.topology == "default" or spec.topology is None:
            return default_topology()
        if isinstance(spec.topology, str):
            path = Path(spec.topology)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            return load_topology(path)
        return parse_topology(spec.topology, f"{source} topology")
    except TopologyError as exc:
        line = _first_line(str(exc))
        inline = f"{source} topology: "
        if line.startswith(inline):
            line = f"{source} topology." + line.removeprefix(inline)
        else:
            line = f"{inline}{line}"
        raise TraceError(line) from None


def _trace_tree(
    spec: TraceSpec, source: str
) -> tuple[ElasticQuotaTree | None, TreePreemptionPolicy]:
    """The trace's quota tree (None without one) and its preemption policy."""
    if spec.quota is None:
        return None, TreePreemptionPolicy()
    try:
        tree = parse_tree(spec.quota)
        return tree, tree_policy(tree)
    except (ManifestError, ManifestErrors) as exc:
        raise TraceError(f"{source} quota: {_first_line(str(exc))}") from None


def _trace_jobs(
    spec: TraceSpec, source: str
) -> tuple[list[Gang], list[JobPreemptionPolicy]]:
    """Each trace group's gang and job preemption policy."""
    gangs: list[Gang] = []
    jobs: list[JobPreemptionPolicy] = []
    for i, g in enumerate(spec.jobs):
        try:
            job = parse_job(_job_doc(g))
            gangs.append(gang_of(job))
            jobs.append(job_policy(job))
        except (ManifestError, ManifestErrors) as exc:
            raise TraceError(f"{source} jobs[{i}]: {_first_line(str(exc))}") from None
    return gangs, jobs


def with_overrides(
    trace: Trace,
    *,
    preemption: PreemptionMode | str | None = None,
    reclaim: ReclaimMode | str | None = None,
    starvation_seconds: float | None = None,
) -> Trace:
    """``trace`` with its tree's ``fleetq.io/preemption`` / ``fleetq.io/reclaim``
    annotations or its ``starvationSeconds`` replaced (``None`` keeps the trace's), as
    ``fleetq sim replay --preemption/--reclaim/--starvation-seconds`` do. The policy is
    written on a copy of the tree and read back with :func:`fleetq.preemption.
    tree_policy`, so the simulation sees it exactly as the quota workflow would. A trace
    without a quota tree has nothing to preempt for: a policy other than ``Never`` is
    refused (:class:`TraceError`)."""
    spec = trace.spec
    if starvation_seconds is not None:
        if not (math.isfinite(starvation_seconds) and starvation_seconds >= 0):
            raise TraceError(
                f"starvation seconds must be a finite number >= 0, got {starvation_seconds!r}"
            )
        spec = spec.model_copy(update={"starvationSeconds": float(starvation_seconds)})
    notes: dict[str, str] = {}
    if preemption is not None:
        notes[PREEMPTION_ANNOTATION] = PreemptionMode(preemption).value
    if reclaim is not None:
        notes[RECLAIM_ANNOTATION] = ReclaimMode(reclaim).value
    tree, policy = trace.tree, trace.preemption
    if notes:
        if tree is None:
            if any(v != "Never" for v in notes.values()):
                raise TraceError("trace has no quota tree: there is no quota to preempt for")
        else:
            tree = tree.model_copy(deep=True)
            tree.metadata.annotations.update(notes)
            policy = tree_policy(tree)
    return dataclasses.replace(trace, spec=spec, tree=tree, preemption=policy)


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file (YAML or JSON)."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise TraceError(f"trace {p}: cannot read ({reason})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TraceError(f"trace {p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return parse_trace(doc, "trace", p.parent)
