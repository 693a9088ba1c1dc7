"""What-if simulator: replay a workload trace against a quota tree, a queue policy and a
fleet topology in virtual time, before any of it is applied to the real fleet.

``fleetq sim replay`` calls :func:`load_trace` and :func:`simulate`. The simulation runs
the *same* code as the Temporal workflows: :class:`fleetq.admission.Admission` for quota
and queues, :func:`fleetq.placement.place_gang` for gang placement on
:class:`fleetq.capacity.ClusterSnapshot` s, and :func:`fleetq.models.gang_of` /
:func:`fleetq.models.quota_request` to turn each job into a gang and a quota request.
Only the plumbing around them (signals, activities, timers) is replaced by a heap of
events in virtual time:

* *submit* -> ``Admission.enqueue``; a job admitted at once is placed at once;
* an admitted job is placed with ``place_gang`` over the member clusters' current
  snapshots; if a cluster fits, the gang is bound to the best one (its pods' requests are
  added to the assigned nodes) and a *finish* event is scheduled ``runSeconds`` later;
* if no cluster fits, the job keeps its quota and is retried when capacity is freed (a
  job finishes), like the workflow's ``retry_placement`` signal. For every job whose first
  attempt fails, each cluster's rejection is counted under its normalised reason
  (``needs cpu; no node has enough free``, see :func:`normalise_reason`);
* *finish* -> node requests are freed, ``Admission.release`` then ``Admission.schedule``
  grants quota to waiting jobs, which are then placed.

Speed (15,000 jobs in a few seconds): placement is only retried for admitted-but-unplaced
jobs, only after capacity was freed, and once per job *shape* (trace group) per capacity
change: binds only take capacity away, so a gang that did not fit keeps not fitting until
something finishes. Before ``place_gang`` runs, a cheap necessary check (enough pod copies
on the eligible nodes of a cluster; exact for gangs whose pods share one shape) drops the
clusters that cannot fit, so ``place_gang`` sees only candidates (same best choice) and
is skipped when there are none. Rejection reasons are computed with ``place_gang`` only
for clusters that changed since they last rejected that gang. (The placement heuristic is
sound but not complete; a gang it rejects could in rare cases fit once other gangs moved,
and such a gang is simply retried at the next finish.)

Metrics use time-weighted integration of step functions over ``[first submit, end]``.

Pure: no Temporal, no network, no wall clock; run times drawn from ``runSeconds: {min,
max}`` come from a :class:`random.Random` seeded from the trace's ``seed``, so the same
trace always gives the same result.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
import re
from bisect import bisect_right
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
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

from fleetq import resources as R
from fleetq.admission import Admission, AdmissionRequest, Grant, QueuePolicy
from fleetq.capacity import ClusterSnapshot, NodeCapacity, Taint
from fleetq.emulator.topology import (
    Topology,
    TopologyError,
    default_topology,
    load_topology,
    node_names,
    parse_topology,
)
from fleetq.models import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    ClusterAffinity,
    ElasticQuotaTree,
    Gang,
    ManifestErrors,
    Toleration,
    _loc_to_path,
    _pydantic_message,
    gang_of,
    parse_job,
    parse_tree,
    quota_request,
)
from fleetq.placement import ClusterChoice, PlacementDecision, place_gang, untolerated_taints

__all__ = [
    "JobGroupSpec",
    "SimulationResult",
    "StepSeries",
    "Trace",
    "TraceError",
    "TraceSpec",
    "load_trace",
    "normalise_reason",
    "parse_trace",
    "simulate",
]

#: Most jobs one trace may expand to (keeps a typo like ``count: 1e9`` from hanging).
MAX_JOBS = 2_000_000
#: Points per series in the JSON timeline.
TIMELINE_POINTS = 200


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
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ValueError("must be a mapping of resource name to quantity")
    for name, q in v.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"has an invalid resource name {str(name)[:64]!r}")
        try:
            R.parse_milli(q)
        except R.QuantityError as exc:
            raise ValueError(f"@{name} {exc}") from None
    return dict(v)


class JobGroupSpec(BaseModel):
    """``count`` identical jobs submitted every ``interval`` seconds from ``start``."""

    model_config = ConfigDict(extra="forbid")
    name: str
    namespace: str = "default"
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
    starvationSeconds: float = Field(600.0, ge=0, allow_inf_nan=False)
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
    """A validated trace with its topology, quota tree and one gang per job group."""

    spec: TraceSpec
    topology: Topology
    tree: ElasticQuotaTree | None
    gangs: list[Gang]

    @property
    def policy(self) -> QueuePolicy:
        return self.spec.queuePolicy

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
        "metadata": {"name": g.name, "namespace": g.namespace},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": g.master, "template": {"spec": pod}},
                "Worker": {"replicas": g.workers, "template": {"spec": pod}},
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
    try:
        if spec.topology == "default" or spec.topology is None:
            topo = default_topology()
        elif isinstance(spec.topology, str):
            path = Path(spec.topology)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            topo = load_topology(path)
        else:
            topo = parse_topology(spec.topology, f"{source} topology")
    except TopologyError as exc:
        line = _first_line(str(exc))
        inline = f"{source} topology: "
        if line.startswith(inline):
            line = f"{source} topology." + line.removeprefix(inline)
        else:
            line = f"{inline}{line}"
        raise TraceError(line) from None
    if not any(c.nodeGroups for c in topo.members):
        raise TraceError(f"{source} topology has no member cluster with nodes")
    tree = None
    if spec.quota is not None:
        try:
            tree = parse_tree(spec.quota)
        except ManifestErrors as exc:
            raise TraceError(f"{source} quota: {_first_line(str(exc))}") from None
    gangs: list[Gang] = []
    for i, g in enumerate(spec.jobs):
        try:
            gangs.append(gang_of(parse_job(_job_doc(g))))
        except ManifestErrors as exc:
            raise TraceError(f"{source} jobs[{i}]: {_first_line(str(exc))}") from None
    return Trace(spec, topo, tree, gangs)


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


# --------------------------------------------------------------------------- topology


def cluster_snapshots(topology: Topology) -> list[ClusterSnapshot]:
    """One empty snapshot per member cluster with nodes, nodes named and labelled like the
    emulator's (``<cluster>-<prefix>-<n>``, ``kubernetes.io/hostname``, group labels)."""
    out: list[ClusterSnapshot] = []
    for spec in topology.members:
        nodes: list[NodeCapacity] = []
        for name, group in node_names(spec):
            cap = R.parse_resources(group.capacity_quantities())
            pods = cap.pop(R.PODS, 110 * R.MILLI) // R.MILLI
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "fleetq-emulated",
                "fleetq.io/cluster": spec.name,
                **group.labels,
            }
            taints = tuple(Taint(t.key, t.value, t.effect) for t in group.taints)
            nodes.append(
                NodeCapacity(name, cap, {}, labels, taints, pods_allocatable=int(pods))
            )
        if nodes:
            out.append(
                ClusterSnapshot(
                    spec.name,
                    labels=dict(spec.labels),
                    nodes=nodes,
                    reservation=spec.reservation,
                    resource_version="0",
                )
            )
    return out


