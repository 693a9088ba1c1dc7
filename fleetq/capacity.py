"""What the placement core needs to know about a member cluster, and nothing more.

The adapter condenses nodes, pods and reservations of a live cluster into a
:class:`ClusterSnapshot`; the placement core reads it; the emulator and the what-if
simulator build the same type. These snapshots never travel through workflow history
(they can hold thousands of nodes): activities build and consume them in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetq.resources import Resources


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute
    #: when the taint was added (epoch seconds): set on the health taints of a member
    #: (``fleetq.cluster_health``), where NoExecute tolerations count from it
    time_added: float | None = field(default=None, compare=False)


@dataclass
class NodeCapacity:
    """One schedulable node: what it offers and what is already taken on it.

    ``requested`` already includes the requests of non-terminated pods bound to the node
    and of live reservations pinned to it that the gang being placed cannot use.
    ``pods_allocatable``/``pods_used`` count pod slots (Kubernetes ``pods`` resource)."""

    name: str
    allocatable: Resources
    requested: Resources = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    pods_allocatable: int = 110
    pods_used: int = 0

    def free(self) -> Resources:
        return {k: v - self.requested.get(k, 0) for k, v in self.allocatable.items()}


@dataclass
class ClusterSnapshot:
    """A member cluster at one moment, as the placement core sees it."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()  # cluster taints, matched by policy clusterTolerations
    nodes: list[NodeCapacity] = field(default_factory=list)
    reservation: bool = False  # the cluster supports Reservation objects
    reachable: bool = True
    resource_version: str = ""  # what the snapshot was built from (for cache diagnostics)
