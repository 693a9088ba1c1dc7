"""The fleet config file: which member clusters exist and how to reach them.

``FLEETQ_CONFIG`` names a small YAML file the worker's activities read once per process
(``activities/fleet.py``): ``kubeconfig`` (the default), ``source`` (where propagateDeps
copies from), ``clusters`` (name, context, labels, reservation), ``timeouts``,
``cacheTTLSeconds``, ``clusterFailover``, ``unschedulableGraceSeconds`` and ``requeue``
(:class:`RequeueSettings`, each field overridable per tree by its ``fleetq.io/...``
annotation, :func:`requeue_settings`; docs/requeue.md "Settings"); an example is in the
README ("Real Temporal and real clusters"). Relative paths resolve against its directory.
Every problem is one :class:`FleetConfigError` line naming the file and the field, never
a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Protocol

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from fleetq.cluster_health import TaintSettings
from fleetq.models import DNS1123_LABEL


class FleetConfigError(ValueError):
    """A fleet config that cannot be used; one line naming the file and field."""


class _Named(Protocol):
    name: str


def cluster_name(value: str) -> str:
    """``value`` if it is a valid cluster name (a lowercase DNS label); the fleet config
    and the emulator's topology name clusters alike."""
    if len(value) > 63 or not DNS1123_LABEL.match(value):
        raise ValueError(f"{value[:64]!r} is not a valid cluster name (lowercase DNS label)")
    return value


#: a cluster name, validated by :func:`cluster_name`
ClusterName = Annotated[str, AfterValidator(cluster_name)]


def unique_cluster_names(clusters: Sequence[_Named]) -> None:
    """Refuse a cluster name declared twice (the error names the second one's field)."""
    seen: set[str] = set()
    for i, c in enumerate(clusters):
        if c.name in seen:
            raise ValueError(f"@clusters[{i}].name {c.name!r} is declared twice")
        seen.add(c.name)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KubeRef(_Strict):
    """A kubeconfig context (the kubeconfig defaults to the top-level one)."""

    context: str | None = None
    kubeconfig: str | None = None


class TaintConfig(_Strict):
    key: str = Field(min_length=1)
    value: str = ""
    effect: str = "NoSchedule"

    @field_validator("effect")
    @classmethod
    def _effect(cls, v: str) -> str:
        if v not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ValueError(f"{v!r} is not a taint effect (NoSchedule|PreferNoSchedule|NoExecute)")
        return v


class ClusterConfig(_Strict):
    name: ClusterName
    context: str | None = None  # defaults to the cluster name
    kubeconfig: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    reservation: bool = False
    taints: list[TaintConfig] = Field(default_factory=list)

    @property
    def context_name(self) -> str:
        return self.context or self.name


class Timeouts(_Strict):
    connectSeconds: float = Field(default=3.0, gt=0, le=300)
    readSeconds: float = Field(default=10.0, gt=0, le=600)


class ClusterFailover(_Strict):
    """What an unreachable (Ready Unknown) or not-ready (Ready False) member means for
    the jobs on it (``fleetq.cluster_health``). Such a member is always tainted
    ``NoSchedule``; with ``noExecute`` also ``NoExecute``, and a job there is evicted
    once the taint outlasts its policy's matching ``clusterTolerations`` (a policy
    without one gets the default seconds below; ``null`` tolerates for ever)."""

    noExecute: bool = True
    defaultUnreachableTolerationSeconds: int | None = Field(default=300, ge=0, le=31_536_000)
    defaultNotReadyTolerationSeconds: int | None = Field(default=300, ge=0, le=31_536_000)

    def settings(self) -> TaintSettings:
        return TaintSettings(
            no_execute=self.noExecute,
            unreachable_toleration_seconds=self.defaultUnreachableTolerationSeconds,
            not_ready_toleration_seconds=self.defaultNotReadyTolerationSeconds,
        )


#: ElasticQuotaTree annotations overriding the fleet's ``requeue`` settings for its jobs
#: (a number of seconds / attempts, or ``off``: no timeout, no limit)
PLACEMENT_TIMEOUT_ANNOTATION = "fleetq.io/placement-timeout-seconds"
PODS_READY_TIMEOUT_ANNOTATION = "fleetq.io/pods-ready-timeout-seconds"
BACKOFF_BASE_ANNOTATION = "fleetq.io/requeue-backoff-base-seconds"
BACKOFF_MAX_ANNOTATION = "fleetq.io/requeue-backoff-max-seconds"
REQUEUE_LIMIT_ANNOTATION = "fleetq.io/requeue-limit"
_REQUEUE_FIELDS = {
    PLACEMENT_TIMEOUT_ANNOTATION: "placementTimeoutSeconds",
    PODS_READY_TIMEOUT_ANNOTATION: "podsReadyTimeoutSeconds",
    BACKOFF_BASE_ANNOTATION: "backoffBaseSeconds",
    BACKOFF_MAX_ANNOTATION: "backoffMaxSeconds",
    REQUEUE_LIMIT_ANNOTATION: "requeueLimit",
}
_MAX_SECONDS = 31_536_000


