"""Benchmark: does the quota workflow's admission cost grow with the quota tree, and how
many bytes does a waiting job add to the state it carries across continue-as-new?

Pure core only (no Temporal): one quota-workflow task for one ``release`` message on trees
of 1,000, 200 and 6 leaves, its continue-as-new pack (``pack_next``) amortised over a
cycle of runs from one whole pack to the next (target: at 1,000 leaves at most 2x the
cost at 6), and the packed state per waiting job against Temporal's 512 KiB payload
warning (target: 100,000 waiting jobs within it). Method: BENCHMARKS.md "Bench methods"
and §6; figures: §6.

Run: ``python -m bench.admission [--parents 10] [--leaves 100] [--waiting-per-leaf 20]
[--repeats 300] [--bytes-jobs 100000]``. Last two lines: ``RESULT admission1000 <ratio>
(target 2.0)`` and ``RESULT admissionbytes <bytes per waiting job> (target 5.24)``.
"""

from __future__ import annotations

import base64
import random
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import typer

from bench.command import bench_app, help_text, run_command
from fleetq import resources as R
from fleetq.admission import (
    Admission,
    AdmissionState,
    Grant,
    QueuePolicy,
)
from fleetq.admission import AdmissionRequest as Request
from fleetq.client.connection import DATA_CONVERTER
from fleetq.messages import QuotaTreeInput
from fleetq.models import parse_tree
from fleetq.queue_views import QueueTable
from fleetq.queues import JobQueue, Key
from fleetq.quota_state import _frames, pack_next, pack_state, restore, unpack_state


def json_baseline(state: AdmissionState) -> str:
    """The baseline the compact format is measured against: the state's JSON,
    zlib-compressed and base64-encoded (the format before it)."""
    return base64.b64encode(zlib.compress(state.model_dump_json().encode(), 6)).decode()

TARGET = 2.0
#: Temporal's blob size limits (server dynamic config ``limit.blobSize.error`` / ``.warn``)
BLOB_ERROR = 2 * 1024 * 1024
BLOB_WARN = 512 * 1024
#: the documented warning (docs.temporal.io/self-hosted-guide/defaults)
BLOB_WARN_DOCS = 256 * 1024
HISTORY_SIZE_ERROR = 50 * 1024 * 1024
#: history events of a quota-workflow task that takes one release and sends one grant:
#: workflow task scheduled, started, completed; update accepted, completed; signal
#: external initiated, external signaled
EVENTS_PER_TASK = 7
T0 = 1_795_000_000.0  # 2026-11-18, a workflow.now() timestamp
GI = (1 << 30) * R.MILLI
LEAF_MIN = {R.CPU: 64 * R.MILLI, R.GPU: 8 * R.MILLI}
BORROW = 4  # a leaf's max is this many times its min
#: job request shapes (milli-units) and how often each is submitted
SHAPES: list[tuple[dict[str, int], float]] = [
    ({R.CPU: 4000, R.MEMORY: 16 * GI, R.MAX_JOBS: R.MILLI}, 0.40),
    ({R.CPU: 8000, R.MEMORY: 64 * GI, R.GPU: 1000, R.MAX_JOBS: R.MILLI}, 0.35),
    ({R.CPU: 64000, R.MEMORY: 512 * GI, R.GPU: 8000, R.MAX_JOBS: R.MILLI}, 0.20),
    ({R.CPU: 128000, R.MEMORY: 1024 * GI, R.GPU: 16000, R.MAX_JOBS: R.MILLI}, 0.05),
]
PRIORITIES = [(0, 0.60), (10, 0.25), (100, 0.12), (1000, 0.03)]
MODELS = ["llama", "mistral", "qwen2", "gemma", "gpt-neox", "t5", "whisper", "vit", "bert"]
SIZES = ["1b", "3b", "7b", "8b", "13b", "34b", "70b", "base", "large"]
TASKS = ["finetune", "pretrain", "eval", "sweep", "distill", "dpo", "sft", "lora"]
LRS = ["1e-4", "2e-5", "3e-4", "5e-5", "1e-5", "6e-4"]
KUBE_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


