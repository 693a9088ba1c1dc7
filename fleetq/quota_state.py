"""The quota workflow's continue-as-new codec: an :class:`AdmissionState` and the tree's
manifest as one compact ``binary/plain`` payload.

Columnar (job ids split into token columns, integers as the narrowest arrays, repeated
strings interned) and LZMA-compressed, so 100,000 waiting jobs stay under half of
Temporal's 2 MiB payload limit. A run carries the bytes it was restored from unchanged
plus a delta of what changed in it (:func:`pack_next`), so its pack costs what changed,
not the backlog; a whole pack again once the deltas outgrow it (BENCHMARKS.md, section
6). Deterministic: it runs inside the workflow. One format until the first release
(docs/decisions/001-one-baseline.md).
"""

from __future__ import annotations

import json
import lzma
import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate, pairwise
from typing import Any

from fleetq.admission import (
    _DEFAULT_HOLDER,
    DEFAULT_GRACE_SECONDS,
    Admission,
    AdmissionState,
    ParkedJob,
    PendingPlan,
    QueuePolicy,
    StateDelta,
)

#: the first bytes of a carried state (fleetq admission, format 4: a whole state, then
#: zero or more deltas, each an 8-byte little-endian length and an LZMA blob)
_MAGIC = b"FQA4"
#: :func:`pack_next` packs the whole state anew once the deltas carried would pass this
#: share of the whole state's packed bytes
DELTA_SHARE = 1.0
#: ... or the carried bytes this many (half of Temporal's 2 MiB payload error limit)
CARRIED_LIMIT = 1024 * 1024
#: LZMA2 settings of :func:`pack_state`. Measured on the 100,000-job state of ``fleetq
#: bench admission`` with an earlier column layout (whole pack, thread CPU): preset 1,
#: 11.1 B per waiting job in ~0.8 s; preset 1 in the normal (optimal parsing) mode,
#: 9.7 B in ~1.1 s; preset 6, 9.6 B in ~1.6 s. The pack runs inside the continue-as-new
#: workflow task, which the SDK fails as deadlocked after 2 s without yielding: the
#: fastest wins.
_LZMA_FILTERS: list[dict[str, int]] = [{"id": lzma.FILTER_LZMA2, "preset": 1}]
#: ... of a delta (:func:`pack_next`, tens of KiB): a smaller dictionary sets up faster
_DELTA_FILTERS: list[dict[str, int]] = [
    {"id": lzma.FILTER_LZMA2, "preset": 1, "dict_size": 1 << 18}
]
#: job ids are split into tokens at this character, one column per token position
_TOKEN_SEP = "-"
#: (priority, preemptible, grace_seconds) / (preemptible, grace_seconds) of a job that
#: says nothing, index 0 of the packed policy tables
_DEFAULT_WAITER = (True, DEFAULT_GRACE_SECONDS)


class _Columns:
    """Sections of a packed state: integer columns as little-endian arrays of the
    narrowest type that holds them, string columns interned into a table when they repeat
    (token positions of job ids: model names, dates) or as JSON otherwise. Every column is
    described by a small JSON descriptor in the header."""

    def __init__(self) -> None:
        self.sections: list[bytes] = []

    def _add(self, data: bytes) -> int:
        self.sections.append(data)
        return len(self.sections) - 1

    def ints(self, values: list[int]) -> list[Any]:
        lo, hi = min(values, default=0), max(values, default=0)
        for code in "bhiq":
            bits = 8 * array(code).itemsize - 1
            if -(1 << bits) <= lo and hi < (1 << bits):
                return ["a", code, self._add(_little_endian(array(code, values)))]
        return ["j", self._add(json.dumps(values).encode())]  # beyond 64 bits

    def strs(self, values: Sequence[str]) -> list[Any]:
        distinct = dict.fromkeys(values)
        if len(distinct) * 4 <= len(values):
            table = {v: i for i, v in enumerate(distinct)}
            return ["t", list(table), self.ints(list(map(table.__getitem__, values)))]
        return ["s", self._add(json.dumps(values, separators=(",", ":")).encode())]

    def job_ids(self, ids: list[str], ns: list[int]) -> list[Any]:
        """Ids as (prefix up to the last ``/``, namespace) groups, then the rest of each
        id split into tokens; ids of the same number of tokens are packed together, one
        column per token position.

        Built from strings and flat lists only, never a tuple or list per id: the pack
        runs over every waiting job, and containers per job (tracked by the garbage
        collector) made it pay for collections of the whole heap, more than half of its
        CPU in ``fleetq bench admission``."""
        prefixes = [job_id[: job_id.rfind("/") + 1] for job_id in ids]
        tails = [job_id[len(p):] for job_id, p in zip(ids, prefixes, strict=True)]
        table: dict[str, int] = {}
        groups: list[list[Any]] = []
        group_col: list[int] = []
        for prefix, n in zip(prefixes, ns, strict=True):
            key = f"{n}/{prefix}"
            g = table.get(key)
            if g is None:
                g = table[key] = len(groups)
                groups.append([prefix, n])
            group_col.append(g)
        widths = [t.count(_TOKEN_SEP) + 1 for t in tails]
        order = list(dict.fromkeys(widths))
        out = [groups, self.ints(group_col), self.ints(widths)]
        columns = []
        for width in order:
            same = tails if len(order) == 1 else [
                t for t, w in zip(tails, widths, strict=True) if w == width
            ]
            flat = _TOKEN_SEP.join(same).split(_TOKEN_SEP)
            columns.append([width, [self.strs(flat[i::width]) for i in range(width)]])
        return [*out, columns]


