"""The manifests users write, as pydantic v2 models, and what we derive from them.

Accepted verbatim from the walkthrough: ``ElasticQuotaTree`` (scheduling.sigs.k8s.io/v1beta1),
``PropagationPolicy`` and ``ClusterPropagationPolicy`` (policy.one.alibabacloud.com and
policy.karmada.io, v1alpha1) and ``PyTorchJob`` (kubeflow.org/v1); ``PriorityClass``
(scheduling.k8s.io/v1) so that ``priorityClassName`` has a value. Our scheduling fields
are strict (an unknown field is an error); pod templates and the rest of a PyTorchJob spec
are kept verbatim for the members. A problem is a :class:`ManifestError` naming object and
field, e.g. ``PyTorchJob default/x: spec.pytorchReplicaSpecs.Worker.replicas must be >= 0``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from fleetq import resources as R

# --------------------------------------------------------------------------- errors


class ManifestError(ValueError):
    """One problem with one object, rendered ``<Kind> <ns>/<name>: <field> <message>``."""

    def __init__(self, ref: str, field_path: str, message: str) -> None:
        self.ref = ref
        self.field_path = field_path
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.field_path} " if self.field_path else ""
        return _one_line(f"{self.ref}: {where}{self.message}")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _one_line(text: str) -> str:
    """Escape line breaks and other control characters so a message stays one line."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class ManifestErrors(ValueError):
    """Several problems at once (one line each)."""

    def __init__(self, errors: Sequence[ManifestError]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def _join(a: str, b: str) -> str:
    """``a.b`` for field paths, ``a[0]`` when ``b`` is an index."""
    if not a:
        return b
    if not b:
        return a
    return f"{a}{b}" if b.startswith("[") else f"{a}.{b}"


def _loc_to_path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


#: Pydantic error kinds whose message needs nothing from the error's context.
_PYDANTIC_FIXED: dict[str, str] = {
    "missing": "is required",
    "extra_forbidden": "is not a known field",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "list_type": "must be a list",
    "too_short": "must not be empty",
}

#: Pydantic error kinds whose message names a bound from the error's context.
_PYDANTIC_FROM_CTX: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "greater_than_equal": lambda ctx: f"must be >= {ctx.get('ge')}",
    "greater_than": lambda ctx: f"must be > {ctx.get('gt')}",
    "less_than_equal": lambda ctx: f"must be <= {ctx.get('le')}",
    "literal_error": lambda ctx: f"must be one of {ctx.get('expected', '')}".strip(),
    "enum": lambda ctx: f"must be one of {ctx.get('expected', '')}".strip(),
    "string_too_long": lambda ctx: f"must be at most {ctx.get('max_length')} characters",
}


def _pydantic_message(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    if kind in _PYDANTIC_FIXED:
        return _PYDANTIC_FIXED[kind]
    if kind in _PYDANTIC_FROM_CTX:
        return _PYDANTIC_FROM_CTX[kind](err.get("ctx") or {})
    msg = str(err.get("msg", "is invalid"))
    return msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")


def errors_from_validation(ref: str, exc: ValidationError, prefix: str = "") -> ManifestErrors:
    out = []
    for err in exc.errors():
        path = _loc_to_path(err.get("loc", ()))
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        msg = _pydantic_message(err)
        # A model-level check may name its own sub-field as "<field>: <message>".
        m = re.match(r"^@([\w.\[\]/\-]+) (.*)$", msg, re.S)
        if m:
            path = _join(path, m.group(1))
            msg = m.group(2)
        out.append(ManifestError(ref, path, msg))
    return ManifestErrors(out)


# --------------------------------------------------------------------------- shared

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: A resource name: an optional DNS-subdomain prefix and ``/``, then a name part.
RESOURCE_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
QUOTA_NODE_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _check_name(value: str, max_len: int, label: bool) -> str:
    if not value:
        raise ValueError("must not be empty")
    if len(value) > max_len:
        raise ValueError(f"must be at most {max_len} characters")
    pattern = DNS1123_LABEL if label else DNS1123_SUBDOMAIN
    if not pattern.fullmatch(value):
        raise ValueError(
            f"{value[:64]!r} is not a valid Kubernetes name (lowercase letters, digits, '-'"
            + ("" if label else ", '.'")
            + ")"
        )
    return value


class Strict(BaseModel):
    """Our own scheduling fields: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=False)


class Open(BaseModel):
    """Forwarded Kubernetes fields: unknown keys are kept verbatim."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ObjectMeta(Open):
    name: str
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, 253, label=False)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return _check_name(v, 63, label=True)


class LabelSelectorRequirement(Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"@values must not be empty for operator {self.operator}")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"@values must be empty for operator {self.operator}")
        return self