def tree_doc(parents: int, leaves: int, name: str = "fleet") -> dict[str, Any]:
    """An ElasticQuotaTree manifest: ``parents`` x ``leaves`` leaves, each guaranteeing
    :data:`LEAF_MIN` and borrowing up to :data:`BORROW` times it, parents up to 1.5x their
    guarantee, the root exactly the sum of all guarantees."""

    def q(res: dict[str, int], times: float) -> dict[str, int]:
        return {k: int(v * times) // R.MILLI for k, v in res.items()}

    children = []
    for p in range(parents):
        org = f"org-{p:02d}"
        teams = [
            {"name": f"{org}-team-{i:03d}", "namespaces": [f"{org}-team-{i:03d}"],
             "min": q(LEAF_MIN, 1), "max": q(LEAF_MIN, BORROW)}
            for i in range(leaves)
        ]
        children.append({"name": org, "min": q(LEAF_MIN, leaves),
                         "max": q(LEAF_MIN, leaves * 1.5), "children": teams})
    total = q(LEAF_MIN, parents * leaves)
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
        "kind": "ElasticQuotaTree",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"root": {"name": "root", "min": total, "max": total, "children": children}},
    }


def namespaces(doc: dict[str, Any]) -> list[str]:
    return [ns for org in doc["spec"]["root"]["children"] for t in org["children"]
            for ns in t["namespaces"]]