class _Sections:
    """Reads what :class:`_Columns` wrote."""

    def __init__(self, sections: list[bytes]) -> None:
        self.sections = sections

    def ints(self, d: list[Any]) -> list[int]:
        if d[0] == "j":
            return list(json.loads(self.sections[d[1]]))
        col = array(d[1])
        col.frombytes(self.sections[d[2]])
        if sys.byteorder == "big":
            col.byteswap()
        return col.tolist()

    def strs(self, d: list[Any]) -> list[str]:
        if d[0] == "t":
            table: list[str] = d[1]
            return [table[i] for i in self.ints(d[2])]
        return list(json.loads(self.sections[d[1]]))

    def job_ids(self, d: list[Any]) -> tuple[list[str], list[int]]:
        groups: list[list[Any]] = d[0]
        group_col = self.ints(d[1])
        by_width = {
            w: iter(list(map(_TOKEN_SEP.join, zip(*(self.strs(c) for c in cols), strict=True))))
            for w, cols in d[3]
        }
        tails = [next(by_width[w]) for w in self.ints(d[2])]
        ids = [groups[g][0] + t for g, t in zip(group_col, tails, strict=True)]
        return ids, [groups[g][1] for g in group_col]


def _micros(times: list[float]) -> list[int] | None:
    """``times`` as whole microseconds when every one is exactly that, else None."""
    if not all(abs(t) < 1e12 for t in times):  # (about 31,700 years: int64 microseconds)
        return None
    us = [round(t * 1_000_000) for t in times]
    if all(u / 1_000_000 == t for u, t in zip(us, times, strict=True)):
        return us
    return None


def pack_state(state: AdmissionState, manifest: dict[str, Any] | None = None) -> bytes:
    """``state`` and the tree's ``manifest`` packed whole (see :func:`_pack_body`): a
    carried state with no delta after it."""
    return _MAGIC + _frame(_pack_body(state, manifest))


def pack_next(
    admission: Admission, manifest: dict[str, Any] | None = None, share: float = DELTA_SHARE
) -> bytes:
    """What the quota workflow carries into its next run: the state it was restored from
    (its packed bytes, unchanged) with one more frame, what changed since
    (:meth:`Admission.to_delta`), so the pack costs what changed in the run, not every
    waiting job; or the whole state packed anew (:func:`pack_state`) when there is no
    journal (a new workflow, a new tree), the tree manifest is not the carried one, or
    the deltas would add more than ``share`` of the whole state's bytes or
    pass :data:`CARRIED_LIMIT` (so a run carries at most that much more than a whole
    pack would, and the next run replays a bounded chain)."""
    journal = admission.journal
    if (
        journal is None
        or (manifest is not journal.manifest and manifest != journal.manifest)
        or journal.changes() > share * journal.restored()  # (its delta alone is too big)
    ):
        return pack_state(admission.to_state(), manifest)
    delta = admission.to_delta()
    assert delta is not None
    frames = _frames(journal.carried)
    extra = {
        "wg": _gaps(delta.w_gone),
        "hg": _gaps(delta.h_gone),
        "hr": delta.h_ref,
        "sk": [[i, t] for i, t in delta.skips],
    }
    body = _frame(_pack_body(delta.part, None, extra, _DELTA_FILTERS))
    deltas = len(journal.carried) - len(_MAGIC) - len(frames[0]) - 8 + len(body)
    if deltas > share * len(frames[0]) or len(journal.carried) + len(body) > CARRIED_LIMIT:
        return pack_state(admission.to_state(), manifest)
    return journal.carried + body