class LabelSelector(Strict):
    matchLabels: dict[str, str] = Field(default_factory=dict)
    matchExpressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.matchLabels.items():
            if labels.get(k) != v:
                return False
        for req in self.matchExpressions:
            present = req.key in labels
            if req.operator == "In" and (not present or labels[req.key] not in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


def _under(prefix: str, exc: ValueError) -> ValueError:
    """Re-root a validator message under ``prefix``: ``@a msg`` becomes ``@prefix.a msg``
    and a plain ``msg`` becomes ``@prefix msg``."""
    msg = str(exc)
    if msg.startswith("@"):
        return ValueError(f"@{_join(prefix, msg[1:])}")
    return ValueError(f"@{prefix} {msg}")


def is_resource_name(name: object) -> bool:
    """A Kubernetes resource name (a qualified name of at most 253 characters)."""
    return isinstance(name, str) and len(name) <= 253 and bool(RESOURCE_NAME.fullmatch(name))


def resource_map(
    v: Any, valid_name: Callable[[object], bool] = is_resource_name
) -> dict[str, Any]:
    """Check a ``{resource: quantity}`` mapping (names by ``valid_name``). A bad quantity
    is reported as ``@<resource> <message>`` so the error path ends with the resource's
    name."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ValueError("must be a mapping of resource name to quantity")
    for name, q in v.items():
        if not valid_name(name):
            raise ValueError(f"has an invalid resource name {str(name)[:64]!r}")
        try:
            R.parse_milli(q)
        except R.QuantityError as exc:
            raise ValueError(f"@{name} {exc}") from None
    return dict(v)


# --------------------------------------------------------------------------- ElasticQuotaTree


class QuotaNodeSpec(Strict):
    name: str
    min: dict[str, Any] = Field(default_factory=dict)
    max: dict[str, Any] = Field(default_factory=dict)
    namespaces: list[str] = Field(default_factory=list)
    #: koord-queue ``ElasticQuotaSpec.Attributes``: kept, not used by fleetq (a warning
    #: says so, :func:`upstream_warnings`)
    attributes: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    children: list[QuotaNodeSpec] = Field(default_factory=list)

    @field_validator("min", "max", mode="before")
    @classmethod
    def _quantities(cls, v: Any) -> dict[str, Any]:
        return resource_map(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if len(v) > 63 or not QUOTA_NODE_NAME.fullmatch(v):
            raise ValueError(
                f"{v[:64]!r} is not a valid quota node name (letters, digits, '-', '_', '.'; "
                "at most 63 characters)"
            )
        return v

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, v: list[str]) -> list[str]:
        for i, ns in enumerate(v):
            try:
                _check_name(ns, 63, label=True)
            except ValueError as exc:
                raise _under(f"[{i}]", exc) from None
            if ns in v[:i]:
                raise ValueError(f"@[{i}] namespace {ns!r} is listed twice")
        return v

    def min_resources(self) -> R.Resources:
        return R.parse_resources(self.min)

    def max_resources(self) -> R.Resources:
        return R.parse_resources(self.max)

    @model_validator(mode="after")
    def _min_le_max(self) -> QuotaNodeSpec:
        lo, hi = self.min_resources(), self.max_resources()
        for k, v in lo.items():
            if k in hi and v > hi[k]:
                raise ValueError(f"@min.{k} {self.min[k]} exceeds max.{k} {self.max[k]}")
        return self


class ElasticQuotaTreeSpec(Strict):
    root: QuotaNodeSpec


#: Queue policy of every queue of the tree (Kube Queue configures it per deployment; we
#: keep it with the tree so it is applied, versioned and reviewed like the quotas).
QUEUE_POLICY_ANNOTATION = "fleetq.io/queue-policy"
STARVATION_ANNOTATION = "fleetq.io/starvation-seconds"
#: the Priority policy's bound when a tree does not set one: 300 s since issue 18's
#: measurements (BENCHMARKS.md, "Starvation bound with preemption off"; 600 before).
#: Quota workflows started earlier keep the 600 their recorded input carries.
DEFAULT_STARVATION_SECONDS = 300.0


class ElasticQuotaTree(Strict):
    apiVersion: Literal["scheduling.sigs.k8s.io/v1beta1"]
    kind: Literal["ElasticQuotaTree"]
    metadata: ObjectMeta
    spec: ElasticQuotaTreeSpec
    status: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _kube_system(cls, m: ObjectMeta) -> ObjectMeta:
        if m.namespace != "kube-system":
            raise ValueError(
                f"@namespace must be kube-system (ElasticQuotaTree is only read there), "
                f"got {m.namespace!r}"
            )
        policy = m.annotations.get(QUEUE_POLICY_ANNOTATION)
        if policy is not None and policy not in ("Priority", "Block"):
            raise ValueError(
                f"@annotations.{QUEUE_POLICY_ANNOTATION} must be Priority or Block, "
                f"got {policy[:32]!r}"
            )
        starve = m.annotations.get(STARVATION_ANNOTATION)
        if starve is not None:
            try:
                value = float(starve)
            except ValueError:
                value = -1.0
            if not (0 <= value <= 31_536_000):
                raise ValueError(
                    f"@annotations.{STARVATION_ANNOTATION} must be a number of seconds "
                    f"between 0 and 31536000, got {starve[:32]!r}"
                )
        return m

    @property
    def queue_policy(self) -> str:
        """``Priority`` (default) or ``Block``, from ``fleetq.io/queue-policy``."""
        return self.metadata.annotations.get(QUEUE_POLICY_ANNOTATION, "Priority")

    @property
    def starvation_seconds(self) -> float:
        """How long a skipped head may be overtaken (``fleetq.io/starvation-seconds``)."""
        return float(self.metadata.annotations.get(STARVATION_ANNOTATION,
                                                   DEFAULT_STARVATION_SECONDS))

    @model_validator(mode="after")
    def _tree_rules(self) -> ElasticQuotaTree:
        seen_names: dict[str, str] = {}
        ns_owner: dict[str, str] = {}

        def walk(node: QuotaNodeSpec, path: str) -> None:
            _check_unique_node_name(node, path, seen_names)
            _check_leaf_namespaces(node, path, ns_owner)
            _check_children_min(node, path)
            for i, c in enumerate(node.children):
                walk(c, f"{path}.children[{i}]")

        walk(self.spec.root, "spec.root")
        return self


def _check_unique_node_name(node: QuotaNodeSpec, path: str, seen_names: dict[str, str]) -> None:
    """No two nodes of a tree share a name."""
    if node.name in seen_names:
        raise ValueError(
            f"@{path}.name {node.name!r} is used twice (also at {seen_names[node.name]})"
        )
    seen_names[node.name] = path


def _check_leaf_namespaces(node: QuotaNodeSpec, path: str, ns_owner: dict[str, str]) -> None:
    """Namespaces attach to leaves only, each namespace to one leaf."""
    if node.children and node.namespaces:
        raise ValueError(
            f"@{path}.namespaces namespaces attach to leaves only; "
            f"{node.name!r} has children"
        )
    for ns in node.namespaces:
        if ns in ns_owner:
            raise ValueError(
                f"@{path}.namespaces namespace {ns!r} is already on leaf {ns_owner[ns]!r}"
            )
        ns_owner[ns] = node.name


def _check_children_min(node: QuotaNodeSpec, path: str) -> None:
    """The children's min, summed, fits inside the parent's min."""
    if not node.children:
        return
    total: R.Resources = {}
    for c in node.children:
        R.add_into(total, c.min_resources())
    own = node.min_resources()
    for k, v in total.items():
        if v > own.get(k, 0):
            have = node.min.get(k, 0)
            raise ValueError(
                f"@{path}.children the children's min {k} "
                f"{R.format_quantity(k, v)} exceeds {node.name!r} min {k} {have}"
            )


# --------------------------------------------------------------------------- PropagationPolicy


#: PropagationPolicy annotation: ``Strict`` never runs two copies of a job, even while a
#: member is partitioned; ``BestEffort`` (default) may, until the member answers again.
FENCING_ANNOTATION = "fleetq.io/fencing"
FENCING_MODES = ("BestEffort", "Strict")


class PurgeMode(StrEnum):
    DIRECTLY = "Directly"
    GRACEFULLY = "Gracefully"
    NEVER = "Never"


_PURGE_ALIASES = {
    "Immediately": PurgeMode.DIRECTLY,
    "Directly": PurgeMode.DIRECTLY,
    "Graciously": PurgeMode.GRACEFULLY,
    "Gracefully": PurgeMode.GRACEFULLY,
    "Never": PurgeMode.NEVER,
}


#: ``content.IsLabelKey`` / ``ValidateLabelName``: an optional DNS-subdomain prefix and
#: ``/``, then a name of at most 63 letters, digits, ``-``, ``_`` and ``.``.
_QUALIFIED_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def qualified_name_error(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes qualified name (a label key), or None."""
    parts = value.split("/")
    if len(parts) > 2:
        return f"{value[:64]!r} is not a qualified name (at most one '/')"
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix):
            return f"{value[:64]!r} has an invalid prefix (a lowercase DNS subdomain)"
    if not name:
        return f"{value[:64]!r} is not a qualified name (the name part is empty)"
    if len(name) > 63 or not _QUALIFIED_PART.fullmatch(name):
        return (
            f"{value[:64]!r} is not a qualified name (at most 63 letters, digits, '-', '_' "
            "or '.', starting and ending with a letter or digit)"
        )
    return None


def _qualified_name(v: str) -> str:
    problem = qualified_name_error(v)
    if problem is not None:
        raise ValueError(problem)
    return v


#: a Kubernetes qualified name (a label key), validated as ``metav1validation`` does
QualifiedName = Annotated[StrictStr, AfterValidator(_qualified_name)]
Int32 = Annotated[StrictInt, Field(ge=-(2**31), le=2**31 - 1)]


class ResourceSelector(Strict):
    apiVersion: str = Field(min_length=1)
    kind: str = Field(min_length=1)
    namespace: str | None = None
    name: str | None = None
    labelSelector: LabelSelector | None = None


#: Karmada ``ValidatePolicyFieldSelector``: the cluster fields a fieldSelector may name.
FIELD_SELECTOR_KEYS = ("provider", "region", "zone")


class NodeSelectorRequirement(Strict):
    """``corev1.NodeSelectorRequirement``, as a fieldSelector's matchExpressions use it."""

    key: StrictStr
    operator: StrictStr
    values: list[StrictStr] = Field(default_factory=list)


class FieldSelector(Strict):
    """``placement.clusterAffinity.fieldSelector``: cluster provider, region or zone."""

    matchExpressions: list[NodeSelectorRequirement] = Field(default_factory=list)

    @model_validator(mode="after")
    def _keys_and_operators(self) -> FieldSelector:
        # Karmada pkg/util/validation/validation.go ValidatePolicyFieldSelector
        for i, expr in enumerate(self.matchExpressions):
            if expr.key not in FIELD_SELECTOR_KEYS:
                raise ValueError(
                    f"@matchExpressions[{i}].key unsupported key {expr.key[:64]!r}, must be "
                    "provider, region, or zone"
                )
            if expr.operator not in ("In", "NotIn"):
                raise ValueError(
                    f"@matchExpressions[{i}].operator unsupported operator "
                    f"{expr.operator[:32]!r}, must be In or NotIn"
                )
        return self


class ClusterAffinity(Strict):
    clusterNames: list[str] = Field(default_factory=list)
    labelSelector: LabelSelector | None = None
    fieldSelector: FieldSelector | None = None
    exclude: list[str] = Field(default_factory=list)

    def allows(self, cluster: str, labels: Mapping[str, str]) -> bool:
        if cluster in self.exclude:
            return False
        if self.clusterNames and cluster not in self.clusterNames:
            return False
        return not (self.labelSelector is not None and not self.labelSelector.matches(labels))

    @property
    def is_empty(self) -> bool:
        """No filter at all (Karmada ``emptyClusterAffinity``)."""
        return (self.labelSelector is None and self.fieldSelector is None
                and not self.clusterNames and not self.exclude)


def _affinity_name(v: str) -> str:
    # CRD: minLength 1, maxLength 32; Karmada ValidateClusterAffinities: content.IsLabelKey
    if not v:
        raise ValueError("must not be empty")
    if len(v) > 32:
        raise ValueError("must be at most 32 characters")
    return _qualified_name(v)


class OverflowClusterAffinity(ClusterAffinity):
    """One overflow group of a :class:`ClusterAffinityTerm` (Karmada 1.18)."""

    affinityName: StrictStr

    @field_validator("affinityName")
    @classmethod
    def _name(cls, v: str) -> str:
        return _affinity_name(v)