# --------------------------------------------------------------------------- reasons

_POD = r"(?:master|worker)-\d+"
_Q = r"\S+"
_REASONS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"^(?:{_POD} )?needs (\S+) {_Q}, no node has any"), r"needs \1; no node has any"),
    (
        re.compile(rf"^(?:{_POD} )?needs (\S+) {_Q}, largest free node has"),
        r"needs \1; no node has enough free",
    ),
    (
        re.compile(rf"^needs (\S+) {_Q} in total, "),
        r"needs \1; not enough free in the whole cluster",
    ),
    (re.compile(r"^needs \d+ pod slots in total|^needs \d+ pod slots, "),
     "needs pod slots; not enough free in the whole cluster"),
    (re.compile(rf"^(?:{_POD} )?needs a pod slot, "), "needs a pod slot; all usable nodes full"),
    (re.compile(rf"^(?:{_POD} )?needs .* on one node, no node has all of it free"),
     "needs all its requests on one node; no node has all of them free"),
    (re.compile(r"^no node matches nodeSelector (\S+) for "), r"no node matches nodeSelector \1"),
    (re.compile(r"^no schedulable node "), "no schedulable node (all cordoned)"),
    (re.compile(rf"^(?:{_POD} )?does not tolerate the taints"),
     "does not tolerate the taints of any node it could use"),
    (re.compile(r"^no free pod slot for "), "no free pod slot on the nodes it could use"),
    (re.compile(r"^no node for "), "no node"),
]