class RequeueSettings(_Strict):
    """Re-queue with backoff (Kube Queue's re-enqueue; Kueue's ``waitForPodsReady`` with
    its ``requeuingStrategy``, apis/config/v1beta1 configuration_types.go): an admitted
    job not placed within ``placementTimeoutSeconds``, or bound with pods not all running
    within ``podsReadyTimeoutSeconds``, gives its quota back and queues again (original
    submit time) after ``backoffBaseSeconds * 2^(n-1)`` (n: its re-queues so far,
    capped at ``backoffMaxSeconds``; Kueue's defaults 60 and 3600, without the jitter);
    the re-queue past ``requeueLimit`` ends it ``Failed``. ``None``: no timeout / no
    limit. Placement timeout is off by default: a job that fits an empty member waits
    for room as long as it takes (a job that fits none is ``Unschedulable`` at once);
    the pods-ready timeout is 600 s (Kueue's ``timeout`` is 5 min, but its
    ``waitForPodsReady`` is off by default; fleetq's failover already handles pods a
    member cannot schedule after ``unschedulableGraceSeconds``); the limit is 5
    (Kueue's ``backoffLimitCount`` defaults to unlimited)."""

    placementTimeoutSeconds: float | None = Field(default=None, gt=0, le=_MAX_SECONDS)
    podsReadyTimeoutSeconds: float | None = Field(default=600.0, gt=0, le=_MAX_SECONDS)
    backoffBaseSeconds: float = Field(default=60.0, ge=0, le=_MAX_SECONDS)
    backoffMaxSeconds: float = Field(default=3600.0, ge=0, le=_MAX_SECONDS)
    requeueLimit: int | None = Field(default=5, ge=0, le=1_000_000)

    def backoff_seconds(self, requeues: int) -> float:
        """The pause before re-queue number ``requeues`` (1 for the first)."""
        n = max(1, requeues)
        base = self.backoffBaseSeconds
        cap = self.backoffMaxSeconds
        if base <= 0:
            return 0.0
        # 2^(n-1) overflows floats only far past any cap: stop doubling at the cap
        delay = base
        for _ in range(n - 1):
            delay *= 2
            if delay >= cap:
                return cap
        return min(delay, cap)


def requeue_settings(
    fleet: RequeueSettings, annotations: Mapping[str, str], tree: str = "ElasticQuotaTree"
) -> RequeueSettings:
    """``fleet``'s settings with the tree's ``fleetq.io/...`` annotations applied; a bad
    value raises ValueError naming the tree and annotation."""
    update: dict[str, Any] = {}
    for note, fieldname in _REQUEUE_FIELDS.items():
        raw = annotations.get(note)
        if raw is None:
            continue
        text = str(raw).strip()
        if text.lower() == "off" and fieldname in (
            "placementTimeoutSeconds", "podsReadyTimeoutSeconds", "requeueLimit"
        ):
            update[fieldname] = None
            continue
        try:
            value: float | int = int(text) if fieldname == "requeueLimit" else float(text)
        except ValueError:
            what = "a whole number or off" if fieldname == "requeueLimit" else (
                "a number of seconds" + (" or off" if "Timeout" in fieldname else "")
            )
            raise ValueError(
                f"{tree}: metadata.annotations.{note} must be {what}, got {text[:32]!r}"
            ) from None
        update[fieldname] = value
    if not update:
        return fleet
    try:
        return RequeueSettings.model_validate({**fleet.model_dump(), **update})
    except ValidationError as exc:
        err = exc.errors()[0]
        fieldname = str(err.get("loc", ("",))[0])
        note = next(k for k, v in _REQUEUE_FIELDS.items() if v == fieldname)
        msg = str(err.get("msg", "is invalid"))
        raise ValueError(f"{tree}: metadata.annotations.{note} {msg.lower()}") from None


