"""The shape of an emulated fleet: clusters, their labels and their node groups.

Pure data (no HTTP server): the emulator serves it, the control-plane runner boots it,
the what-if simulator reads it. A topology is a small YAML file (see
``fleetq/data/default-topology.yaml``) validated with pydantic so that a typo ends in one
clear line naming the field, not a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetq import resources as R
from fleetq.fleet_config import (
    ClusterName,
    TaintConfig,
    read_yaml_file,
    unique_cluster_names,
)
from fleetq.models import DNS1123_SUBDOMAIN, _loc_to_path, _pydantic_message

DEFAULT_TOPOLOGY = Path(__file__).resolve().parent / "data" / "default-topology.yaml"


class TopologyError(ValueError):
    """A topology file that cannot be used; the message names the file and field."""


#: A taint as users write it (the fleet config takes the same shape).
TaintSpec = TaintConfig


class NodeGroup(BaseModel):
    """``count`` identical nodes. Any extra key (``nvidia.com/gpu: 8``) is an extended
    resource quantity."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    count: int = Field(default=1, ge=0, le=100_000)
    cpu: str | int | float
    memory: str | int
    pods: int = Field(default=110, ge=1, le=100_000)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    namePrefix: str | None = None

    @model_validator(mode="after")
    def _quantities(self) -> NodeGroup:
        for key, value in self.capacity_quantities().items():
            try:
                R.parse_milli(value)
            except R.QuantityError as exc:
                raise ValueError(f"@{key} {exc}") from None
        return self

    def capacity_quantities(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu": self.cpu, "memory": self.memory}
        for k, v in (self.model_extra or {}).items():
            out[k] = v
        out["pods"] = self.pods
        return out


class ClusterSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: ClusterName
    labels: dict[str, str] = Field(default_factory=dict)
    reservation: bool = False
    member: bool = True
    nodeGroups: list[NodeGroup] = Field(default_factory=list)


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clusters: list[ClusterSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Topology:
        unique_cluster_names(self.clusters)
        return self

    def cluster(self, name: str) -> ClusterSpec:
        for c in self.clusters:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def members(self) -> list[ClusterSpec]:
        return [c for c in self.clusters if c.member]


def node_names(cluster: ClusterSpec) -> list[tuple[str, NodeGroup]]:
    """Deterministic node names: ``<cluster>-<prefix|g<i>>-<n>``."""
    out: list[tuple[str, NodeGroup]] = []
    for gi, group in enumerate(cluster.nodeGroups):
        prefix = group.namePrefix or f"g{gi}"
        for n in range(group.count):
            name = f"{cluster.name}-{prefix}-{n}"
            if not DNS1123_SUBDOMAIN.match(name):
                raise TopologyError(f"cluster {cluster.name}: node name {name!r} is invalid")
            out.append((name, group))
    return out


def parse_topology(doc: Any, source: str = "topology") -> Topology:
    """Validate a decoded document; raise :class:`TopologyError` with one line per problem."""
    if not isinstance(doc, dict):
        raise TopologyError(f"{source}: must be a mapping with a 'clusters' list")
    try:
        return Topology.model_validate(doc)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            path = _loc_to_path(err.get("loc", ()))
            msg = _pydantic_message(err)
            if msg.startswith("@"):
                sub, _, msg = msg[1:].partition(" ")
                path = f"{path}.{sub}" if path else sub
            lines.append(f"{source}: {path} {msg}".replace("  ", " "))
        raise TopologyError("\n".join(lines)) from None


def load_topology(path: str | Path) -> Topology:
    p = Path(path)
    return parse_topology(read_yaml_file(p, str(p), TopologyError), str(p))


def default_topology() -> Topology:
    return load_topology(DEFAULT_TOPOLOGY)