@functools.lru_cache(maxsize=4096)
def normalise_reason(reason: str) -> str:
    """A placement rejection without pod names and numbers, so that reasons group:
    ``worker-3 needs cpu 4, largest free node has 2 (1 of 4 pods placed)`` ->
    ``needs cpu; no node has enough free``."""
    for pattern, repl in _REASONS:
        m = pattern.search(reason)
        if m:
            return m.expand(repl)
    text = re.sub(rf"\b{_POD}\b", "", reason)
    text = re.sub(r"\(.*?\)", "", text)
    text = re.sub(r"\b\d[\w.]*\b", "", text)
    return re.sub(r"\s+", " ", text).strip(" ,;") or reason


# --------------------------------------------------------------------------- metrics


class StepSeries:
    """A piecewise-constant function of time, recorded as change points."""

    __slots__ = ("times", "values")

    def __init__(self, t0: float, v0: float = 0.0) -> None:
        self.times: list[float] = [t0]
        self.values: list[float] = [v0]

    def set(self, t: float, v: float) -> None:
        if v == self.values[-1]:
            return
        if t == self.times[-1]:
            self.values[-1] = v
            if len(self.values) > 1 and self.values[-2] == v:
                self.times.pop()
                self.values.pop()
        else:
            self.times.append(t)
            self.values.append(v)

    def integral(self, end: float) -> float:
        """Integral from the first change point to ``end``."""
        t = np.asarray(self.times + [max(end, self.times[-1])], dtype=float)
        v = np.asarray(self.values, dtype=float)
        return float(np.dot(v, np.diff(t)))

    def average(self, end: float) -> float:
        span = end - self.times[0]
        if span <= 0:
            return float(self.values[-1])
        return self.integral(end) / span

    def peak(self) -> float:
        return float(max(self.values))

    def sample(self, times: np.ndarray[Any, Any]) -> list[float]:
        idx = np.searchsorted(np.asarray(self.times), times, side="right") - 1
        vals = np.asarray(self.values, dtype=float)
        return [float(x) for x in vals[np.clip(idx, 0, len(vals) - 1)]]

    def at(self, t: float) -> float:
        i = bisect_right(self.times, t) - 1
        return float(self.values[max(i, 0)])