class FleetConfig(_Strict):
    kubeconfig: str | None = None
    source: KubeRef | None = None
    clusters: list[ClusterConfig] = Field(min_length=1)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    cacheTTLSeconds: float = Field(default=2.0, gt=0, le=3600)
    clusterFailover: ClusterFailover = Field(default_factory=ClusterFailover)
    #: how long a pod may stay unschedulable (PodScheduled False) on its member before
    #: the job counts as Unhealthy (and its failover toleration starts)
    unschedulableGraceSeconds: float = Field(default=60.0, ge=0, le=86_400)
    #: re-queue with backoff of admitted jobs that do not start (:class:`RequeueSettings`)
    requeue: RequeueSettings = Field(default_factory=RequeueSettings)

    @model_validator(mode="after")
    def _unique(self) -> FleetConfig:
        unique_cluster_names(self.clusters)
        return self

    def cluster_kubeconfig(self, cluster: ClusterConfig) -> str:
        path = cluster.kubeconfig or self.kubeconfig
        assert path is not None  # checked by load_fleet_config / parse_fleet_config
        return path

    def source_kubeconfig(self) -> str | None:
        if self.source is None:
            return None
        return self.source.kubeconfig or self.kubeconfig


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


def _message(err: Any) -> tuple[str, str]:
    path = _loc(tuple(err.get("loc", ())))
    kind = err.get("type", "")
    msg = {
        "missing": "is required",
        "extra_forbidden": "is not a known field",
        "too_short": "must not be empty",
    }.get(kind) or str(err.get("msg", "is invalid")).removeprefix("Value error, ")
    if msg.startswith("@"):
        sub, _, msg = msg[1:].partition(" ")
        path = f"{path}.{sub}" if path else sub
    return path, msg


def parse_fleet_config(doc: Any, base_dir: Path, source: str = "fleet config") -> FleetConfig:
    """Validate a decoded document, resolve relative paths against ``base_dir`` and check
    that every cluster has a kubeconfig that exists."""
    if not isinstance(doc, dict):
        raise FleetConfigError(f"{source}: must be a mapping with a 'clusters' list")
    try:
        cfg = FleetConfig.model_validate(doc)
    except ValidationError as exc:
        parts = [f"{p} {m}".strip() for p, m in map(_message, exc.errors())]
        raise FleetConfigError(f"{source}: " + "; ".join(parts)) from None

    _resolve_kubeconfigs(cfg, base_dir, source)
    return cfg


def _resolve_path(value: str | None, field: str, base_dir: Path, source: str) -> str | None:
    """``value`` as an absolute path (relative ones against ``base_dir``); it must be a
    file."""
    if value is None:
        return None
    p = Path(value).expanduser()
    if not p.is_absolute():
        p = base_dir / p
    if not p.is_file():
        raise FleetConfigError(f"{source}: {field} {str(p)!r} does not exist")
    return str(p)


def _resolve_kubeconfigs(cfg: FleetConfig, base_dir: Path, source: str) -> None:
    """Resolve every kubeconfig path in place; each cluster (and the source) needs its
    own or the top-level one."""
    cfg.kubeconfig = _resolve_path(cfg.kubeconfig, "kubeconfig", base_dir, source)
    for i, c in enumerate(cfg.clusters):
        c.kubeconfig = _resolve_path(c.kubeconfig, f"clusters[{i}].kubeconfig", base_dir, source)
        if c.kubeconfig is None and cfg.kubeconfig is None:
            raise FleetConfigError(
                f"{source}: clusters[{i}].kubeconfig is required (no top-level kubeconfig)"
            )
    if cfg.source is not None:
        cfg.source.kubeconfig = _resolve_path(
            cfg.source.kubeconfig, "source.kubeconfig", base_dir, source
        )
        if cfg.source.kubeconfig is None and cfg.kubeconfig is None:
            raise FleetConfigError(
                f"{source}: source.kubeconfig is required (no top-level kubeconfig)"
            )


def read_yaml_file(path: Path, label: str, error: Callable[[str], Exception]) -> Any:
    """The YAML document at ``path``; ``error("<label>: cannot read (...)")`` or
    ``error("<label>: not valid YAML (<first line>)")`` raised when it cannot be had."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{label}: cannot read ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "syntax error"
        raise error(f"{label}: not valid YAML ({first})") from None


def load_fleet_config(path: str | Path) -> FleetConfig:
    p = Path(path).expanduser()
    doc = read_yaml_file(p, f"fleet config {p}", FleetConfigError)
    return parse_fleet_config(doc, p.resolve().parent, f"fleet config {p}")