class ClusterAffinityTerm(ClusterAffinity):
    """One ordered cluster group of ``placement.clusterAffinities``: its ``affinityName``
    and the :class:`ClusterAffinity` fields inline (``allows`` applies to the group)."""

    affinityName: StrictStr
    overflowAffinities: list[OverflowClusterAffinity] | None = None

    @field_validator("affinityName")
    @classmethod
    def _name(cls, v: str) -> str:
        return _affinity_name(v)

    @model_validator(mode="after")
    def _overflow(self) -> ClusterAffinityTerm:
        # Karmada ValidateOverflowAffinities
        if self.overflowAffinities is None:
            return self
        if self.is_empty:
            raise ValueError(
                "@overflowAffinities can only be used together with the inline ClusterAffinity"
            )
        names = {self.affinityName}
        for i, oa in enumerate(self.overflowAffinities):
            if oa.affinityName in names:
                raise ValueError(
                    f"@overflowAffinities[{i}].affinityName {oa.affinityName!r} must be unique "
                    "and must not duplicate the primary group's affinityName"
                )
            names.add(oa.affinityName)
        return self


class Toleration(Strict):
    """A ``corev1.Toleration`` of a cluster taint. Karmada checks only the operator
    (``validateClusterTolerations``: ``Lt``/``Gt`` are refused); matching is Kubernetes'
    ``ToleratesTaint`` (an empty operator is ``Equal``; an empty key with ``Exists``
    tolerates every taint; an unknown operator or effect tolerates nothing)."""

    key: str | None = None
    operator: StrictStr | None = "Equal"
    value: str | None = None
    effect: StrictStr | None = None
    tolerationSeconds: Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | None = None

    @field_validator("operator")
    @classmethod
    def _operator(cls, v: str | None) -> str | None:
        if v in ("Lt", "Gt"):
            raise ValueError(
                f"{v!r} is not supported for cluster tolerations (\"\", Exists or Equal)"
            )
        return v


class StaticClusterWeight(Strict):
    targetCluster: ClusterAffinity
    weight: Annotated[StrictInt, Field(ge=1, le=2**63 - 1)]


class ClusterPreferences(Strict):
    staticWeightList: list[StaticClusterWeight] = Field(default_factory=list)
    dynamicWeight: Literal["AvailableReplicas"] | None = None


class ReplicaScheduling(Strict):
    replicaSchedulingType: Literal["Duplicated", "Divided"] = "Divided"
    replicaDivisionPreference: Literal["Aggregated", "Weighted"] | None = None
    customSchedulingType: Literal["Gang"] | None = None
    weightPreference: ClusterPreferences | None = None


def overflow_scheduling_allowed(rs: ReplicaScheduling | None) -> bool:
    """Karmada ``util.IsOverflowSchedulingAllowed``: Divided with Aggregated, or with
    Weighted and a dynamicWeight."""
    if rs is None or rs.replicaSchedulingType != "Divided":
        return False
    # the mutating webhook's SetReplicaDivisionPreferenceWeighted: Divided means Weighted
    preference = rs.replicaDivisionPreference or "Weighted"
    if preference == "Aggregated":
        return True
    if preference == "Weighted":
        return rs.weightPreference is not None and bool(rs.weightPreference.dynamicWeight)
    return False


class SpreadConstraint(Strict):
    spreadByField: Literal["cluster", "region", "zone", "provider"] | None = None
    spreadByLabel: StrictStr | None = None
    maxGroups: StrictInt = 0
    minGroups: StrictInt = 0

    @property
    def field(self) -> str:
        """spreadByField with the mutating webhook's default (``cluster`` when neither
        spreadByField nor spreadByLabel is set: ``SetDefaultSpreadConstraints``)."""
        if self.spreadByField:
            return self.spreadByField
        return "" if self.spreadByLabel else "cluster"


class WorkloadAffinityTerm(Strict):
    groupByLabelKey: QualifiedName


class WorkloadAffinity(Strict):
    affinity: WorkloadAffinityTerm | None = None
    antiAffinity: WorkloadAffinityTerm | None = None

    @model_validator(mode="after")
    def _distinct(self) -> WorkloadAffinity:
        # Karmada ValidateWorkloadAffinity
        a, b = self.affinity, self.antiAffinity
        if a is not None and b is not None and a.groupByLabelKey == b.groupByLabelKey:
            raise ValueError("affinity and antiAffinity must not use the same groupByLabelKey")
        return self


class Placement(Strict):
    clusterAffinity: ClusterAffinity | None = None
    clusterAffinities: list[ClusterAffinityTerm] | None = None
    clusterTolerations: list[Toleration] = Field(default_factory=list)
    replicaScheduling: ReplicaScheduling | None = None
    spreadConstraints: list[SpreadConstraint] = Field(default_factory=list)
    workloadAffinity: WorkloadAffinity | None = None

    @property
    def cluster_affinities(self) -> list[ClusterAffinityTerm]:
        """The ordered cluster groups of ``clusterAffinities`` (empty when not written)."""
        return list(self.clusterAffinities or [])

    @model_validator(mode="after")
    def _rules(self) -> Placement:
        # Karmada pkg/util/validation/validation.go ValidatePlacement
        if self.clusterAffinity is not None and self.clusterAffinities is not None:
            raise ValueError("@clusterAffinities cannot co-exist with clusterAffinity")
        allowed = overflow_scheduling_allowed(self.replicaScheduling)
        names: set[str] = set()
        for i, term in enumerate(self.cluster_affinities):
            if term.overflowAffinities is not None and not allowed:
                raise ValueError(
                    f"@clusterAffinities[{i}].overflowAffinities can only be used together "
                    "with dynamic weight or aggregated scheduling"
                )
            if term.affinityName in names:  # ValidateClusterAffinities
                raise ValueError(
                    f"@clusterAffinities[{i}].affinityName {term.affinityName!r}: each "
                    "affinity term in a policy must have a unique name"
                )
            names.add(term.affinityName)
        _spread_rules(self.spreadConstraints)
        return self


def _spread_rules(constraints: Sequence[SpreadConstraint]) -> None:
    """Karmada ``ValidateSpreadConstraint`` (after ``SetDefaultSpreadConstraints``)."""
    fields: set[str] = set()
    for i, c in enumerate(constraints):
        at = f"@spreadConstraints[{i}]"
        if c.spreadByField and c.spreadByLabel:
            raise ValueError(f"{at} spreadByLabel should not co-exist with spreadByField")
        if c.minGroups < 0:
            raise ValueError(f"{at}.minGroups lower than 0 is not allowed")
        if c.maxGroups < 0:
            raise ValueError(f"{at}.maxGroups lower than 0 is not allowed")
        min_groups = c.minGroups or 1  # the mutating webhook's default
        if c.maxGroups > 0 and c.maxGroups < min_groups:
            raise ValueError(f"{at}.maxGroups lower than minGroups is not allowed")
        if c.field:
            if c.field in fields:
                raise ValueError(f"{at} multiple {c.field} spread constraints are not allowed")
            fields.add(c.field)
    if fields and "cluster" not in fields:
        raise ValueError(
            "@spreadConstraints must include a spreadByField cluster constraint when any "
            "spreadByField is used"
        )


class DecisionConditions(Strict):
    tolerationSeconds: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)] = 300


class StatePreservationRule(Strict):
    """One value carried from the old copy's ``status`` to the new copy as a label."""

    #: Karmada validateStatePreservationRule: metav1validation.ValidateLabelName
    aliasLabelName: QualifiedName
    jsonPath: StrictStr


class StatePreservation(Strict):
    rules: list[StatePreservationRule]