def restore(carried: bytes) -> tuple[Admission, dict[str, Any] | None]:
    """The :class:`Admission` a run continues with from what the previous run carried
    (:func:`pack_next`), journalling from there, and the tree manifest carried."""
    state, manifest = unpack_carried(carried)
    admission = Admission.from_state(state)
    admission.start_journal(carried, manifest)
    return admission, manifest


def _gaps(positions: list[int]) -> list[int]:
    """Sorted positions as the first and the differences (small numbers pack small)."""
    return [b - a for a, b in pairwise([0, *positions])]


def _frame(blob: bytes) -> bytes:
    return len(blob).to_bytes(8, "little") + blob


def _frames(packed: bytes) -> list[bytes]:
    """The LZMA blobs of a carried state: the whole state, then each delta."""
    if not packed.startswith(_MAGIC):
        raise ValueError("not a packed admission state (format 4)")
    out = []
    at = len(_MAGIC)
    while at < len(packed):
        size = int.from_bytes(packed[at:at + 8], "little")
        out.append(packed[at + 8:at + 8 + size])
        at += 8 + size
    return out


def _pack_body(
    state: AdmissionState,
    manifest: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
    filters: list[dict[str, int]] = _LZMA_FILTERS,
) -> bytes:
    """``state`` (and the tree's ``manifest`` as the quota workflow last applied it, so the
    continue-as-new input carries the tree only here) as compact bytes, for the
    continue-as-new input as a ``binary/plain`` payload (no JSON, no base64).

    Columnar: waiting jobs' ids grouped by their prefix up to the last ``/``
    (``pytorchjob/<namespace>/``) and namespace, the rest split at ``-`` into token
    columns (ids of the same number of tokens together), repeated tokens interned;
    priorities, shapes and the jobs' preemption policies (interned) as integer arrays;
    submission times as microsecond deltas in enqueue order; then LZMA. Measured
    (``fleetq bench admission``, BENCHMARKS.md section 6), 100,000 waiting jobs with
    realistic ids in a 1,000-leaf tree: 9.7 B per waiting job (13.2 B when their
    namespaces come in random order), the whole continue-as-new input 0.96 MiB: under
    half of Temporal's 2 MiB blob error limit, but not under its 512 KiB warning, which
    it reaches at ~37,000-50,000 waiting jobs (the ids' random parts and the submission
    times alone carry ~7 B per job). The price is CPU: ~0.95 s to pack 100,000 waiting
    jobs. Deterministic; :func:`unpack_state` / :func:`unpack_carried` read it."""
    cols = _Columns()
    times = [w[3] for w in state.w]
    micros = _micros(times)
    if micros is None:
        time_col = ["d", cols._add(_little_endian(array("d", times)))]
    else:
        time_col = ["u", micros[0] if micros else 0,
                    cols.ints([b - a for a, b in pairwise(micros)])]
    wpol: dict[tuple[bool, int], int] = {_DEFAULT_WAITER: 0}
    hpol: dict[tuple[int, bool, int], int] = {_DEFAULT_HOLDER: 0}
    w_ids = {w[0] for w in state.w}
    h_ids = {h[0] for h in state.h}
    header: dict[str, Any] = {
        "tree": state.tree,
        "manifest": manifest,
        "policy": state.policy.value,
        "starve": state.starve,
        "shapes": state.shapes,
        "ns": state.ns,
        "p": [plan.model_dump(mode="json") for plan in state.p],
        "d": [plan.model_dump(mode="json") for plan in state.d],
        "dirty": state.dirty,
        "x": state.x,
        "k": [job.model_dump(mode="json") for job in state.k],
        "w": {
            "ids": cols.job_ids([w[0] for w in state.w], [w[1] for w in state.w]),
            "prio": cols.ints([w[2] for w in state.w]),
            "time": time_col,
            "shape": cols.ints([w[4] for w in state.w]),
            "skip": [[i, w[5]] for i, w in enumerate(state.w) if w[5] is not None],
            "pol": cols.ints([
                wpol.setdefault(state.wp.get(w[0], _DEFAULT_WAITER), len(wpol))
                for w in state.w
            ]),
        },
        "h": {
            "ids": cols.job_ids([h[0] for h in state.h], [h[1] for h in state.h]),
            "shape": cols.ints([h[2] for h in state.h]),
            "pol": cols.ints([
                hpol.setdefault(state.hp.get(h[0], _DEFAULT_HOLDER), len(hpol))
                for h in state.h
            ]),
        },
        "wpol": [list(p) for p in wpol],
        "hpol": [list(p) for p in hpol],
        # policies of jobs that are neither waiting nor holding (never written by
        # ``to_state``; kept so that unpacking gives back exactly what was packed)
        "wpx": {k: list(v) for k, v in state.wp.items() if k not in w_ids},
        "hpx": {k: list(v) for k, v in state.hp.items() if k not in h_ids},
        **(extra or {}),
    }
    body = bytearray()
    for section in [json.dumps(header, separators=(",", ":")).encode(), *cols.sections]:
        body += len(section).to_bytes(8, "little") + section
    return lzma.compress(bytes(body), filters=filters)


