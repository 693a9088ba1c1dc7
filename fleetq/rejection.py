"""Why a member cluster was turned down for a gang, as a value rather than a sentence.

Each :class:`Rejection` carries a :class:`RejectionCode` (which check failed), the
parameters it found, a :class:`Severity` and the one-line message users read in events,
``fleetq describe`` and the job's status; metrics count by code, the simulator groups by
:attr:`Rejection.summary`, and nothing parses the message back. Severity follows
kube-scheduler's filter statuses (``Unschedulable`` vs ``UnschedulableAndUnresolvable``):
*unschedulable* may pass once capacity frees, a member returns or a reservation is
retried; *unresolvable* not until the fleet's or job's configuration changes. Unresolvable
is only claimed when certain.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["Rejection", "RejectionCode", "Severity"]


class RejectionCode(StrEnum):
    """Which check turned the cluster down (a low-cardinality metric label)."""

    #: the job was evicted from this cluster earlier (failover)
    EVICTED = "Evicted"
    #: the policy's clusterAffinity (exclude, clusterNames or labelSelector) rules it out
    AFFINITY_MISMATCH = "AffinityMismatch"
    #: a NoSchedule/NoExecute cluster taint the policy's clusterTolerations do not tolerate
    UNTOLERATED_CLUSTER_TAINT = "UntoleratedClusterTaint"
    #: the member did not answer
    CLUSTER_UNREACHABLE = "ClusterUnreachable"
    #: the cluster has no nodes at all
    NO_NODES = "NoNodes"
    #: a pod requests a resource no node of the cluster offers
    RESOURCE_NOT_OFFERED = "ResourceNotOffered"
    #: the gang's total request exceeds the free resources summed over schedulable nodes
    INSUFFICIENT_CLUSTER_RESOURCE = "InsufficientClusterResource"
    #: the gang has more pods than free pod slots summed over schedulable nodes
    INSUFFICIENT_CLUSTER_POD_SLOTS = "InsufficientClusterPodSlots"
    #: a pod needs more of one resource than the largest free node it may use has
    INSUFFICIENT_NODE_RESOURCE = "InsufficientNodeResource"
    #: each resource fits somewhere, but no single node has all of a pod's requests free
    NO_NODE_FITS_ALL = "NoNodeFitsAllRequests"
    #: the gang's earlier pods used up the pod slots of the nodes a pod may use
    NODE_POD_SLOTS_EXHAUSTED = "NodePodSlotsExhausted"
    #: the nodes a pod may use have no free pod slot at all
    NODE_POD_SLOTS_FULL = "NodePodSlotsFull"
    #: no node carries the labels of a pod's nodeSelector
    NODE_SELECTOR_MISMATCH = "NodeSelectorMismatch"
    #: every node a pod may use is cordoned
    NODES_CORDONED = "NodesCordoned"
    #: a pod tolerates the NoSchedule/NoExecute taints of none of its nodes
    UNTOLERATED_NODE_TAINTS = "UntoleratedNodeTaints"
    #: the job workflow's reservation on the member was lost before binding
    RESERVATION_LOST = "ReservationLost"
    #: the job workflow's bind on the member failed
    BINDING_FAILED = "BindingFailed"
    #: the bind re-checked the member under its bind Lease and the gang no longer fits:
    #: another worker (or another job of this one) bound onto the same room first
    MEMBER_FULL_AT_BIND = "MemberFullAtBind"
    #: the whole fleet: no eligible member could hold the gang even with every node empty
    #: (allocatable, nodeSelector, taints, cordoned nodes, pod slots): waiting cannot help
    #: until a member's nodes change (``fleetq.placement.never_fits``)
    NEVER_FITS = "NeverFits"


class Severity(StrEnum):
    """Whether retrying placement later can help (see the module docstring)."""

    UNSCHEDULABLE = "Unschedulable"
    UNRESOLVABLE = "UnschedulableAndUnresolvable"


#: Codes that are unresolvable whatever their parameters.
_UNRESOLVABLE = frozenset({
    RejectionCode.EVICTED,
    RejectionCode.AFFINITY_MISMATCH,
    RejectionCode.NO_NODES,
    RejectionCode.RESOURCE_NOT_OFFERED,
    RejectionCode.NODE_SELECTOR_MISMATCH,
    RejectionCode.NEVER_FITS,
})

Param = str | int


#: Each code's grouping summary (:attr:`Rejection.summary`), with ``{param}`` for the
#: parameters that name what is missing. Codes absent here summarise as their message.
_SUMMARIES: dict[RejectionCode, str] = {
    RejectionCode.RESOURCE_NOT_OFFERED: "needs {resource}; no node has any",
    RejectionCode.INSUFFICIENT_NODE_RESOURCE: "needs {resource}; no node has enough free",
    RejectionCode.INSUFFICIENT_CLUSTER_RESOURCE:
        "needs {resource}; not enough free in the whole cluster",
    RejectionCode.INSUFFICIENT_CLUSTER_POD_SLOTS:
        "needs pod slots; not enough free in the whole cluster",
    RejectionCode.NODE_POD_SLOTS_EXHAUSTED: "needs a pod slot; all usable nodes full",
    RejectionCode.NO_NODE_FITS_ALL:
        "needs all its requests on one node; no node has all of them free",
    RejectionCode.NODE_SELECTOR_MISMATCH: "no node matches nodeSelector {selector}",
    RejectionCode.NODES_CORDONED: "no schedulable node (all cordoned)",
    RejectionCode.UNTOLERATED_NODE_TAINTS:
        "does not tolerate the taints of any node it could use",
    RejectionCode.NODE_POD_SLOTS_FULL: "no free pod slot on the nodes it could use",
    RejectionCode.NO_NODES: "no nodes",
    RejectionCode.EVICTED: "excluded",
    RejectionCode.CLUSTER_UNREACHABLE: "unreachable",
    RejectionCode.RESERVATION_LOST: "reservation lost",
    RejectionCode.BINDING_FAILED: "binding failed",
    RejectionCode.MEMBER_FULL_AT_BIND: "filled up by another bind",
    RejectionCode.NEVER_FITS: "no member can ever hold it",
}


@dataclass(frozen=True)
class Rejection:
    """One cluster's rejection: ``code`` and ``params`` for programs, ``message`` (one
    line) for people; ``cluster`` names the cluster once it travels in a verdict."""

    code: RejectionCode
    message: str
    params: dict[str, Param] = field(default_factory=dict)
    severity: Severity = Severity.UNSCHEDULABLE
    cluster: str = ""

    def at(self, cluster: str) -> Rejection:
        """This rejection, of ``cluster``."""
        return dataclasses.replace(self, cluster=cluster)

    @classmethod
    def of(
        cls, code: RejectionCode, message: str, *, unresolvable: bool = False, **params: Param
    ) -> Rejection:
        """A rejection whose severity follows from its code (or ``unresolvable``)."""
        severe = unresolvable or code in _UNRESOLVABLE
        return cls(
            code, message, params, Severity.UNRESOLVABLE if severe else Severity.UNSCHEDULABLE
        )

    @property
    def retryable(self) -> bool:
        """True when the same gang may fit this cluster later without a config change."""
        return self.severity is Severity.UNSCHEDULABLE

    @property
    def summary(self) -> str:
        """The reason without pod names and numbers, so that rejections group
        (``needs cpu; no node has enough free``): the code plus the parameters that
        name *what* is missing (a resource, a nodeSelector, a rule), worded for people."""
        template = _SUMMARIES.get(self.code)
        if template is None:  # AFFINITY_MISMATCH, UNTOLERATED_CLUSTER_TAINT: the message
            return self.message  # names the rule or the taint, no pod or number
        return template.format_map(self.params)

    def __str__(self) -> str:
        return self.message