class ApplicationFailover(Strict):
    #: required in a policy (the CRD; checked by :class:`Failover`), defaulted when the
    #: model is built on its own
    decisionConditions: DecisionConditions = Field(default_factory=DecisionConditions)
    purgeMode: PurgeMode = PurgeMode.GRACEFULLY
    gracePeriodSeconds: Int32 | None = None
    statePreservation: StatePreservation | None = None

    @field_validator("purgeMode", mode="before")
    @classmethod
    def _purge(cls, v: Any) -> PurgeMode:
        if isinstance(v, PurgeMode):
            return v
        if not isinstance(v, str) or v not in _PURGE_ALIASES:
            raise ValueError(
                f"{str(v)[:32]!r} is not a purgeMode (Immediately|Graciously|Never or "
                "Directly|Gracefully|Never)"
            )
        return _PURGE_ALIASES[v]

    @model_validator(mode="after")
    def _grace(self) -> ApplicationFailover:
        # Karmada ValidateApplicationFailover (the mutating webhook's
        # SetDefaultGracePeriodSeconds first gives Gracefully without one 600 s)
        if self.gracePeriodSeconds is not None and self.purgeMode != PurgeMode.GRACEFULLY:
            raise ValueError(
                f"@gracePeriodSeconds only applies to purgeMode Gracefully (Graciously), "
                f"not {self.purgeMode.value}"
            )
        if self.gracePeriodSeconds is not None and self.gracePeriodSeconds <= 0:
            raise ValueError("@gracePeriodSeconds must be greater than 0")
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _keep_spelling(cls, data: Any, handler: Any) -> ApplicationFailover:
        model: ApplicationFailover = handler(data)
        written = data.get("purgeMode") if isinstance(data, dict) else None
        if isinstance(written, str):
            model._written_purge_mode = written
        return model

    _written_purge_mode: str | None = PrivateAttr(default=None)

    @property
    def grace_seconds(self) -> int:
        return 600 if self.gracePeriodSeconds is None else self.gracePeriodSeconds

    @property
    def purge_mode_name(self) -> str:
        """purgeMode as the policy spells it (``Immediately`` stays ``Immediately``)."""
        return self._written_purge_mode or self.purgeMode.value


class ClusterFailover(Strict):
    """``failover.cluster``: how a copy on a failed cluster is purged, and what state
    moves with it (CRD enum: Directly or Gracefully)."""

    purgeMode: Literal["Directly", "Gracefully"] = "Gracefully"
    statePreservation: StatePreservation | None = None


class Failover(Strict):
    application: ApplicationFailover | None = None
    cluster: ClusterFailover | None = None

    @field_validator("application", mode="before")
    @classmethod
    def _decision_conditions(cls, v: Any) -> Any:
        # the CRD: ApplicationFailoverBehavior requires decisionConditions
        if isinstance(v, Mapping) and "decisionConditions" not in v:
            raise ValueError("@decisionConditions is required")
        return v


class SuspendClusters(Strict):
    clusterNames: list[StrictStr] = Field(default_factory=list)


class Suspension(Strict):
    scheduling: StrictBool = False
    dispatching: StrictBool | None = None
    dispatchingOnClusters: SuspendClusters | None = None

    @model_validator(mode="after")
    def _dispatching(self) -> Suspension:
        # Karmada validateSuspension
        on = self.dispatchingOnClusters
        if self.dispatching and on is not None and on.clusterNames:
            raise ValueError(
                "@dispatching cannot co-exist with dispatchingOnClusters.clusterNames"
            )
        return self


class SchedulePriority(Strict):
    priorityClassSource: Literal["KubePriorityClass"]
    priorityClassName: StrictStr


class PropagationPolicySpec(Strict):
    resourceSelectors: list[ResourceSelector] = Field(min_length=1)
    association: StrictBool = False
    priority: Int32 = 0
    preemption: Literal["Always", "Never"] = "Never"
    propagateDeps: StrictBool = False
    suspension: Suspension | None = None
    placement: Placement = Field(default_factory=Placement)
    failover: Failover | None = None
    conflictResolution: Literal["Abort", "Overwrite"] | None = None
    schedulerName: str | None = None
    dependentOverrides: list[StrictStr] | None = None
    activationPreference: Literal["Lazy"] | None = None
    preserveResourcesOnDeletion: StrictBool | None = None
    schedulePriority: SchedulePriority | None = None

    @model_validator(mode="after")
    def _rules(self) -> PropagationPolicySpec:
        # Karmada ValidatePropagationSpec
        if self.failover is not None and self.failover.application is not None and (
            not self.propagateDeps
        ):
            raise ValueError(
                "@propagateDeps must be true when spec.failover.application is set"
            )
        if self.preemption == "Always":  # validateResourceSelectorsIfPreemptionEnabled
            for i, sel in enumerate(self.resourceSelectors):
                if not sel.name:
                    raise ValueError(
                        f"@resourceSelectors[{i}].name cannot be empty if preemption is "
                        "Always, the empty name may cause unexpected resources preemption"
                    )
        return self


class PropagationPolicy(Strict):
    apiVersion: Literal["policy.one.alibabacloud.com/v1alpha1", "policy.karmada.io/v1alpha1"]
    kind: Literal["PropagationPolicy"]
    metadata: ObjectMeta
    spec: PropagationPolicySpec
    status: dict[str, Any] | None = None

    @property
    def registry_key(self) -> str:
        """Its key in the fleet registry: ``ns/name`` (a ClusterPropagationPolicy: its
        bare name, which can never collide, a namespace holding no ``/``)."""
        return f"{self.metadata.namespace}/{self.metadata.name}"

    @property
    def ref(self) -> str:
        """``PropagationPolicy ns/name``, as messages name it."""
        return f"{self.kind} {self.metadata.namespace}/{self.metadata.name}"

    def _check_selector_namespaces(self) -> None:
        # Karmada validateResourceSelectors: a selector's namespace (the mutating webhook
        # fills an empty one with the policy's) must be the policy's namespace
        for i, sel in enumerate(self.spec.resourceSelectors):
            if sel.namespace and sel.namespace != self.metadata.namespace:
                raise ValueError(
                    f"@spec.resourceSelectors[{i}].namespace {sel.namespace[:63]!r}: namespace "
                    "of resource selector must be the same as the namespace of the policy "
                    f"({self.metadata.namespace})"
                )

    @model_validator(mode="after")
    def _policy_rules(self) -> PropagationPolicy:
        self._check_selector_namespaces()
        value = self.metadata.annotations.get(FENCING_ANNOTATION)
        if value is not None and value not in FENCING_MODES:
            raise ValueError(
                f"@metadata.annotations.{FENCING_ANNOTATION} must be one of "
                f"{', '.join(FENCING_MODES)} (got {value[:32]!r})"
            )
        fo = self.application_failover
        if value == "Strict" and fo is not None and fo.purgeMode != PurgeMode.DIRECTLY:
            raise ValueError(
                f"@metadata.annotations.{FENCING_ANNOTATION} Strict needs "
                f"spec.failover.application.purgeMode Immediately (Directly), not "
                f"{fo.purge_mode_name}: it never lets an old copy run beside the new one"
            )
        return self

    @property
    def strict_fencing(self) -> bool:
        """``fleetq.io/fencing: Strict``: a failover never starts the new copy before the
        old one is confirmed gone (it waits for an unreachable member to come back)."""
        return self.metadata.annotations.get(FENCING_ANNOTATION) == "Strict"

    @property
    def queued(self) -> bool:
        return bool(self.spec.suspension and self.spec.suspension.scheduling)

    @property
    def application_failover(self) -> ApplicationFailover | None:
        return self.spec.failover.application if self.spec.failover else None

    @property
    def cluster_failover(self) -> ClusterFailover | None:
        """``failover.cluster``: how the job leaves a failed cluster (None: as its
        application failover says)."""
        return self.spec.failover.cluster if self.spec.failover else None


class ClusterObjectMeta(ObjectMeta):
    """A cluster-scoped object's metadata: it has no namespace. One written anyway is
    cleared, as kube-apiserver clears it (``rest.BeforeCreate`` ->
    ``EnsureObjectNamespaceMatchesRequestNamespace``: "cluster-scoped, clear namespace");
    :func:`upstream_warnings` names it."""

    namespace: str = ""

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return v  # cleared by the object's own validator, never checked (upstream)


class ClusterPropagationPolicy(PropagationPolicy):
    """Karmada's cluster-wide policy (``policy.karmada.io/v1alpha1``, scope Cluster; ACK
    One serves it as ``policy.one.alibabacloud.com``): the same ``spec`` as a
    PropagationPolicy, validated by the same ``ValidatePropagationSpec`` with an empty
    policy namespace, so its resourceSelectors may name any namespace (or none: every
    namespace). A namespaced PropagationPolicy that matches a job always wins over it
    (Karmada ``propagateResource``: the namespace's policies first, then the cluster's)."""

    kind: Literal["ClusterPropagationPolicy"]  # type: ignore[assignment]
    metadata: ClusterObjectMeta
    _cleared_namespace: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _cluster_scope(self) -> ClusterPropagationPolicy:
        if self.metadata.namespace:
            self._cleared_namespace = self.metadata.namespace
            self.metadata.namespace = ""
        return self

    def _check_selector_namespaces(self) -> None:
        return None  # validateResourceSelectors returns early for an empty policy namespace

    @property
    def registry_key(self) -> str:
        return self.metadata.name

    @property
    def ref(self) -> str:
        return f"{self.kind} {self.metadata.name}"

    @property
    def cleared_namespace(self) -> str:
        """The ``metadata.namespace`` written on it (cleared), or ``""``."""
        return self._cleared_namespace


