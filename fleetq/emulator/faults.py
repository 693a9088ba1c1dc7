"""Fault state of one emulated cluster and the emulator's control (admin) endpoint.

Faults are what a failover test needs: a cluster that stops answering, API errors at a
rate (500/429 with ``Retry-After``), added latency, a job whose pods fail, a cordoned
node. The control endpoint is one JSON HTTP server for the whole emulator, separate from
the cluster API ports, always on loopback; ``fleetq sim fault`` talks to it.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fleetq.emulator.store import ApiError

if TYPE_CHECKING:
    from fleetq.emulator.fleet import Emulator


#: the ``Status`` reason of an injected error, by HTTP code (else ``InternalError``)
ERROR_REASONS = {429: "TooManyRequests", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclass
class Faults:
    reachable: bool = True
    error_status: int | None = None
    error_rate: float = 0.0
    retry_after: float | None = None
    latency: float = 0.0
    _rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def clear(self) -> None:
        self.reachable = True
        self.error_status = None
        self.error_rate = 0.0
        self.retry_after = None
        self.latency = 0.0

    def should_fail(self) -> bool:
        return self.error_status is not None and self._rng.random() < self.error_rate

    def injected_error(self) -> ApiError | None:
        """The error to answer this request with (at :attr:`error_rate`): HTTP
        :attr:`error_status` with its Kubernetes reason and ``Retry-After``; None: serve it."""
        if not self.should_fail():
            return None
        code = self.error_status or 500
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, round(self.retry_after)))
        return ApiError(code, ERROR_REASONS.get(code, "InternalError"),
                        f"injected fault: HTTP {code}", headers=headers)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("_rng", None)
        return d


ACTIONS = ("unreachable", "reachable", "fail-job", "cordon", "uncordon", "errors", "latency",
           "clear")


class ControlError(ValueError):
    """A control request that cannot be applied (unknown cluster, job or node)."""


@dataclass(frozen=True)
class FaultRequest:
    """One fault action, checked: what ``fleetq sim fault CLUSTER ACTION ...`` asks of
    the emulator's and the real members' control endpoints alike."""

    action: str
    namespace: str = ""
    name: str = ""  # fail-job
    node: str = ""  # cordon / uncordon
    status: int = 500  # errors
    rate: float = 1.0
    retry_after: float | None = None
    seconds: float = 0.0  # latency

    def done(self, cluster: str) -> str:
        """The one line that says it was applied."""
        if self.action in ("unreachable", "reachable"):
            return f"{cluster}: {self.action}"
        if self.action == "fail-job":
            return f"{cluster}: job {self.namespace}/{self.name} failed"
        if self.action in ("cordon", "uncordon"):
            return f"{cluster}: node {self.node} {self.action}ed"
        if self.action == "errors":
            return f"{cluster}: {int(self.rate * 100)}% of requests answer {self.status}"
        if self.action == "latency":
            return f"{cluster}: {self.seconds:g}s added latency"
        return f"{cluster}: faults cleared"


def parse_fault(clusters: list[str], cluster: str, action: str,
                args: dict[str, Any]) -> FaultRequest:
    """Check a fault request against the known clusters; :class:`ControlError` (one line)
    for anything that cannot be applied."""
    if cluster not in clusters:
        raise ControlError(f"unknown cluster {cluster!r} (have: {', '.join(clusters)})")
    if action in ("unreachable", "reachable", "clear"):
        return FaultRequest(action)
    if action == "fail-job":
        ns, _, name = str(args.get("job") or "").rpartition("/")
        if not name:
            raise ControlError("fail-job needs NAMESPACE/NAME")
        return FaultRequest(action, namespace=ns or "default", name=name)
    if action in ("cordon", "uncordon"):
        return FaultRequest(action, node=str(args.get("node") or ""))
    if action == "errors":
        return _parse_errors(args)
    if action == "latency":
        return _parse_latency(args)
    raise ControlError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")


def _parse_errors(args: dict[str, Any]) -> FaultRequest:
    """An ``errors`` request: HTTP ``status`` (400-599) answered to ``rate`` (0-1) of
    requests, with an optional ``retry_after``."""
    status = int(args.get("status", 500))
    rate = float(args.get("rate", 1.0))
    if not 400 <= status <= 599:
        raise ControlError("errors --status must be an HTTP error code (400-599)")
    if not 0.0 <= rate <= 1.0:
        raise ControlError("errors --rate must be between 0 and 1")
    ra = args.get("retry_after")
    return FaultRequest("errors", status=status, rate=rate,
                        retry_after=None if ra is None else float(ra))


def _parse_latency(args: dict[str, Any]) -> FaultRequest:
    """A ``latency`` request: ``seconds`` (not negative) added to every answer."""
    seconds = float(args.get("seconds", 0))
    if seconds < 0:
        raise ControlError("latency --seconds must not be negative")
    return FaultRequest("latency", seconds=seconds)


async def apply_action(emu: Emulator, cluster: str, action: str, args: dict[str, Any]) -> str:
    """Apply one fault action; returns a one-line human description."""
    req = parse_fault(list(emu.clusters), cluster, action, args)
    if req.action in ("unreachable", "reachable"):
        await emu.set_reachable(cluster, req.action == "reachable")
    elif req.action == "fail-job":
        if not emu.clusters[cluster].controller.fail_job(req.namespace, req.name):
            raise ControlError(f"{cluster}: no PyTorchJob {req.namespace}/{req.name}")
    elif req.action in ("cordon", "uncordon"):
        if not emu.clusters[cluster].controller.set_cordon(req.node, req.action == "cordon"):
            raise ControlError(f"{cluster}: no node {req.node!r}")
    elif req.action == "errors":
        emu.inject_errors(cluster, req.status, req.rate, req.retry_after)
    elif req.action == "latency":
        emu.clusters[cluster].faults.latency = req.seconds
    else:
        await emu.clear_faults(cluster)
    return req.done(cluster)


#: carries out one checked fault request: (cluster, action, request body) -> its line
FaultApplier = Callable[[str, str, dict[str, Any]], Awaitable[str]]


def fault_control_app(
    index: Callable[[], dict[str, Any]], apply: FaultApplier
) -> web.Application:
    """The control endpoint ``fleetq sim fault`` speaks to, for emulated and real members
    alike: ``GET /clusters`` (``index()``) and ``POST /clusters/{name}/faults`` with
    ``{"action": ...}``; a request that cannot be applied is a 400 with one line."""

    async def show(request: web.Request) -> web.Response:
        return web.json_response(index())

    async def fault(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        try:
            msg = await apply(request.match_info["cluster"], str(body.get("action", "")), body)
        except (ControlError, ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True, "message": msg})

    app = web.Application()
    app.router.add_get("/", show)
    app.router.add_get("/clusters", show)
    app.router.add_post("/clusters/{cluster}/faults", fault)
    return app


def control_app(emu: Emulator) -> web.Application:
    def index() -> dict[str, Any]:
        return {
            "clusters": {
                name: {"url": c.url, "faults": c.faults.to_dict(), "member": c.spec.member}
                for name, c in emu.clusters.items()
            },
            "kubeconfig": str(emu.kubeconfig_path) if emu.kubeconfig_path else None,
            "fleetConfig": str(emu.fleet_config_path) if emu.fleet_config_path else None,
        }

    async def apply(cluster: str, action: str, body: dict[str, Any]) -> str:
        return await apply_action(emu, cluster, action, body)

    return fault_control_app(index, apply)