def _little_endian(col: array[Any]) -> bytes:
    if sys.byteorder == "big":
        col.byteswap()
    return col.tobytes()


def unpack_carried(packed: bytes) -> tuple[AdmissionState, dict[str, Any] | None]:
    """The state (every delta applied) and the tree manifest :func:`pack_state` or
    :func:`pack_next` packed."""
    frames = _frames(packed)
    state, header = _unpack_body(frames[0])
    for blob in frames[1:]:
        part, extra = _unpack_body(blob)
        state = StateDelta(
            w_gone=list(accumulate(extra["wg"])),
            h_gone=list(accumulate(extra["hg"])),
            h_ref=extra["hr"],
            skips=[(i, t) for i, t in extra["sk"]],
            part=part,
        ).apply(state)
    return state, header["manifest"]


def _unpack_body(blob: bytes) -> tuple[AdmissionState, dict[str, Any]]:
    body = lzma.decompress(blob)
    sections: list[bytes] = []
    at = 0
    while at < len(body):
        size = int.from_bytes(body[at:at + 8], "little")
        sections.append(body[at + 8:at + 8 + size])
        at += 8 + size
    header = json.loads(sections[0])
    cols = _Sections(sections[1:])
    w, h = header["w"], header["h"]
    w_ids, w_ns = cols.job_ids(w["ids"])
    if w["time"][0] == "d":
        t = array("d")
        t.frombytes(cols.sections[w["time"][1]])
        if sys.byteorder == "big":
            t.byteswap()
        times = t.tolist()
    else:
        _, first, deltas = w["time"]
        times = [u / 1_000_000 for u in accumulate(cols.ints(deltas), initial=first)]
        del times[len(w_ids):]  # no job: no time (``initial`` is always there)
    skips: dict[int, float] = {i: s for i, s in w["skip"]}
    wpol = [tuple(p) for p in header["wpol"]]
    hpol = [tuple(p) for p in header["hpol"]]
    w_pol = cols.ints(w["pol"])
    h_ids, h_ns = cols.job_ids(h["ids"])
    h_pol = cols.ints(h["pol"])
    wp: dict[str, tuple[bool, int]] = {k: (v[0], v[1]) for k, v in header["wpx"].items()}
    wp.update((j, wpol[p]) for j, p in zip(w_ids, w_pol, strict=True) if p)  # type: ignore[misc]
    hp: dict[str, tuple[int, bool, int]] = {k: (v[0], v[1], v[2]) for k, v in header["hpx"].items()}
    hp.update((j, hpol[p]) for j, p in zip(h_ids, h_pol, strict=True) if p)  # type: ignore[misc]
    state = AdmissionState.model_construct(
        tree=header["tree"],
        policy=QueuePolicy(header["policy"]),
        starve=header["starve"],
        shapes=header["shapes"],
        ns=header["ns"],
        w=list(zip(w_ids, w_ns, cols.ints(w["prio"]), times, cols.ints(w["shape"]),
                   [skips.get(i) for i in range(len(w_ids))], strict=True)),
        h=list(zip(h_ids, h_ns, cols.ints(h["shape"]), strict=True)),
        hp=hp,
        wp=wp,
        p=[PendingPlan.model_validate(plan) for plan in header["p"]],
        d=[PendingPlan.model_validate(plan) for plan in header["d"]],
        dirty=header["dirty"],
        x=header["x"],
        k=[ParkedJob.model_validate(job) for job in header.get("k", [])],
    )
    return state, header


def unpack_state(packed: bytes) -> AdmissionState:
    """The state :func:`pack_state` packed."""
    return unpack_carried(packed)[0]