# --------------------------------------------------------------------------- PyTorchJob

ROLES = ("Master", "Worker")
#: The container the training-operator configures (``PyTorchJobDefaultContainerName``).
PYTORCH_CONTAINER = "pytorch"


class PodTemplate(Open):
    """A pod template, kept verbatim; we only check the parts we compute with."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: dict[str, Any]

    @field_validator("spec")
    @classmethod
    def _spec(cls, spec: dict[str, Any]) -> dict[str, Any]:
        containers = spec.get("containers")
        if not isinstance(containers, list) or not containers:
            raise ValueError("@containers must list at least one container")
        for key in ("containers", "initContainers"):
            _check_container_list(spec, key)
        _check_webhook_containers(containers)
        _list_map_keys(spec)
        _check_node_selector(spec.get("nodeSelector"))
        _check_tolerations(spec.get("tolerations"))
        try:
            resource_map(spec.get("overhead"))
        except ValueError as exc:
            raise _under("overhead", exc) from None
        _check_priority(spec)
        return spec


def _check_container_list(spec: Mapping[str, Any], key: str) -> None:
    """Each item of ``spec[key]`` is a named container whose requests and limits parse."""
    items = spec.get(key) or []
    if not isinstance(items, list):
        raise ValueError(f"@{key} must be a list")
    for i, c in enumerate(items):
        if not isinstance(c, Mapping):
            raise ValueError(f"@{key}[{i}] must be a mapping")
        if not isinstance(c.get("name"), str) or not c.get("name"):
            raise ValueError(f"@{key}[{i}].name is required")
        res = c.get("resources") or {}
        if not isinstance(res, Mapping):
            raise ValueError(f"@{key}[{i}].resources must be a mapping")
        for part in ("requests", "limits"):
            try:
                resource_map(res.get(part))
            except ValueError as exc:
                raise _under(f"{key}[{i}].resources.{part}", exc) from None


def _check_webhook_containers(containers: list[Any]) -> None:
    # The training-operator webhook: every container has an image, and one of them is
    # named "pytorch" (the one the operator gives the master address and port).
    for i, c in enumerate(containers):
        image = c.get("image")
        if not isinstance(image, str) or not image:
            raise ValueError(f"@containers[{i}].image is required")
    if not any(c.get("name") == PYTORCH_CONTAINER for c in containers):
        raise ValueError(f"@containers must have a container named {PYTORCH_CONTAINER}")


def _check_node_selector(selector: Any) -> None:
    if selector is None:
        return
    if not isinstance(selector, Mapping):
        raise ValueError("@nodeSelector must be a mapping")
    for k, v in selector.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"@nodeSelector {str(k)[:64]!r} must map to a string")


def _check_tolerations(tolerations: Any) -> None:
    if tolerations is None:
        return
    if not isinstance(tolerations, list):
        raise ValueError("@tolerations must be a list")
    for i, t in enumerate(tolerations):
        if not isinstance(t, Mapping):
            raise ValueError(f"@tolerations[{i}] must be a mapping")


def _check_priority(spec: Mapping[str, Any]) -> None:
    prio = spec.get("priority")
    if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)):
        raise ValueError("@priority must be an integer")
    if prio is not None and abs(prio) > 2_000_001_000:
        raise ValueError("@priority is out of range")
    pcn = spec.get("priorityClassName")
    if pcn is not None and not isinstance(pcn, str):
        raise ValueError("@priorityClassName must be a string")


#: The pod template's lists the CRD types ``x-kubernetes-list-type: map``, with their keys
#: (kubeflow.org_pytorchjobs.yaml): the API server refuses two items with the same key.
#: A missing ``protocol`` is the CRD's default, TCP.
_POD_LIST_MAPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("containers", ("name",)),
    ("initContainers", ("name",)),
    ("ephemeralContainers", ("name",)),
    ("volumes", ("name",)),
    ("imagePullSecrets", ("name",)),
    ("hostAliases", ("ip",)),
    ("resourceClaims", ("name",)),
    ("schedulingGates", ("name",)),
    ("topologySpreadConstraints", ("topologyKey", "whenUnsatisfiable")),
)
_CONTAINER_LIST_MAPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("env", ("name",)),
    ("ports", ("containerPort", "protocol")),
    ("volumeMounts", ("mountPath",)),
    ("volumeDevices", ("devicePath",)),
    ("resources.claims", ("name",)),
)


def _duplicate_key(items: Any, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(items, list):
        return
    seen: dict[tuple[Any, ...], int] = {}
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        key = tuple(item.get(k, "TCP" if k == "protocol" else None) for k in keys)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key value: not ours to judge
            continue
        if first is not None:
            shown = ", ".join(f"{k} {v!r}" for k, v in zip(keys, key, strict=True))
            raise ValueError(
                f"@{where}[{i}] duplicates {where}[{first}] ({shown}); the CRD keys this "
                f"list by {' and '.join(keys)}"
            )
        seen[key] = i


def _list_map_keys(spec: Mapping[str, Any]) -> None:
    """Refuse two items with the same key in a list the PyTorchJob CRD types as a map."""
    for name, keys in _POD_LIST_MAPS:
        _duplicate_key(spec.get(name), keys, name)
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(kind) or []):
            if not isinstance(c, Mapping):
                continue
            for name, keys in _CONTAINER_LIST_MAPS:
                value: Any = c
                for part in name.split("."):
                    value = value.get(part) if isinstance(value, Mapping) else None
                _duplicate_key(value, keys, f"{kind}[{i}].{name}")


class ReplicaSpec(Open):
    #: Unset means 1 for Worker (the operator's default) and is refused for Master (the
    #: webhook wants ``Master.replicas`` written and equal to 1). The webhook refuses a
    #: Worker below 1 (checked by :class:`PyTorchJobSpec`); 10,000 is fleetq's own bound.
    replicas: Annotated[StrictInt, Field(ge=-(2**31), le=10_000)] | None = None
    restartPolicy: Literal["Always", "OnFailure", "Never", "ExitCode"] | None = None
    template: PodTemplate

    @property
    def count(self) -> int:
        """Replicas with the operator's default (1) applied."""
        return 1 if self.replicas is None else self.replicas


#: ``int32`` and ``int64`` fields of the v1 API: the CRD types them, and the operator
#: decodes them into Go integers of that width. Upstream sets no minimum on any of them
#: (``Int32`` is defined with the PropagationPolicy models above).
Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]


class CleanPodPolicy(StrEnum):
    """``runPolicy.cleanPodPolicy``: which pods the operator deletes once the job ends."""

    NONE = "None"
    RUNNING = "Running"
    ALL = "All"


#: ``runPolicy.managedBy`` values the training-operator webhook accepts.
MANAGED_BY_TRAINING_OPERATOR = "kubeflow.org/training-operator"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"
MANAGED_BY_VALUES = (MANAGED_BY_TRAINING_OPERATOR, MANAGED_BY_MULTIKUEUE)


class SchedulingPolicy(Strict):
    """``runPolicy.schedulingPolicy`` (kubeflow.org/v1 ``SchedulingPolicy``)."""

    minAvailable: Int32 | None = None
    queue: StrictStr | None = None
    minResources: dict[str, Any] | None = None
    priorityClass: StrictStr | None = None
    scheduleTimeoutSeconds: Int32 | None = None

    @field_validator("minResources", mode="before")
    @classmethod
    def _min_resources(cls, v: Any) -> dict[str, Any] | None:
        return None if v is None else resource_map(v)


class RunPolicy(Strict):
    """``spec.runPolicy`` (kubeflow.org/v1 ``RunPolicy``). Forwarded to the member as
    written; fleetq itself acts on ``schedulingPolicy``, ``activeDeadlineSeconds``,
    ``ttlSecondsAfterFinished`` and ``suspend``."""

    #: a string in the CRD (no enum, no webhook check): kept as written; the operator
    #: knows None, Running and All
    cleanPodPolicy: StrictStr | None = None
    ttlSecondsAfterFinished: Int32 | None = None
    activeDeadlineSeconds: Int64 | None = None
    backoffLimit: Int32 | None = None
    schedulingPolicy: SchedulingPolicy | None = None
    suspend: StrictBool | None = None
    managedBy: StrictStr | None = None

    @field_validator("managedBy")
    @classmethod
    def _managed_by(cls, v: str | None) -> str | None:
        if v is not None and v not in MANAGED_BY_VALUES:
            raise ValueError(
                f"{v[:64]!r} is not supported ({', '.join(MANAGED_BY_VALUES)})"
            )
        return v


