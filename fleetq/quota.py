"""Quota accounting for Kube Queue's ElasticQuotaTree, with no queues and no time.

Admission must fit a job's request under ``max`` at its leaf and every ancestor, and
usage is charged to all of them. This module is that bookkeeping only: which node a
namespace charges (no leaf: the root; no tree: one unlimited root), what each node uses,
whether and why not a request fits (a resource absent from ``max`` is unlimited), and
each node's queue name. A tree replaced keeps every held request, even over the new
``max``; a request over some ``max`` can never fit (:meth:`QuotaTree.never_fits`).
Queue order and scheduling: :mod:`fleetq.queues`, :mod:`fleetq.admission`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from fleetq import resources as R
from fleetq.models import ElasticQuotaTree, QuotaNodeSpec

#: Kubernetes' random-suffix alphabet (no vowels, no look-alikes), as in ``root-kdzw7``.
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
SUFFIX_LEN = 5


def queue_name(tree_name: str, path: Sequence[str]) -> str:
    """Kube Queue's queue name for the node at ``path`` (root first): the path lowercased,
    ``/`` and ``_`` turned into ``-``, joined with ``-``, plus a 5-character suffix.

    The suffix is derived from a SHA-256 of the tree name and path, so it is stable across
    processes, restarts and workflow replays (Python's ``hash`` is salted; never use it)."""
    base = "-".join(p.lower().replace("/", "-").replace("_", "-") for p in path)
    digest = hashlib.sha256(("\0".join([tree_name, *path])).encode()).digest()
    n = int.from_bytes(digest[:8], "big")
    suffix = []
    for _ in range(SUFFIX_LEN):
        n, i = divmod(n, len(SUFFIX_ALPHABET))
        suffix.append(SUFFIX_ALPHABET[i])
    return f"{base}-{''.join(suffix)}"


@dataclass(eq=False)
class QuotaNode:
    """One node of the tree with its live usage (its own holders plus its subtree's)."""

    name: str
    path: tuple[str, ...]
    parent: str | None
    min: R.Resources
    max: R.Resources
    namespaces: tuple[str, ...]
    children: tuple[str, ...]
    queue: str
    usage: R.Resources = field(default_factory=dict)
    #: Holders charged to this node itself (not its subtree).
    admitted: int = 0
    #: This node then its ancestors up to the root; filled in by :class:`QuotaTree`.
    chain: tuple[QuotaNode, ...] = ()
    #: What the parent can share, per resource (its ``max``, else its ``min``; positive
    #: only, no ``kube-queue/max-jobs``): the denominator of :meth:`borrowed_share`.
    pool: R.Resources = field(default_factory=dict)

    def below_min(self) -> bool:
        """True while the node uses less than its guarantee: ``min`` names at least one
        positive quantity and usage is below ``min`` for every one of them."""
        positive = [(k, v) for k, v in self.min.items() if v > 0]
        return bool(positive) and all(self.usage.get(k, 0) < v for k, v in positive)

    def borrowed_share(self) -> float:
        """Dominant resource share of the quota this node uses above its ``min``: the
        largest, over resources, of what it borrows divided by what its parent can share
        (:attr:`pool`); 0 for the root and for a node within its ``min`` (as Kueue's fair
        sharing and :mod:`fleetq.preemption` compute it)."""
        best = 0.0
        mins, usage = self.min, self.usage
        for k, pool in self.pool.items():
            borrowed = usage.get(k, 0) - mins.get(k, 0)
            if borrowed > 0 and borrowed / pool > best:
                best = borrowed / pool
        return best


@dataclass(frozen=True)
class Holding:
    """Quota one admitted job holds, and where it is charged."""

    namespace: str
    node: str
    request: Mapping[str, int]


class InadmissibleReason(StrEnum):
    """Why a job can never be admitted under the current tree (Kueue's inadmissible
    workloads, kept beside their ClusterQueue: kueue pkg/queue/cluster_queue.go,
    ``clusterQueue.inadmissibleWorkloads``)."""

    #: the gang minimum asks more of a resource than a node of its chain has as ``max``
    EXCEEDS_MAX = "ExceedsMax"


#: the order resources are named in reasons (``can_admit``, ``never_fits``)
_RESOURCE_ORDER = {R.MAX_JOBS: 0, R.CPU: 1, R.MEMORY: 2, R.GPU: 3}


class Inadmissible(BaseModel):
    """A job can never be admitted under the current tree: the node and resource whose
    ``max`` its request exceeds (milli-units), and the message users see, e.g.
    ``quota team: nvidia.com/gpu 12 exceeds max 8``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: InadmissibleReason = InadmissibleReason.EXCEEDS_MAX
    node: str
    resource: str
    request: int
    max: int
    message: str


def exceeds_max(node: str, resource: str, request: int, cap: int) -> Inadmissible:
    """The :class:`Inadmissible` of a request of ``request`` (milli) of ``resource``
    at ``node``, whose ``max`` of it is ``cap``."""
    fmt = R.format_quantity
    return Inadmissible(
        node=node,
        resource=resource,
        request=request,
        max=cap,
        message=f"quota {node}: {resource} {fmt(resource, request)} exceeds max "
        f"{fmt(resource, cap)}",
    )


def _jobs(milli: int) -> str:
    return R.format_quantity(R.MAX_JOBS, milli)


class QuotaTree:
    """Usage per node of one ElasticQuotaTree and the jobs holding it."""

    def __init__(self, tree: ElasticQuotaTree | None) -> None:
        self.holdings: dict[str, Holding] = {}
        self._build(tree)

    # ------------------------------------------------------------------ structure

    def _build(self, tree: ElasticQuotaTree | None) -> None:
        self.tree = tree
        self.tree_name = tree.metadata.name if tree is not None else ""
        self.nodes: dict[str, QuotaNode] = {}
        self._ns_leaf: dict[str, str] = {}
        if tree is None:
            self.root = "root"
            self.nodes["root"] = QuotaNode(
                "root", ("root",), None, {}, {}, (), (), queue_name("", ["root"])
            )
        else:
            self.root = tree.spec.root.name
            self._add(tree.spec.root, (), None)
        for node in self.nodes.values():
            chain = [node]
            while chain[-1].parent is not None:
                chain.append(self.nodes[chain[-1].parent])
            node.chain = tuple(chain)
            if node.parent is not None:
                parent = self.nodes[node.parent]
                node.pool = {
                    k: v
                    for k in (*parent.max, *parent.min)
                    if k != R.MAX_JOBS and (v := parent.max.get(k) or parent.min.get(k) or 0) > 0
                }

    def _add(self, spec: QuotaNodeSpec, prefix: tuple[str, ...], parent: str | None) -> None:
        path = (*prefix, spec.name)
        self.nodes[spec.name] = QuotaNode(
            name=spec.name,
            path=path,
            parent=parent,
            min=spec.min_resources(),
            max=spec.max_resources(),
            namespaces=tuple(spec.namespaces),
            children=tuple(c.name for c in spec.children),
            queue=queue_name(self.tree_name, path),
        )
        for ns in spec.namespaces:
            self._ns_leaf[ns] = spec.name
        for child in spec.children:
            self._add(child, path, spec.name)

    def replace(self, tree: ElasticQuotaTree | None) -> None:
        """Swap in a new tree; every holding is re-charged where its namespace now maps."""
        old = self.holdings
        self.holdings = {}
        self._build(tree)
        for job_id, h in old.items():
            self.admit(job_id, h.namespace, h.request)

    def leaf_for(self, namespace: str) -> str:
        """The node a namespace charges: its leaf, or the root if it is attached to none."""
        return self._ns_leaf.get(namespace, self.root)

    def node(self, name: str) -> QuotaNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"quota tree {self.tree_name!r} has no node {name!r}") from None

    def __iter__(self) -> Iterator[QuotaNode]:
        """Nodes in pre-order (root first, children in manifest order)."""
        return iter(self.nodes.values())

    # ------------------------------------------------------------------ checks

    def fits(self, node: str, request: Mapping[str, int]) -> bool:
        """Whether ``request`` fits under ``max`` at ``node`` and every ancestor."""
        # a loop, not all(genexpr): 20 % cheaper on the scheduling pass's hot path
        for n in self.nodes[node].chain:  # noqa: SIM110
            if not R.within_max(request, n.usage, n.max):
                return False
        return True

    def short_of(self, node: str, request: Mapping[str, int]) -> tuple[QuotaNode, str] | None:
        """The lowest node of ``node``'s chain (itself, then its ancestors) under whose
        ``max`` ``request`` does not fit, and a resource it is short of there; None if
        it fits everywhere (:meth:`fits`). The request cannot fit until that node has
        ``request[resource]`` free of that resource."""
        for n in self.nodes[node].chain:
            limit, usage = n.max, n.usage
            for k, v in request.items():
                if v > 0:
                    m = limit.get(k)
                    if m is not None and usage.get(k, 0) + v > m:
                        return n, k
        return None

    def never_fits(self, node: str, request: Mapping[str, int]) -> Inadmissible | None:
        """Why ``request`` can never fit at ``node`` under this tree, whatever is
        released: the lowest node of its chain whose ``max`` of a resource is below the
        request (resources named in the order of :meth:`can_admit`; a resource absent
        from ``max`` is unlimited; ``kube-queue/max-jobs`` counts the job as 1); None if
        it fits an empty tree."""
        for n in self.node(node).chain:
            limit = n.max
            over = [k for k, v in request.items() if v > 0 and k in limit and v > limit[k]]
            if over:
                k = min(over, key=lambda k: (_RESOURCE_ORDER.get(k, 4), k))
                return exceeds_max(n.name, k, request[k], limit[k])
        return None

    def can_admit(self, node: str, request: Mapping[str, int]) -> str | None:
        """``None`` if ``request`` fits, else why not, naming the lowest node that is
        short, e.g. ``quota child-2: kube-queue/max-jobs 1/1 in use`` or
        ``quota root: nvidia.com/gpu needs 8, 2 free of max 16``."""
        for n in self.node(node).chain:
            short = [
                k
                for k, v in request.items()
                if v > 0 and k in n.max and n.usage.get(k, 0) + v > n.max[k]
            ]
            if not short:
                continue
            parts = []
            for k in sorted(short, key=lambda k: (_RESOURCE_ORDER.get(k, 4), k)):
                used, cap = n.usage.get(k, 0), n.max[k]
                if k == R.MAX_JOBS:
                    parts.append(f"{k} {_jobs(used)}/{_jobs(cap)} in use")
                else:
                    free = max(0, cap - used)
                    parts.append(
                        f"{k} needs {R.format_quantity(k, request[k])}, "
                        f"{R.format_quantity(k, free)} free of max {R.format_quantity(k, cap)}"
                    )
            return f"quota {n.name}: " + "; ".join(parts)
        return None

    # ------------------------------------------------------------------ accounting

    def admit(self, job_id: str, namespace: str, request: Mapping[str, int]) -> str:
        """Charge ``request`` to the namespace's node and its ancestors (no limit check:
        callers check :meth:`fits` first). Returns the node charged."""
        if job_id in self.holdings:
            raise ValueError(f"job {job_id!r} already holds quota")
        node = self.nodes[self.leaf_for(namespace)]
        self.holdings[job_id] = Holding(namespace, node.name, request)
        node.admitted += 1
        for n in node.chain:
            R.add_into(n.usage, request)
        return node.name

    def release(self, job_id: str) -> bool:
        """Give a job's quota back; ``False`` if it held none."""
        h = self.holdings.pop(job_id, None)
        if h is None:
            return False
        node = self.nodes[h.node]
        node.admitted -= 1
        for n in node.chain:
            R.add_into(n.usage, h.request, -1)
        return True

    def usage(self, node: str) -> R.Resources:
        return dict(self.node(node).usage)