class JobSource:
    """Realistic, reproducible job submissions: names as ML teams write them, four
    request shapes, four priorities, submission times with microseconds."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = T0
        self.count = 0
        self._shapes = [s for s, _ in SHAPES]
        self._shape_w = [w for _, w in SHAPES]
        self._prios = [p for p, _ in PRIORITIES]
        self._prio_w = [w for _, w in PRIORITIES]

    def name(self) -> str:
        r = self.rng
        day = 20261101 + r.randrange(30)
        base = (f"{r.choice(MODELS)}-{r.choice(TASKS)}-{r.choice(SIZES)}-lr{r.choice(LRS)}"
                f"-{day}")
        if r.random() < 0.5:
            return f"{base}-{r.randrange(10000):04d}"
        return f"{base}-{''.join(r.choices(KUBE_SUFFIX, k=5))}"

    def job(self, namespace: str) -> Request:
        self.count += 1
        self.now += self.rng.uniform(0.001, 0.05)
        return Request(
            job_id=f"pytorchjob/{namespace}/{self.name()}-{self.count}",
            namespace=namespace,
            priority=self.rng.choices(self._prios, self._prio_w)[0],
            request=self.rng.choices(self._shapes, self._shape_w)[0],
            submitted_at=round(self.now, 6),
        )


class CountingAdmission(Admission):
    """An :class:`Admission` that counts its queue checks (one per ``_pick``: whether and
    what a queue could admit now)."""

    checks = 0

    def _pick(
        self,
        q: JobQueue,
        nofit: dict[tuple[str, int], Any],
        blockers: list[Any] | None = None,
    ) -> tuple[Key, int] | None:
        self.checks += 1
        return super()._pick(q, nofit, blockers)


@dataclass
class Fleet:
    """One tree under load: an admission with every leaf backlogged, the jobs holding
    quota (to release one at random) and a job source to refill the backlog."""

    label: str
    leaves: int
    admission: Admission
    source: JobSource
    held: list[str] = field(default_factory=list)
    now: float = T0
    table: QueueTable = field(default_factory=QueueTable)

    def add_grants(self, job_ids: Sequence[str]) -> None:
        self.held.extend(job_ids)

    def pick_holder(self) -> str:
        """Remove and return a random holder (constant time)."""
        i = self.source.rng.randrange(len(self.held))
        self.held[i], self.held[-1] = self.held[-1], self.held[i]
        return self.held.pop()

    def refill(self, granted: Sequence[str]) -> None:
        """A new job in each queue a grant left, so the backlog stays (untimed)."""
        for job_id in granted:
            ns = job_id.split("/")[1]
            res = self.admission.enqueue(self.source.job(ns), self.source.now)
            if isinstance(res, Grant):  # admitted at once
                self.held.append(res.job_id)


def build_fleet(label: str, parents: int, leaves: int, waiting_per_leaf: int, seed: int,
                cls: type[Admission] = Admission) -> Fleet:
    """Fill the tree round-robin until the root is full, then queue
    ``waiting_per_leaf`` more jobs in every leaf."""
    doc = tree_doc(parents, leaves)
    adm = cls(parse_tree(doc), QueuePolicy.PRIORITY, 600)
    fleet = Fleet(label, parents * leaves, adm, JobSource(seed))
    spaces = namespaces(doc)
    full = False
    while not full:
        full = True
        for ns in spaces:
            res = adm.enqueue(fleet.source.job(ns), fleet.source.now)
            if not isinstance(res, Grant):
                continue
            fleet.held.append(res.job_id)
            full = False
    for _ in range(waiting_per_leaf):
        for ns in spaces:
            adm.enqueue(fleet.source.job(ns), fleet.source.now)
    fleet.now = fleet.source.now
    fleet.add_grants([g.job_id for g in adm.schedule(fleet.now)])
    return fleet


def publish_details(adm: Admission, table: QueueTable) -> int:
    """What the quota workflow computes after every task (mirrors
    ``QuotaTreeWorkflow._publish_details``, which redraws only the rows of the nodes
    that changed with a :class:`~fleetq.queue_views.QueueTable`, and the run loop's holder
    count)."""
    admitted, waiting = adm.counts()
    lengths = table.update(adm)
    lines = [f"{admitted} admitted, {waiting} waiting", "", *table.lines()]
    lines.append(str(len(adm.preemptors())))
    return len("\n".join(lines)) + len(lengths) + adm.counts()[0]


@dataclass
class TaskTimes:
    """Thread CPU seconds of each measured task, by part."""

    release_schedule: list[float] = field(default_factory=list)
    details: list[float] = field(default_factory=list)
    grants: int = 0


def one_task(fleet: Fleet, times: TaskTimes) -> None:
    adm = fleet.admission
    job_id = fleet.pick_holder()
    fleet.now += 0.5
    clock = time.thread_time
    t0 = clock()
    adm.release(job_id)
    grants = adm.schedule(fleet.now)
    t1 = clock()
    publish_details(adm, fleet.table)
    t2 = clock()
    times.release_schedule.append(t1 - t0)
    times.details.append(t2 - t1)
    times.grants += len(grants)
    granted = [g.job_id for g in grants]
    fleet.add_grants(granted)
    fleet.refill(granted)


@dataclass
class PackCycle:
    """Continue-as-new packs from one whole pack to the next (``pack_next``: the carried
    state plus a delta per run until the deltas pass ``DELTA_SHARE``)."""

    runs: int = 0
    pack_s: float = 0.0  # thread CPU of every pack in the cycle, the closing whole one too
    restore_s: list[float] = field(default_factory=list)
    max_bytes: int = 0
    closed: bool = False  # ended with a whole pack (else one is added, measured apart)


def pack_cycle(fleet: Fleet, doc: dict[str, Any], tasks_per_run: int,
               max_runs: int) -> PackCycle:
    """Runs of ``tasks_per_run`` tasks (untimed), each ended as the quota workflow ends
    it (``pack_next``, timed) and the next started from what it carried (``restore``,
    timed apart), from a whole pack until the next whole pack (or ``max_runs``)."""
    carried = pack_state(fleet.admission.to_state(), doc)
    fleet.admission, manifest = restore(carried)
    out = PackCycle()
    while out.runs < max_runs and not out.closed:
        for _ in range(tasks_per_run):
            if not fleet.held:  # (a small tree's backlog can run dry over many runs)
                break
            one_task(fleet, TaskTimes())
        t0 = time.thread_time()
        carried = pack_next(fleet.admission, manifest)
        t1 = time.thread_time()
        fleet.admission, manifest = restore(carried)
        out.restore_s.append(time.thread_time() - t1)
        out.runs += 1
        out.pack_s += t1 - t0
        out.max_bytes = max(out.max_bytes, len(carried))
        out.closed = len(_frames(carried)) == 1
    if not out.closed:
        out.pack_s += median_cpu(partial(packed_of, fleet.admission, doc), 3)
    return out


def packed_of(adm: Admission, doc: dict[str, Any]) -> bytes:
    """What continue-as-new carries (``workflows/quota_tree.py``)."""
    return pack_state(adm.to_state(), doc)


def rebuilt(packed: bytes) -> Admission:
    """What the next run starts from."""
    return Admission.from_state(unpack_state(packed))


def median_cpu(fn: Callable[[], object], repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        out.append(time.thread_time() - t0)
    return statistics.median(out)


@dataclass
class SizeResult:
    label: str
    leaves: int
    nodes: int
    waiting: int
    admitted: int
    release_schedule_s: float
    details_s: float
    pack_s: float
    unpack_s: float
    packed_bytes: int
    grants_per_task: float
    checks_per_release: float
    nonempty_queues: int
    cycle: PackCycle

    @property
    def run_pack_s(self) -> float:
        """Continue-as-new pack CPU per run (``pack_next``, over a whole cycle)."""
        return self.cycle.pack_s / self.cycle.runs

    def task_s(self, tasks_per_run: int) -> float:
        return self.release_schedule_s + self.details_s + self.run_pack_s / tasks_per_run


def queue_checks(label: str, parents: int, leaves: int, waiting: int, seed: int,
                 tasks: int) -> tuple[float, int]:
    """Mean queue checks per release over ``tasks`` tasks, and the non-empty queues."""
    fleet = build_fleet(label, parents, leaves, waiting, seed, CountingAdmission)
    adm = fleet.admission
    assert isinstance(adm, CountingAdmission)
    nonempty = sum(1 for q in adm.queues() if q.length)
    checks = 0
    for _ in range(tasks):
        job_id = fleet.pick_holder()
        fleet.now += 0.5
        adm.release(job_id)
        before = adm.checks
        granted = [g.job_id for g in adm.schedule(fleet.now)]
        checks += adm.checks - before
        fleet.add_grants(granted)
        fleet.refill(granted)
    return checks / tasks, nonempty


def measure_sizes(shapes: list[tuple[str, int, int]], waiting: int, repeats: int,
                  seed: int, tasks_per_run: int, max_runs: int) -> list[SizeResult]:
    fleets = [build_fleet(label, p, leaves, waiting, seed) for label, p, leaves in shapes]
    times = [TaskTimes() for _ in fleets]
    for _ in range(3):  # warm up
        for fleet in fleets:
            one_task(fleet, TaskTimes())
    for _ in range(repeats):
        for fleet, t in zip(fleets, times, strict=True):
            one_task(fleet, t)
    out = []
    for (label, p, leaves), fleet, t in zip(shapes, fleets, times, strict=True):
        adm = fleet.admission
        doc = tree_doc(p, leaves)
        packed = packed_of(adm, doc)
        pack_s = median_cpu(partial(packed_of, adm, doc), 5)
        unpack_s = median_cpu(partial(rebuilt, packed), 5)
        admitted, waiting_now = adm.counts()
        checks, nonempty = queue_checks(label, p, leaves, waiting, seed, min(repeats, 50))
        cycle = pack_cycle(build_fleet(label, p, leaves, waiting, seed), doc, tasks_per_run,
                           max_runs)
        out.append(SizeResult(
            label=label, leaves=p * leaves, nodes=1 + p + p * leaves, waiting=waiting_now,
            admitted=admitted,
            release_schedule_s=statistics.median(t.release_schedule),
            details_s=statistics.median(t.details),
            pack_s=pack_s, unpack_s=unpack_s, packed_bytes=len(packed),
            grants_per_task=t.grants / repeats, checks_per_release=checks,
            nonempty_queues=nonempty, cycle=cycle,
        ))
    return out


@dataclass
class BytesResult:
    waiting: int
    skipped: int
    raw_json: int
    packed: int  # the compact state with the manifest (pack_state)
    packed_empty: int
    packed_shuffled: int  # the same jobs, their namespaces in random order
    payload: int  # the whole continue-as-new input, compact
    old_packed: int  # the text format before (json_baseline)
    old_packed_empty: int
    old_payload: int
    pack_s: float
    unpack_s: float
    old_pack_s: float
    round_trip: bool

    @property
    def per_job(self) -> float:
        return (self.packed - self.packed_empty) / self.waiting

    @property
    def per_job_shuffled(self) -> float:
        return (self.packed_shuffled - self.packed_empty) / self.waiting

    @property
    def old_per_job(self) -> float:
        return (self.old_packed - self.old_packed_empty) / self.waiting


def payload_size(*values: Any) -> int:
    """Bytes of ``values`` as continue-as-new arguments (payloads with their metadata)."""
    payloads = DATA_CONVERTER.payload_converter.to_payloads(list(values))
    return sum(p.ByteSize() for p in payloads)


def measure_bytes(parents: int, leaves: int, jobs: int, seed: int) -> BytesResult:
    """``jobs`` waiting jobs (spread evenly over the leaves) in the tree, after some
    scheduling; sizes of what continue-as-new carries."""
    per_leaf = max(1, -(-jobs // (parents * leaves)))
    fleet = build_fleet("bytes", parents, leaves, per_leaf, seed)
    adm = fleet.admission
    for _ in range(min(500, jobs // 10 + 1)):  # some grants past skipped jobs
        one_task(fleet, TaskTimes())
    while adm.counts()[1] > jobs:  # exactly ``jobs`` waiting
        adm.cancel(adm.waiting()[-1])
    state = adm.to_state()
    doc = tree_doc(parents, leaves)
    raw = state.model_dump_json().encode()
    packed = pack_state(state, doc)
    empty = state.model_copy(update={"w": [], "wp": {}})
    # the same jobs at the same times, their namespaces (and names) in random order
    order = random.Random(seed).sample(range(len(state.w)), len(state.w))
    shuffled = state.model_copy(update={"w": [
        (state.w[o][0], state.w[o][1], state.w[o][2], w[3], state.w[o][4], w[5])
        for w, o in zip(state.w, order, strict=True)
    ]})
    settings = QuotaTreeInput(generation=1)
    old = json_baseline(state)
    back = unpack_state(packed)
    return BytesResult(
        waiting=len(state.w),
        skipped=sum(1 for w in state.w if w[5] is not None),
        raw_json=len(raw),
        packed=len(packed),
        packed_empty=len(pack_state(empty, doc)),
        packed_shuffled=len(pack_state(shuffled, doc)),
        payload=payload_size(settings, packed),
        old_packed=len(old),
        old_packed_empty=len(json_baseline(empty)),
        old_payload=payload_size(QuotaTreeInput(tree=doc, generation=1), old),
        pack_s=median_cpu(partial(packed_of, adm, doc), 3),
        unpack_s=median_cpu(partial(rebuilt, packed), 3),
        old_pack_s=median_cpu(lambda: json_baseline(adm.to_state()), 3),
        round_trip=back == AdmissionState.model_validate_json(raw),
    )


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


@dataclass(frozen=True)
class Options:
    """``fleetq bench admission``'s options as parsed (the defaults are the command's)."""

    parents: int
    leaves: int
    waiting_per_leaf: int
    repeats: int
    bytes_jobs: int
    seed: int
    max_runs: int = 40


def run(args: Options) -> int:
    tasks_per_run = QuotaTreeInput().max_history_events // EVENTS_PER_TASK
    shapes = [("small", 2, 3), ("mid", 10, 20), ("large", args.parents, args.leaves)]
    t_start = time.process_time()
    sizes = measure_sizes(shapes, args.waiting_per_leaf, args.repeats, args.seed,
                          tasks_per_run, args.max_runs)
    small, large = sizes[0], sizes[-1]
    print(f"tasks: one release + schedule + details listing each, thread CPU median of "
          f"{args.repeats}; continue-as-new pack (pack_next) per run over a cycle of runs "
          f"from one whole pack to the next, amortised over {tasks_per_run} tasks per run "
          f"({QuotaTreeInput().max_history_events} events / {EVENTS_PER_TASK} per task)")
    print("| tree | leaves | waiting | admitted | release+schedule | details listing | "
          "whole pack | pack per run (runs per cycle) | carried, largest | restore "
          "(median over the cycle) | unpack whole | task | grants/task | "
          "queue checks/release | non-empty queues |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in sizes:
        c = s.cycle
        print(f"| {s.label} | {s.leaves:,} | {s.waiting:,} | {s.admitted:,} | "
              f"{s.release_schedule_s * 1e3:.3f} ms | {s.details_s * 1e3:.3f} ms | "
              f"{s.pack_s * 1e3:.1f} ms | {s.run_pack_s * 1e3:.1f} ms ({c.runs}"
              f"{'' if c.closed else '+, whole pack added'}) | {kib(c.max_bytes)} "
              f"(whole {kib(s.packed_bytes)}) | "
              f"{statistics.median(c.restore_s) * 1e3:.1f} ms | {s.unpack_s * 1e3:.1f} ms | "
              f"{s.task_s(tasks_per_run) * 1e3:.3f} ms | {s.grants_per_task:.2f} | "
              f"{s.checks_per_release:.1f} | {s.nonempty_queues:,} |")
    core_ratio = large.release_schedule_s / small.release_schedule_s
    no_details = ((large.release_schedule_s + large.run_pack_s / tasks_per_run)
                  / (small.release_schedule_s + small.run_pack_s / tasks_per_run))
    ratio = large.task_s(tasks_per_run) / small.task_s(tasks_per_run)
    print(f"{large.leaves:,} leaves vs {small.leaves}: release+schedule {core_ratio:.1f}x, "
          f"+ amortised pack {no_details:.1f}x, whole task (with the details listing) "
          f"{ratio:.1f}x")
    print(f"pack at continue-as-new, per run: {large.run_pack_s * 1e3:.1f} ms at "
          f"{large.leaves:,} leaves (a whole pack {large.pack_s * 1e3:.1f} ms, "
          f"{large.packed_bytes:,} bytes), {small.run_pack_s * 1e3:.2f} ms at {small.leaves}")
    print(f"CPU for the task measurements: {time.process_time() - t_start:.1f} s")

    b = measure_bytes(args.parents, args.leaves, args.bytes_jobs, args.seed + 1)
    fixed = b.payload - b.packed + b.packed_empty
    jobs_at = {
        "512 KiB warning": (BLOB_WARN - fixed) / b.per_job,
        "2 MiB error": (BLOB_ERROR - fixed) / b.per_job,
    }
    old_fixed = b.old_payload - b.old_packed + b.old_packed_empty
    print(f"{b.waiting:,} waiting jobs in the {large.leaves:,}-leaf tree ({b.skipped:,} with "
          f"a skip time): state JSON {kib(b.raw_json)} ({b.raw_json / b.waiting:.1f} B/job)")
    print(f"compact (pack_state, with the manifest): {kib(b.packed)} "
          f"({b.packed / b.waiting:.1f} B/job; {b.per_job:.2f} B per waiting job over the "
          f"same state with none waiting, {kib(b.packed_empty)}); namespaces in random "
          f"order: {b.per_job_shuffled:.2f} B per waiting job")
    print(f"text format before (json_baseline): {kib(b.old_packed)} "
          f"({b.old_per_job:.2f} B per waiting job; {kib(b.old_packed_empty)} with none "
          f"waiting); its continue-as-new input with the manifest beside it "
          f"{kib(b.old_payload)} ({kib(old_fixed)} with none waiting), "
          f"{b.old_payload / BLOB_ERROR:.0%} of the 2 MiB blob error limit")
    print(f"continue-as-new input {kib(b.payload)} ({kib(fixed)} with none waiting): "
          f"{b.payload / BLOB_ERROR:.0%} of the 2 MiB "
          f"blob error limit, {b.payload / BLOB_WARN:.0%} of the 512 KiB warning "
          f"({b.payload / BLOB_WARN_DOCS:.0%} of the documented 256 KB); two copies per run "
          f"(started and continued-as-new events) are {2 * b.payload / HISTORY_SIZE_ERROR:.1%} "
          f"of the 50 MiB history limit")
    print("waiting jobs at which the input reaches: " + ", ".join(
        f"{k} {v:,.0f}" for k, v in jobs_at.items()) + " (namespaces in random order: "
        + ", ".join(f"{k} {(lim - fixed) / b.per_job_shuffled:,.0f}" for k, lim in
                    (("512 KiB", BLOB_WARN), ("2 MiB", BLOB_ERROR))) + ")")
    print(f"pack {b.pack_s * 1e3:.0f} ms (text format {b.old_pack_s * 1e3:.0f} ms), "
          f"unpack + rebuild {b.unpack_s * 1e3:.0f} ms thread CPU; state round trip "
          f"equal: {b.round_trip}")
    print(f"RESULT admission1000 {ratio:.2f} (target {TARGET})")
    print(f"RESULT admissionbytes {b.per_job:.2f} (target {BLOB_WARN / args.bytes_jobs:.2f})")
    return 0 if b.round_trip else 1


app = bench_app()


@app.command(help=help_text(__doc__))
def command(
    parents: int = typer.Option(10, "--parents", min=1, help="parents of the large tree"),
    leaves: int = typer.Option(100, "--leaves", min=1, help="leaves per parent, large tree"),
    waiting_per_leaf: int = typer.Option(20, "--waiting-per-leaf", min=1),
    repeats: int = typer.Option(300, "--repeats", min=1, help="tasks per tree (median of)"),
    bytes_jobs: int = typer.Option(100_000, "--bytes-jobs", min=1,
                                   help="waiting jobs whose packed size is measured"),
    seed: int = typer.Option(19, "--seed"),
    max_runs: int = typer.Option(40, "--max-runs", min=1,
                                 help="runs of a pack cycle at most (whole pack to whole)"),
) -> None:
    raise typer.Exit(run(Options(parents, leaves, waiting_per_leaf, repeats, bytes_jobs, seed,
                                 max_runs)))


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(app, argv, "python -m bench.admission")


if __name__ == "__main__":
    raise SystemExit(main())