class RDZVConf(Strict):
    key: StrictStr | None = None
    value: StrictStr | None = None


class ElasticPolicy(Strict):
    """``spec.elasticPolicy`` (kubeflow.org/v1 ``ElasticPolicy``): torchrun's elastic
    launch. Workers may run anywhere between ``minReplicas`` and ``maxReplicas``."""

    minReplicas: Int32 | None = None
    maxReplicas: Int32 | None = None
    rdzvBackend: StrictStr | None = None  # c10d, etcd, etcd-v2 (not an enum upstream)
    rdzvPort: Int32 | None = None
    rdzvHost: StrictStr | None = None
    rdzvId: StrictStr | None = None
    rdzvConf: list[RDZVConf] | None = None
    standalone: StrictBool | None = None
    nProcPerNode: Int32 | None = None  # deprecated upstream in favour of spec.nprocPerNode
    maxRestarts: Int32 | None = None
    metrics: list[dict[str, Any]] | None = None  # autoscaling/v2 MetricSpec, verbatim


class PyTorchJobSpec(Open):
    runPolicy: RunPolicy | None = None
    elasticPolicy: ElasticPolicy | None = None
    pytorchReplicaSpecs: dict[str, ReplicaSpec]
    nprocPerNode: StrictStr | None = None

    @field_validator("pytorchReplicaSpecs", mode="before")
    @classmethod
    def _role_names(cls, specs: Any) -> Any:
        # Checked before the replica specs themselves, so that a misspelt role is
        # reported as such rather than as a problem inside it.
        if isinstance(specs, Mapping):
            for role in specs:
                if role not in ROLES:
                    raise ValueError(
                        f"{str(role)[:64]!r} is not a PyTorchJob replica type (Master, Worker)"
                    )
            if not specs:
                raise ValueError("must have Master, Worker or both")
        return specs

    @field_validator("pytorchReplicaSpecs")
    @classmethod
    def _roles(cls, specs: dict[str, ReplicaSpec]) -> dict[str, ReplicaSpec]:
        # training-operator pkg/webhooks/pytorch/pytorchjob_webhook.go
        # validatePyTorchReplicaSpecs: Master exactly 1, every other type at least 1
        master = specs.get("Master")
        if master is not None and master.replicas != 1:
            raise ValueError("@Master.replicas must be 1")
        for role, rs in specs.items():
            if role != "Master" and rs.replicas is not None and rs.replicas < 1:
                raise ValueError(f"@{role}.replicas must be at least 1")
        return specs

    @model_validator(mode="after")
    def _elastic(self) -> PyTorchJobSpec:
        elastic = self.elasticPolicy
        if elastic is None:
            return self
        if elastic.nProcPerNode is not None and self.nprocPerNode is not None:
            raise ValueError("@elasticPolicy.nProcPerNode must not be used with spec.nprocPerNode")
        if "Worker" not in self.pytorchReplicaSpecs:
            raise ValueError(
                "@pytorchReplicaSpecs.Worker is required (must be configured if elasticPolicy "
                "is used)"
            )
        return self


#: A DNS-1035 label: what the training-operator webhook requires of a job's name.
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


class JobMeta(ObjectMeta):
    """A PyTorchJob's metadata: the name is a DNS-1035 label, as the webhook checks."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v:
            raise ValueError("must not be empty")
        if len(v) > 63 or not DNS1035_LABEL.fullmatch(v):
            raise ValueError(
                f"{v[:64]!r} is not a DNS-1035 label (lowercase letters, digits and '-', "
                "starting with a letter, ending with a letter or digit, at most 63 characters)"
            )
        return v


class PyTorchJob(BaseModel):
    model_config = ConfigDict(extra="forbid")
    apiVersion: Literal["kubeflow.org/v1"]
    kind: Literal["PyTorchJob"]
    metadata: JobMeta
    spec: PyTorchJobSpec
    status: dict[str, Any] | None = None

    @property
    def ref(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def roles(self) -> tuple[str, ...]:
        """The replica types this job has, Master first: ``("Master", "Worker")``,
        ``("Master",)`` or ``("Worker",)``."""
        return tuple(r for r in ROLES if r in self.spec.pytorchReplicaSpecs)

    def replicas(self, role: str) -> int:
        """Declared replicas of ``role`` (0 when the job has no such role)."""
        spec = self.spec.pytorchReplicaSpecs.get(role)
        return spec.count if spec else 0

    # -- runPolicy, typed, for the workflow

    @property
    def run_policy(self) -> RunPolicy:
        """``spec.runPolicy`` (an empty one when not written)."""
        return self.spec.runPolicy or RunPolicy()

    @property
    def active_deadline_seconds(self) -> int | None:
        """``runPolicy.activeDeadlineSeconds`` as written, or None. Upstream counts it
        from the job's start and sets no minimum: 0 or less means the deadline is already
        past when the job starts."""
        return self.run_policy.activeDeadlineSeconds

    @property
    def ttl_seconds_after_finished(self) -> int | None:
        """``runPolicy.ttlSecondsAfterFinished`` as written, or None (keep forever). The
        member's operator deletes the finished job that long after it finished."""
        return self.run_policy.ttlSecondsAfterFinished

    @property
    def suspend(self) -> bool:
        """``runPolicy.suspend``; unset means False (the CRD's default)."""
        return bool(self.run_policy.suspend)

    @property
    def clean_pod_policy(self) -> CleanPodPolicy:
        """``runPolicy.cleanPodPolicy`` with the operator's default for PyTorchJob
        (``None``: keep every pod) applied; a value the operator does not know counts
        as that default too."""
        written = self.run_policy.cleanPodPolicy
        known = {p.value: p for p in CleanPodPolicy}
        return known.get(written or "", CleanPodPolicy.NONE)

    @property
    def scheduling_policy(self) -> SchedulingPolicy | None:
        return self.run_policy.schedulingPolicy


# --------------------------------------------------------------------------- PriorityClass


class PriorityClass(Open):
    apiVersion: Literal["scheduling.k8s.io/v1"]
    kind: Literal["PriorityClass"]
    metadata: ObjectMeta
    value: Annotated[StrictInt, Field(ge=-2_147_483_648, le=1_000_000_000)]
    globalDefault: StrictBool = False


BUILTIN_PRIORITY_CLASSES: dict[str, int] = {
    "system-cluster-critical": 2_000_000_000,
    "system-node-critical": 2_000_001_000,
}

# --------------------------------------------------------------------------- parsing

FleetObject = ElasticQuotaTree | PropagationPolicy | PyTorchJob | PriorityClass

KINDS: dict[str, type[BaseModel]] = {
    "ElasticQuotaTree": ElasticQuotaTree,
    "PropagationPolicy": PropagationPolicy,
    "ClusterPropagationPolicy": ClusterPropagationPolicy,
    "PyTorchJob": PyTorchJob,
    "PriorityClass": PriorityClass,
}


#: the kinds that have no namespace (their messages name them by name alone)
CLUSTER_SCOPED = frozenset({"PriorityClass", "ClusterPropagationPolicy"})


def object_ref(doc: Any) -> str:
    """``<Kind> <ns>/<name>`` for error messages, as well as the document allows."""
    if not isinstance(doc, Mapping):
        return "document"

    def text(v: Any, limit: int) -> str:
        return _one_line(v[:limit]) if isinstance(v, str) else ""

    kind = text(doc.get("kind"), 64) or "object"
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    name = text(meta.get("name"), 80) or "<unnamed>"
    if kind in CLUSTER_SCOPED:
        return f"{kind} {name}"
    return f"{kind} {text(meta.get('namespace'), 63) or 'default'}/{name}"


def parse_object(doc: Any) -> FleetObject:
    """Validate one decoded document into its model, or raise :class:`ManifestErrors`."""
    ref = object_ref(doc)
    if not isinstance(doc, Mapping):
        raise ManifestErrors(
            [ManifestError("document", "", "must be a mapping (a Kubernetes object)")]
        )
    kind = doc.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ManifestErrors([ManifestError(ref, "kind", "is required")])
    model = KINDS.get(kind)
    if model is None:
        raise ManifestErrors(
            [
                ManifestError(
                    ref, "kind", f"{kind[:64]!r} is not supported (one of {', '.join(KINDS)})"
                )
            ]
        )
    try:
        return model.model_validate(dict(doc))  # type: ignore[return-value]
    except ValidationError as exc:
        raise errors_from_validation(ref, exc) from None


def parse_job(doc: Any) -> PyTorchJob:
    obj = parse_object(doc)
    if not isinstance(obj, PyTorchJob):
        raise ManifestErrors([ManifestError(object_ref(doc), "kind", "must be PyTorchJob")])
    return obj


