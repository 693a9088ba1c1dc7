"""Moved to :mod:`fleetq.topology` (pure core); this alias lives until every importer moved."""

from fleetq.topology import (
    DEFAULT_TOPOLOGY,
    ClusterSpec,
    NodeGroup,
    TaintSpec,
    Topology,
    TopologyError,
    default_topology,
    load_topology,
    node_names,
    parse_topology,
)

__all__ = [
    "DEFAULT_TOPOLOGY",
    "ClusterSpec",
    "NodeGroup",
    "TaintSpec",
    "Topology",
    "TopologyError",
    "default_topology",
    "load_topology",
    "node_names",
    "parse_topology",
]