def _stats(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    arr = np.asarray(values, dtype=float)
    p50, p90, p99 = (float(x) for x in np.percentile(arr, [50, 90, 99]))
    return {
        "count": len(values),
        "mean": _r(float(arr.mean())),
        "p50": _r(p50),
        "p90": _r(p90),
        "p99": _r(p99),
        "max": _r(float(arr.max())),
    }


def _r(x: float, digits: int = 6) -> float:
    return round(x, digits)


def _units(name: str, milli: float) -> float:
    """Milli-units to the unit users write (cores, bytes, GPUs, jobs, pods)."""
    return _r(milli / R.MILLI, 3)


# --------------------------------------------------------------------------- simulation

_FINISH = 0  # at equal times, finishes (which free capacity) go before submissions
_SUBMIT = 1


class _Job:
    __slots__ = ("admitted", "binding", "cluster", "gid", "id", "run", "seq", "started",
                 "submitted")

    def __init__(self, gid: int, job_id: str, submitted: float, run: float) -> None:
        self.gid = gid
        self.id = job_id
        self.submitted = submitted
        self.run = run
        self.admitted: float | None = None
        self.started: float | None = None
        self.seq = 0  # admission order
        self.cluster = ""
        self.binding: list[tuple[NodeCapacity, R.Resources]] = []


@dataclass
class _Reason:
    jobs: int = 0
    clusters: set[str] = field(default_factory=set)
    example: str = ""


@dataclass
class SimulationResult:
    """Everything :func:`simulate` measured. :meth:`summary` is the JSON-ready report;
    ``series`` holds the full step functions (for plots): ``queueLength`` per queue (plus
    ``admitted, unplaced``), ``quotaUtilisation`` per ``node/resource`` with a ``max``,
    ``clusterUtilisation`` per ``cluster/resource`` (allocated / allocatable)."""

    summary_data: dict[str, Any]
    series: dict[str, dict[str, StepSeries]]
    t0: float
    end: float

    def summary(self, timeline_points: int = TIMELINE_POINTS) -> dict[str, Any]:
        out = dict(self.summary_data)
        out["timeline"] = self.timeline(timeline_points)
        return out

    def timeline(self, points: int = TIMELINE_POINTS) -> dict[str, Any]:
        """Every series sampled at ``points`` evenly spaced times over ``[t0, end]``."""
        n = max(2, points) if self.end > self.t0 else 1
        times = np.linspace(self.t0, self.end, n)
        out: dict[str, Any] = {"t": [_r(float(t), 3) for t in times]}
        for kind, group in self.series.items():
            out[kind] = {name: [_r(v, 4) for v in s.sample(times)] for name, s in group.items()}
        return out


class _Simulator:
    """One run: the event loop, the fleet's node state and the metrics (see the module
    docstring)."""

    def __init__(self, trace: Trace, policy: QueuePolicy | None) -> None:
        spec = trace.spec
        self.trace = trace
        self.policy = QueuePolicy(policy or spec.queuePolicy)
        self.admission = Admission(trace.tree, self.policy, spec.starvationSeconds)
        self.snapshots = cluster_snapshots(trace.topology)
        self.by_cluster = {s.name: s for s in self.snapshots}
        self.nodes = {s.name: {n.name: n for n in s.nodes} for s in self.snapshots}
        self.version = 0
        groups = spec.jobs
        self.gangs = trace.gangs
        self.pods = [[(p.name_suffix, dict(p.requests)) for p in g.pods] for g in self.gangs]
        self.totals = [g.total for g in self.gangs]
        self.requests = [quota_request(g) for g in self.gangs]
        self.widths = [len(str(max(g.count - 1, 0))) for g in groups]
        self.rngs = [random.Random(spec.seed * 1_000_003 + i) for i in range(len(groups))]
        self.allowed = [
            [g.clusterAffinity is None or g.clusterAffinity.allows(s.name, s.labels)
             for s in self.snapshots]
            for g in groups
        ]
        self.shapes = [[_shapes(gang, snap) for snap in self.snapshots] for gang in self.gangs]
        starts = [g.start for g in groups if g.count > 0]
        self.t0 = min(starts) if starts else 0.0
        # state
        self.heap: list[tuple[float, int, int, int]] = []
        self.waiting: dict[str, _Job] = {}
        self.running: dict[int, _Job] = {}
        self.unplaced: dict[int, deque[_Job]] = {}
        self.failed: set[int] = set()  # groups that fit nowhere until capacity is freed
        self.reason_cache: dict[tuple[int, str], tuple[str, str]] = {}  # -> (version, why)
        self.fresh: list[_Job] = []
        self.freed = False
        self.quota_changed = False
        self.changed_clusters: set[str] = set()
        self.adm_seq = 0
        self.bind_seq = 0
        self.jobs: list[list[_Job]] = [[] for _ in groups]
        self.reasons: dict[str, _Reason] = {}
        self.failed_attempts = 0
        self.delayed = 0
        self.completed = 0
        self.last_finish: float | None = None
        # metrics
        t0 = self.t0
        self.queue_of_node = {q.node: q.name for q in self.admission.queues()}
        self.qlen: dict[str, int] = dict.fromkeys(self.queue_of_node.values(), 0)
        self.qlen_series = {q: StepSeries(t0) for q in self.qlen}
        self.qlen_series["admitted, unplaced"] = StepSeries(t0)
        self.unplaced_count = 0
        requested: set[str] = set()
        for req in self.requests:
            requested.update(k for k, v in req.items() if v)
        self.quota_res: dict[str, list[str]] = {}
        for node in self.admission.quota:
            names = sorted(set(node.max) | requested, key=_res_order)
            self.quota_res[node.name] = names
        self.quota_series = {
            f"{n}/{r}": StepSeries(t0) for n, rs in self.quota_res.items() for r in rs
        }
        self.alloc_total: dict[str, R.Resources] = {}
        self.alloc_now: dict[str, R.Resources] = {}
        for s in self.snapshots:
            tot: R.Resources = {}
            for n in s.nodes:
                if not n.unschedulable:
                    R.add_into(tot, n.allocatable)
                    tot[R.PODS] = tot.get(R.PODS, 0) + n.pods_allocatable * R.MILLI
            self.alloc_total[s.name] = {k: v for k, v in tot.items() if v > 0}
            self.alloc_now[s.name] = {}
        self.cluster_series = {
            f"{c}/{r}": StepSeries(t0)
            for c, tot in self.alloc_total.items()
            for r in sorted(tot, key=_res_order)
        }

    # ------------------------------------------------------------------ events

    def _push_submit(self, gid: int, idx: int) -> None:
        g = self.trace.spec.jobs[gid]
        if idx < g.count:
            heapq.heappush(self.heap, (g.start + idx * g.interval, _SUBMIT, gid, idx))

    def _run_seconds(self, gid: int) -> float:
        run = self.trace.spec.jobs[gid].runSeconds
        if isinstance(run, RunRange):
            return round(self.rngs[gid].uniform(run.min, run.max), 3)
        return run

    def _submit(self, t: float, gid: int, idx: int) -> None:
        self._push_submit(gid, idx + 1)
        g = self.trace.spec.jobs[gid]
        job_id = f"pytorchjob/{g.namespace}/{g.name}-{idx:0{self.widths[gid]}d}"
        job = _Job(gid, job_id, t, self._run_seconds(gid))
        self.jobs[gid].append(job)
        req = AdmissionRequest(
            job_id=job_id,
            namespace=g.namespace,
            priority=self.gangs[gid].priority,
            request=self.requests[gid],
            submitted_at=t,
        )
        res = self.admission.enqueue(req, t)
        if isinstance(res, Grant):
            self._granted(job, t)
        else:
            self.waiting[job_id] = job
            self.qlen[res.queue] += 1
            self.qlen_series[res.queue].set(t, self.qlen[res.queue])

    def _granted(self, job: _Job, t: float) -> None:
        job.admitted = t
        job.seq = self.adm_seq
        self.adm_seq += 1
        self.unplaced.setdefault(job.gid, deque()).append(job)
        self.unplaced_count += 1
        self.fresh.append(job)
        self.quota_changed = True

    def _finish(self, t: float, key: int) -> None:
        job = self.running.pop(key)
        for node, req in job.binding:
            R.add_into(node.requested, req, -1)
            node.pods_used -= 1
        job.binding = []
        self._touch(job.cluster)
        alloc = self.alloc_now[job.cluster]
        R.add_into(alloc, self.totals[job.gid], -1)
        alloc[R.PODS] = alloc.get(R.PODS, 0) - len(self.pods[job.gid]) * R.MILLI
        self.completed += 1
        self.last_finish = t
        self.freed = True
        self.admission.release(job.id)
        self.quota_changed = True
        for grant in self.admission.schedule(t):
            waiting = self.waiting.pop(grant.job_id)
            self.qlen[grant.queue] -= 1
            self.qlen_series[grant.queue].set(t, self.qlen[grant.queue])
            self._granted(waiting, t)

    def _touch(self, cluster: str) -> None:
        self.version += 1
        self.by_cluster[cluster].resource_version = str(self.version)
        self.changed_clusters.add(cluster)

    # ------------------------------------------------------------------ placement

    def _may_fit(self, gid: int, ci: int) -> bool:
        """Necessary condition for the gang to fit cluster ``ci`` (exact when all its pods
        share one shape): for each group of identical pods, the eligible nodes can hold
        enough copies. Much cheaper than :func:`place_gang`, which decides."""
        for reqs, count, nodes in self.shapes[gid][ci]:
            room = 0
            for node in nodes:
                copies = node.pods_allocatable - node.pods_used
                if copies <= 0:
                    continue
                alloc = node.allocatable
                used = node.requested
                for r, q in reqs:
                    c = (alloc.get(r, 0) - used.get(r, 0)) // q
                    if c < copies:
                        copies = c
                        if c <= 0:
                            break
                if copies > 0:
                    room += copies
                    if room >= count:
                        break
            if room < count:
                return False
        return True

    def _try_place(self, gid: int) -> ClusterChoice | None:
        """``place_gang`` over the clusters that pass :meth:`_may_fit` (the others cannot
        fit, so the best choice is the same as over all clusters)."""
        candidates = [
            snap for ci, snap in enumerate(self.snapshots)
            if self.allowed[gid][ci] and self._may_fit(gid, ci)
        ]
        if not candidates:
            return None
        decision = place_gang(
            self.gangs[gid], candidates, affinity=self.trace.spec.jobs[gid].clusterAffinity
        )
        if decision.best is None:
            self._remember(gid, decision)
        return decision.best

    def _remember(self, gid: int, decision: PlacementDecision) -> None:
        for cluster, reason in decision.rejections.items():
            version = self.by_cluster[cluster].resource_version
            self.reason_cache[(gid, cluster)] = (version, reason)

    def _reasons(self, gid: int) -> list[tuple[str, str]]:
        """Why the gang fits no cluster now: ``place_gang``'s rejections, evaluated only
        for clusters that changed since they last rejected this gang."""
        stale = [
            snap for snap in self.snapshots
            if self.reason_cache.get((gid, snap.name), ("",))[0] != snap.resource_version
        ]
        if stale:
            decision = place_gang(
                self.gangs[gid], stale, affinity=self.trace.spec.jobs[gid].clusterAffinity
            )
            self._remember(gid, decision)
        return [
            (snap.name, self.reason_cache[(gid, snap.name)][1])
            for snap in self.snapshots
            if (gid, snap.name) in self.reason_cache
        ]

    def _bind(self, job: _Job, cluster: str, assignment: Mapping[str, str], t: float) -> None:
        nodes = self.nodes[cluster]
        binding = []
        for suffix, req in self.pods[job.gid]:
            node = nodes[assignment[suffix]]
            R.add_into(node.requested, req)
            node.pods_used += 1
            binding.append((node, req))
        job.binding = binding
        job.cluster = cluster
        job.started = t
        self._touch(cluster)
        alloc = self.alloc_now[cluster]
        R.add_into(alloc, self.totals[job.gid])
        alloc[R.PODS] = alloc.get(R.PODS, 0) + len(self.pods[job.gid]) * R.MILLI
        key = self.bind_seq
        self.bind_seq += 1
        self.running[key] = job
        heapq.heappush(self.heap, (t + job.run, _FINISH, key, 0))

    def _placement_pass(self, t: float) -> None:
        """Place admitted-but-unplaced jobs in admission order. A gang shape (trace group)
        that does not fit is not tried again until capacity is freed."""
        if self.freed:
            self.failed.clear()
            self.freed = False
        heap = [(q[0].seq, gid) for gid, q in self.unplaced.items() if q and gid not in self.failed]
        heapq.heapify(heap)
        while heap:
            _, gid = heapq.heappop(heap)
            queue = self.unplaced[gid]
            best = self._try_place(gid)
            if best is None:
                self.failed.add(gid)
                self.failed_attempts += 1
                continue
            job = queue.popleft()
            self.unplaced_count -= 1
            self._bind(job, best.cluster, best.assignment, t)
            if queue:
                heapq.heappush(heap, (queue[0].seq, gid))
        counted: dict[int, dict[str, tuple[list[str], str]]] = {}
        for job in self.fresh:
            if job.started is None:
                self.delayed += 1
                grouped = counted.get(job.gid)
                if grouped is None:
                    grouped = counted[job.gid] = _grouped(self._reasons(job.gid))
                for reason, (names, example) in grouped.items():
                    entry = self.reasons.setdefault(reason, _Reason(example=example))
                    entry.jobs += 1
                    entry.clusters.update(names)
        self.fresh = []

    # ------------------------------------------------------------------ recording

    def _record(self, t: float) -> None:
        self.qlen_series["admitted, unplaced"].set(t, self.unplaced_count)
        if self.quota_changed:
            self.quota_changed = False
            for name, res in self.quota_res.items():
                usage = self.admission.quota.nodes[name].usage
                for r in res:
                    self.quota_series[f"{name}/{r}"].set(t, usage.get(r, 0))
        for c in self.changed_clusters:
            alloc = self.alloc_now[c]
            for r in self.alloc_total[c]:
                self.cluster_series[f"{c}/{r}"].set(t, alloc.get(r, 0))
        self.changed_clusters.clear()

    # ------------------------------------------------------------------ run

    def run(self) -> SimulationResult:
        for gid in range(len(self.trace.spec.jobs)):
            self._push_submit(gid, 0)
        heap = self.heap
        t = self.t0
        while heap:
            t, kind, a, b = heapq.heappop(heap)
            if kind == _FINISH:
                self._finish(t, a)
            else:
                self._submit(t, a, b)
            if self.fresh or (self.freed and self.unplaced_count):
                self._placement_pass(t)
            self._record(t)
        return self._result(t)

    def _result(self, end: float) -> SimulationResult:
        t0 = self.t0
        spec = self.trace.spec
        all_jobs = [j for js in self.jobs for j in js]
        groups = []
        for gid, g in enumerate(spec.jobs):
            js = self.jobs[gid]
            groups.append(_group_stats(g.name, g.namespace, g.count, js))
        groups.append(_group_stats("all", "", len(all_jobs), all_jobs))
        quota = []
        for node in self.admission.quota:
            res = {}
            for r in self.quota_res[node.name]:
                s = self.quota_series[f"{node.name}/{r}"]
                mx = node.max.get(r)
                avg = s.average(end)
                res[r] = {
                    "max": _units(r, mx) if mx is not None else None,
                    "averageUsage": _units(r, avg),
                    "peakUsage": _units(r, s.peak()),
                    "averageUtilisation": _r(avg / mx) if mx else None,
                    "peakUtilisation": _r(s.peak() / mx) if mx else None,
                }
            quota.append({"node": node.name, "queue": node.queue, "resources": res})
        clusters = []
        for c, tot in self.alloc_total.items():
            res = {}
            for r in sorted(tot, key=_res_order):
                s = self.cluster_series[f"{c}/{r}"]
                avg = s.average(end)
                res[r] = {
                    "allocatable": _units(r, tot[r]),
                    "averageAllocated": _units(r, avg),
                    "peakAllocated": _units(r, s.peak()),
                    "averageUtilisation": _r(avg / tot[r]),
                    "peakUtilisation": _r(s.peak() / tot[r]),
                }
            clusters.append({"cluster": c, "resources": res})
        queues = []
        for node_name, q in self.queue_of_node.items():
            s = self.qlen_series[q]
            queues.append({
                "queue": q, "node": node_name, "maxLength": int(s.peak()),
                "averageLength": _r(s.average(end), 3), "waitingAtEnd": self.qlen[q],
            })
        reasons = [
            {"reason": k, "jobs": v.jobs, "clusters": sorted(v.clusters), "example": v.example}
            for k, v in sorted(self.reasons.items(), key=lambda kv: (-kv[1].jobs, kv[0]))
        ]
        started = sum(1 for j in all_jobs if j.started is not None)
        admitted = sum(1 for j in all_jobs if j.admitted is not None)
        makespan = (self.last_finish - t0) if self.last_finish is not None else 0.0
        summary: dict[str, Any] = {
            "policy": self.policy.value,
            "starvationSeconds": spec.starvationSeconds,
            "seed": spec.seed,
            "start": _r(t0),
            "end": _r(end),
            "makespan": _r(makespan),
            "jobs": {
                "submitted": len(all_jobs),
                "admitted": admitted,
                "started": started,
                "completed": self.completed,
                "waitingForQuotaAtEnd": len(self.waiting),
                "unplacedAtEnd": self.unplaced_count,
            },
            "groups": groups,
            "queues": queues,
            "quota": quota,
            "clusters": clusters,
            "placementFailures": {
                "delayedJobs": self.delayed,
                "failedAttempts": self.failed_attempts,
                "reasons": reasons,
            },
        }
        series = {
            "queueLength": dict(self.qlen_series),
            "quotaUtilisation": {
                f"{name}/{r}": _scaled(self.quota_series[f"{name}/{r}"], 1.0 / mx)
                for name, res in self.quota_res.items()
                for r in res
                if (mx := self.admission.quota.nodes[name].max.get(r))
            },
            "clusterUtilisation": {
                f"{c}/{r}": _scaled(self.cluster_series[f"{c}/{r}"], 1.0 / tot[r])
                for c, tot in self.alloc_total.items()
                for r in sorted(tot, key=_res_order)
            },
        }
        return SimulationResult(summary, series, t0, end)


def _scaled(s: StepSeries, factor: float) -> StepSeries:
    out = StepSeries(s.times[0], s.values[0] * factor)
    out.times = list(s.times)
    out.values = [v * factor for v in s.values]
    return out


_Shape = tuple[tuple[tuple[str, int], ...], int, list[NodeCapacity]]


def _shapes(gang: Gang, snap: ClusterSnapshot) -> list[_Shape]:
    """The gang's groups of identical pods: (positive requests, pod count, nodes of
    ``snap`` they may use: schedulable, nodeSelector matched, hard taints tolerated)."""
    groups: dict[Any, list[Any]] = {}
    for pod in gang.pods:
        reqs = tuple(sorted((k, int(v)) for k, v in pod.requests.items() if v > 0))
        key = (reqs, tuple(sorted(pod.node_selector.items())), repr(pod.tolerations))
        entry = groups.get(key)
        if entry is None:
            nodes = [
                n for n in snap.nodes
                if not n.unschedulable
                and all(n.labels.get(k) == v for k, v in pod.node_selector.items())
                and not untolerated_taints(n.taints, pod.tolerations)
            ]
            groups[key] = [reqs, 1, nodes]
        else:
            entry[1] += 1
    return [(reqs, count, nodes) for reqs, count, nodes in groups.values()]


def _grouped(rejections: list[tuple[str, str]]) -> dict[str, tuple[list[str], str]]:
    """Normalised reason -> (clusters, first raw example)."""
    out: dict[str, tuple[list[str], str]] = {}
    for cluster, reason in rejections:
        key = normalise_reason(reason)
        entry = out.setdefault(key, ([], f"{cluster}: {reason}"))
        entry[0].append(cluster)
    return out


def _group_stats(name: str, namespace: str, count: int, jobs: list[_Job]) -> dict[str, Any]:
    adm = [j.admitted - j.submitted for j in jobs if j.admitted is not None]
    start = [j.started - j.submitted for j in jobs if j.started is not None]
    completed = sum(1 for j in jobs if j.started is not None and not j.binding)
    return {
        "group": name,
        "namespace": namespace,
        "jobs": count,
        "completed": completed,
        "timeToAdmission": _stats(adm),
        "timeToStart": _stats(start),
    }


def _res_order(name: str) -> tuple[int, str]:
    order = {R.CPU: 0, R.MEMORY: 1, R.GPU: 2, R.MAX_JOBS: 3, R.PODS: 4}
    return (order.get(name, 5), name)


def simulate(trace: Trace, policy: QueuePolicy | str | None = None) -> SimulationResult:
    """Replay ``trace`` (``policy`` overrides the trace's ``queuePolicy``)."""
    return _Simulator(trace, QueuePolicy(policy) if policy is not None else None).run()