def parse_policy(doc: Any) -> PropagationPolicy:
    """A PropagationPolicy or a ClusterPropagationPolicy (a subclass: the same spec)."""
    obj = parse_object(doc)
    if not isinstance(obj, PropagationPolicy):
        raise ManifestErrors([ManifestError(
            object_ref(doc), "kind", "must be PropagationPolicy or ClusterPropagationPolicy")])
    return obj


def parse_tree(doc: Any) -> ElasticQuotaTree:
    obj = parse_object(doc)
    if not isinstance(obj, ElasticQuotaTree):
        raise ManifestErrors([ManifestError(object_ref(doc), "kind", "must be ElasticQuotaTree")])
    return obj


# --------------------------------------------------------------------------- accepted, not used

#: Why fleetq takes a field upstream defines without acting on it (one warning each).
_NOT_USED = "accepted, not used by fleetq"
_ONE_CLUSTER = f"{_NOT_USED} (a gang goes to one cluster)"


def _policy_warnings(p: PropagationPolicy) -> list[tuple[str, str]]:
    spec = p.spec
    return [*_spec_warnings(spec), *_suspension_warnings(spec.suspension),
            *_placement_warnings(spec.placement)]


def _spec_warnings(spec: PropagationPolicySpec) -> list[tuple[str, str]]:
    """The policy's top-level fields fleetq does not act on."""
    written = spec.model_fields_set
    out: list[tuple[str, str]] = []
    if "association" in written:
        out.append(("spec.association", f"{_NOT_USED} (deprecated upstream for propagateDeps, "
                                         "which fleetq honours)"))
    if spec.preemption == "Always":
        out.append(("spec.preemption", f"{_NOT_USED} (policies do not take jobs from each "
                                       "other; job preemption is the tree's "
                                       "fleetq.io/preemption)"))
    if spec.conflictResolution is not None:
        out.append(("spec.conflictResolution", _NOT_USED))
    if spec.schedulerName not in (None, "default-scheduler"):
        out.append(("spec.schedulerName", f"{_NOT_USED} (fleetq schedules every job itself)"))
    if spec.dependentOverrides is not None:
        out.append(("spec.dependentOverrides", f"{_NOT_USED} (fleetq has no OverridePolicy)"))
    if spec.activationPreference is not None:
        out.append(("spec.activationPreference", _NOT_USED))
    if spec.preserveResourcesOnDeletion is not None:
        out.append(("spec.preserveResourcesOnDeletion",
                    f"{_NOT_USED} (deleting a job deletes its member copy)"))
    if spec.schedulePriority is not None:
        out.append(("spec.schedulePriority", f"{_NOT_USED} (a job's queue priority comes from "
                                             "its own PriorityClass)"))
    return out


