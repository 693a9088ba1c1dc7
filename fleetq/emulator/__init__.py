"""The member-cluster emulator: loopback Kubernetes API servers with simulated
controllers behind them (PyTorchJob operator, gang scheduler, reservations, pod
lifecycle), usable by the official ``kubernetes`` client and ``kubectl`` unchanged.

It is a product feature (``fleetq sim serve``, the embedded default of ``fleetq up``,
demos, benchmarks), not a test mock.
"""

from fleetq.emulator.fleet import EmulatedFleet, Emulator, EmulatorError
from fleetq.emulator.topology import (
    ClusterSpec,
    NodeGroup,
    Topology,
    TopologyError,
    default_topology,
    load_topology,
    parse_topology,
)

__all__ = [
    "ClusterSpec",
    "EmulatedFleet",
    "Emulator",
    "EmulatorError",
    "NodeGroup",
    "Topology",
    "TopologyError",
    "default_topology",
    "load_topology",
    "parse_topology",
]