def _suspension_warnings(sus: Suspension | None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if sus is not None and sus.dispatching is not None:
        out.append(("spec.suspension.dispatching", f"{_NOT_USED} (suspension.scheduling "
                                                   "queues jobs)"))
    if sus is not None and sus.dispatchingOnClusters is not None:
        out.append(("spec.suspension.dispatchingOnClusters", _NOT_USED))
    return out


def _placement_warnings(pl: Placement) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if pl.clusterAffinity is not None and pl.clusterAffinity.fieldSelector is not None:
        out.append(("spec.placement.clusterAffinity.fieldSelector",
                    f"{_NOT_USED} (member clusters have no provider, region or zone; use "
                    "labelSelector)"))
    for i, term in enumerate(pl.cluster_affinities):  # the groups are honoured
        out.extend(_affinity_term_warnings(term, f"spec.placement.clusterAffinities[{i}]"))
    if pl.spreadConstraints:
        out.append(("spec.placement.spreadConstraints", _ONE_CLUSTER))
    rs = pl.replicaScheduling
    if rs is not None and rs.replicaDivisionPreference is not None:
        out.append(("spec.placement.replicaScheduling.replicaDivisionPreference", _ONE_CLUSTER))
    if rs is not None and rs.weightPreference is not None:
        out.append(("spec.placement.replicaScheduling.weightPreference", _ONE_CLUSTER))
    if pl.workloadAffinity is not None:
        out.append(("spec.placement.workloadAffinity", _NOT_USED))
    return out


def _affinity_term_warnings(term: ClusterAffinityTerm, at: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if term.fieldSelector is not None:
        out.append((f"{at}.fieldSelector", f"{_NOT_USED} (member clusters have no "
                                           "provider, region or zone; use labelSelector)"))
    for j, oa in enumerate(term.overflowAffinities or []):
        if oa.fieldSelector is not None:
            out.append((f"{at}.overflowAffinities[{j}].fieldSelector", _NOT_USED))
    return out


def _tree_warnings(t: ElasticQuotaTree) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []

    def walk(node: QuotaNodeSpec, path: str) -> None:
        if node.attributes:
            out.append((f"{path}.attributes", _NOT_USED))
        for i, c in enumerate(node.children):
            walk(c, f"{path}.children[{i}]")

    walk(t.spec.root, "spec.root")
    return out


def _job_warnings(j: PyTorchJob) -> list[tuple[str, str]]:
    elastic = j.spec.elasticPolicy
    if elastic is not None and elastic.nProcPerNode is not None:
        # the training-operator webhook's own admission warning (validateSpec)
        return [("spec.elasticPolicy.nProcPerNode", "is deprecated, use spec.nprocPerNode "
                                                    "instead")]
    return []


def upstream_warnings(obj: FleetObject) -> list[str]:
    """One line per field upstream defines that fleetq accepts without acting on it
    (``PropagationPolicy default/p: spec.placement.spreadConstraints accepted, not used
    by fleetq (a gang goes to one cluster)``), in field order. Fields fleetq honours and
    fields left unwritten give none."""
    if isinstance(obj, ClusterPropagationPolicy):
        found = _policy_warnings(obj)
        if obj.cleared_namespace:
            found.insert(0, ("metadata.namespace", f"{obj.cleared_namespace[:63]!r} ignored: "
                                                   "ClusterPropagationPolicy is cluster-scoped "
                                                   "(the API server clears it)"))
        return [str(ManifestError(obj.ref, path, message)) for path, message in found]
    if isinstance(obj, PropagationPolicy):
        found = _policy_warnings(obj)
    elif isinstance(obj, ElasticQuotaTree):
        found = _tree_warnings(obj)
    elif isinstance(obj, PyTorchJob):
        found = _job_warnings(obj)
    else:
        found = []
    ref = f"{obj.kind} {obj.metadata.namespace}/{obj.metadata.name}"
    return [str(ManifestError(ref, path, message)) for path, message in found]


# --------------------------------------------------------------------------- gang extraction


@dataclass(frozen=True)
class GangPod:
    """One pod of a gang, with Kubernetes defaulting applied to its requests."""

    role: str  # "master" | "worker"
    index: int
    requests: R.Resources
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()

    @property
    def name_suffix(self) -> str:
        return f"{self.role}-{self.index}"


@dataclass(frozen=True)
class Gang:
    """The pods of one PyTorchJob that must start together on one cluster.

    ``pods`` is the gang quota and placement use: every replica, or, when the job may
    start smaller (``runPolicy.schedulingPolicy.minAvailable``, ``elasticPolicy``), the
    smallest set it may start with (see :func:`gang_minimum`). ``declared`` counts the
    replicas the manifest asks for per role; the member copy keeps them as written.
    ``minimum_source`` names the field that made the gang smaller (empty when it is every
    replica)."""

    pods: tuple[GangPod, ...]
    priority: int
    declared: tuple[tuple[str, int], ...] = ()
    minimum_source: str = ""

    @property
    def total(self) -> R.Resources:
        acc: R.Resources = {}
        for p in self.pods:
            R.add_into(acc, p.requests)
        return acc

    def role_counts(self) -> dict[str, int]:
        """Pods of the gang per role (``{"master": 1, "worker": 2}``), Master first."""
        counts: dict[str, int] = {}
        for p in self.pods:
            counts[p.role] = counts.get(p.role, 0) + 1
        return counts

    def declared_role_counts(self) -> dict[str, int]:
        """Replicas per role as the manifest declares them (what the member runs once
        there is room); the gang's own counts when built without a manifest."""
        return dict(self.declared) if self.declared else self.role_counts()

    @property
    def declared_pods(self) -> int:
        """M: every replica the manifest declares."""
        return sum(self.declared_role_counts().values())

    @property
    def is_minimum(self) -> bool:
        """True when quota and placement use fewer pods than the manifest declares."""
        return len(self.pods) < self.declared_pods

    def minimum_line(self) -> str:
        """One line for ``describe``: ``gang minimum 2 of 5 pods (elasticPolicy.minReplicas)``
        when a minimum applies, else ``gang of 3 pods (every replica)``."""
        if self.minimum_source:
            return (
                f"gang minimum {len(self.pods)} of {self.declared_pods} pods "
                f"({self.minimum_source})"
            )
        n = len(self.pods)
        return f"gang of {n} pod{'' if n == 1 else 's'} (every replica)"

    def summary_line(self, namespace: str, name: str) -> str:
        """The job's one-line summary (Web UI, ``describe``): ``PyTorchJob
        default/pytorch-test: 1 master + 2 workers, cpu 4.01, memory 4Gi``, with the
        gang minimum where one applies (resources are the minimum's)."""
        roles = " + ".join(
            f"{n} {role}{'s' if n != 1 and role == 'worker' else ''}"
            for role, n in self.declared_role_counts().items()
        )
        if self.is_minimum:
            roles += f" (gang minimum {len(self.pods)})"
        return f"PyTorchJob {namespace}/{name}: {roles}, {R.format_resources(self.total)}"


def pod_requests(pod_spec: Mapping[str, Any]) -> R.Resources:
    """Effective requests of a pod the way kube-scheduler computes them: per container,
    requests default to limits; sum over containers; max with each init container;
    plus pod overhead.

    Sidecars (init containers with ``restartPolicy: Always``) keep running, so, as in
    Kubernetes' ``resourcehelper.PodRequests``, they add to the regular containers and
    to every init container that starts after them."""

    def container(c: Mapping[str, Any]) -> R.Resources:
        res = c.get("resources") or {}
        limits = R.parse_resources(res.get("limits"))
        requests = R.parse_resources(res.get("requests"))
        return {**limits, **requests}

    total: R.Resources = {}
    for c in pod_spec.get("containers") or []:
        R.add_into(total, container(c))
    sidecars: R.Resources = {}
    init_peak: R.Resources = {}
    for c in pod_spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            R.add_into(sidecars, container(c))
            during = dict(sidecars)
        else:
            during = R.add(sidecars, container(c))
        init_peak = R.maximum((init_peak, during))
    R.add_into(total, sidecars)
    total = R.maximum((total, init_peak))
    R.add_into(total, R.parse_resources(pod_spec.get("overhead")))
    return {k: v for k, v in total.items() if v}


def job_priority(job: PyTorchJob, priority_classes: Mapping[str, int] | None = None) -> int:
    """The job's priority: the PriorityClass value of
    ``runPolicy.schedulingPolicy.priorityClass``, else of the pod templates'
    ``priorityClassName``, else ``spec.template.spec.priority``, else 0 (Master's
    template before Worker's). A class that is not known is skipped."""
    classes = {**BUILTIN_PRIORITY_CLASSES, **(priority_classes or {})}
    sp = job.scheduling_policy
    if sp is not None and sp.priorityClass and sp.priorityClass in classes:
        return classes[sp.priorityClass]
    specs = [job.spec.pytorchReplicaSpecs[role].template.spec for role in job.roles()]
    for spec in specs:
        pcn = spec.get("priorityClassName")
        if pcn and pcn in classes:
            return classes[pcn]
    for spec in specs:
        prio = spec.get("priority")
        if isinstance(prio, int):
            return prio
    return 0


@dataclass(frozen=True)
class GangMinimum:
    """How many pods of each role the smallest startable gang has, and why."""

    counts: tuple[tuple[str, int], ...]  # (role, pods), Master first
    source: str  # "" (every replica) or the field that set it

    @property
    def pods(self) -> int:
        return sum(n for _, n in self.counts)


def gang_minimum(
    declared: Sequence[tuple[str, int]],
    min_available: int | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    elastic: bool = False,
    role_priority: Mapping[str, int] | None = None,
) -> GangMinimum:
    """The smallest gang a job may start with, from its declared ``(role, replicas)``.

    * ``runPolicy.schedulingPolicy.minAvailable`` set: it is the gang's size, as the
      training-operator makes it the PodGroup's ``minMember`` (``elasticPolicy`` does not
      change that). Its pods are taken as the operator's ``calcPGMinResources`` takes
      them: roles by PriorityClass value, highest first (``role_priority``; ties keep
      Master before Worker), in index order. Upstream does not bound it; we clamp it to
      1..every declared pod (a gang of 0 pods would hold no quota; a gang larger than the
      job could never be placed).
    * otherwise, ``elasticPolicy`` set: Master (if any) plus the Workers torchrun needs
      at least: ``minReplicas``, else ``maxReplicas``, else ``Worker.replicas`` (the
      operator's defaulting), clamped to 1..``Worker.replicas``.
    * otherwise every declared pod.
    """
    counts = [(role, max(0, n)) for role, n in declared]
    total = sum(n for _, n in counts)
    if min_available is not None and total > 0:
        want = min(max(min_available, 1), total)
        prio = role_priority or {}
        order = sorted(range(len(counts)), key=lambda i: (-prio.get(counts[i][0], 0), i))
        taken = dict.fromkeys((r for r, _ in counts), 0)
        left = want
        for i in order:
            role, n = counts[i]
            take = min(n, left)
            taken[role] = take
            left -= take
        out = tuple((r, taken[r]) for r, _ in counts if taken[r])
        return GangMinimum(out, "schedulingPolicy.minAvailable")
    workers = dict(counts).get("Worker", 0)
    if elastic and workers > 0:
        wanted = next(
            (v for v in (min_replicas, max_replicas) if v is not None), workers
        )
        keep = min(max(wanted, 1), workers)
        source = (
            "elasticPolicy.minReplicas" if min_replicas is not None
            else "elasticPolicy.maxReplicas" if max_replicas is not None
            else "elasticPolicy"
        )
        out = tuple((r, keep if r == "Worker" else n) for r, n in counts if n)
        return GangMinimum(out, source)
    return GangMinimum(tuple((r, n) for r, n in counts if n), "")


def job_gang_minimum(
    job: PyTorchJob, priority_classes: Mapping[str, int] | None = None
) -> GangMinimum:
    """:func:`gang_minimum` for a validated job."""
    classes = {**BUILTIN_PRIORITY_CLASSES, **(priority_classes or {})}
    declared = [(role, job.replicas(role)) for role in job.roles()]
    sp = job.scheduling_policy
    elastic = job.spec.elasticPolicy
    role_priority = {}
    for role in job.roles():
        pcn = job.spec.pytorchReplicaSpecs[role].template.spec.get("priorityClassName")
        role_priority[role] = classes.get(pcn, 0) if isinstance(pcn, str) else 0
    return gang_minimum(
        declared,
        min_available=sp.minAvailable if sp is not None else None,
        min_replicas=elastic.minReplicas if elastic is not None else None,
        max_replicas=elastic.maxReplicas if elastic is not None else None,
        elastic=elastic is not None,
        role_priority=role_priority,
    )


def gang_of(job: PyTorchJob, priority_classes: Mapping[str, int] | None = None) -> Gang:
    """The gang quota and placement use: the smallest set of pods the job may start
    with (every replica unless ``minAvailable`` or ``elasticPolicy`` allow fewer), with
    the job's priority. The manifest itself is not changed."""
    minimum = job_gang_minimum(job, priority_classes)
    keep = dict(minimum.counts)
    pods: list[GangPod] = []
    for role in job.roles():
        rs = job.spec.pytorchReplicaSpecs[role]
        spec = rs.template.spec
        req = pod_requests(spec)
        selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
        tolerations = tuple(
            dict(t) for t in spec.get("tolerations") or [] if isinstance(t, Mapping)
        )
        for i in range(keep.get(role, 0)):
            pods.append(GangPod(role.lower(), i, dict(req), selector, tolerations))
    declared = tuple(
        (role.lower(), job.replicas(role)) for role in job.roles() if job.replicas(role)
    )
    declared_pods = sum(n for _, n in declared)
    source = minimum.source if len(pods) < declared_pods else ""  # not smaller: no minimum
    return Gang(tuple(pods), job_priority(job, priority_classes), declared, source)


def quota_request(gang: Gang) -> R.Resources:
    """What a job holds in the quota tree while admitted: its gang's requests plus one
    ``kube-queue/max-jobs``."""
    total = gang.total
    total[R.MAX_JOBS] = R.MILLI
    return total


def binding_result(cluster: str, gang: Gang) -> str:
    """The walkthrough's binding message: ``{cluster-a:0,[{master 1} {worker 2}]}``, with
    the replicas the member copy declares (a Master-only job lists only master)."""
    parts = " ".join(f"{{{role} {n}}}" for role, n in gang.declared_role_counts().items())
    return f"{{{cluster}:0,[{parts}]}}"
