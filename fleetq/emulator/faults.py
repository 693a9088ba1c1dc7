"""Fault state of one emulated cluster and the emulator's control (admin) endpoint.

Faults are what a failover test needs: a cluster that stops answering, API errors at a
rate (500/429 with ``Retry-After``), added latency, a job whose pods fail, a cordoned
node. The control endpoint is one JSON HTTP server for the whole emulator, separate from
the cluster API ports, always on loopback; ``fleetq sim fault`` talks to it.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from fleetq.emulator.fleet import Emulator


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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("_rng", None)
        return d


ACTIONS = ("unreachable", "reachable", "fail-job", "cordon", "uncordon", "errors", "latency",
           "clear")


class ControlError(ValueError):
    """A control request that cannot be applied (unknown cluster, job or node)."""


async def apply_action(emu: Emulator, cluster: str, action: str, args: dict[str, Any]) -> str:
    """Apply one fault action; returns a one-line human description."""
    if cluster not in emu.clusters:
        raise ControlError(f"unknown cluster {cluster!r} (have: {', '.join(emu.clusters)})")
    if action == "unreachable":
        await emu.set_reachable(cluster, False)
        return f"{cluster}: unreachable"
    if action == "reachable":
        await emu.set_reachable(cluster, True)
        return f"{cluster}: reachable"
    if action == "fail-job":
        ref = str(args.get("job") or "")
        ns, _, name = ref.rpartition("/")
        if not name:
            raise ControlError("fail-job needs NAMESPACE/NAME")
        if not emu.clusters[cluster].controller.fail_job(ns or "default", name):
            raise ControlError(f"{cluster}: no PyTorchJob {ns or 'default'}/{name}")
        return f"{cluster}: job {ns or 'default'}/{name} failed"
    if action in ("cordon", "uncordon"):
        node = str(args.get("node") or "")
        if not emu.clusters[cluster].controller.set_cordon(node, action == "cordon"):
            raise ControlError(f"{cluster}: no node {node!r}")
        return f"{cluster}: node {node} {action}ed"
    if action == "errors":
        status = int(args.get("status", 500))
        rate = float(args.get("rate", 1.0))
        if not 400 <= status <= 599:
            raise ControlError("errors --status must be an HTTP error code (400-599)")
        if not 0.0 <= rate <= 1.0:
            raise ControlError("errors --rate must be between 0 and 1")
        ra = args.get("retry_after")
        emu.inject_errors(cluster, status, rate, None if ra is None else float(ra))
        return f"{cluster}: {int(rate * 100)}% of requests answer {status}"
    if action == "latency":
        seconds = float(args.get("seconds", 0))
        if seconds < 0:
            raise ControlError("latency --seconds must not be negative")
        emu.clusters[cluster].faults.latency = seconds
        return f"{cluster}: {seconds:g}s added latency"
    if action == "clear":
        await emu.clear_faults(cluster)
        return f"{cluster}: faults cleared"
    raise ControlError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")


def control_app(emu: Emulator) -> web.Application:
    async def index(request: web.Request) -> web.Response:
        return web.json_response({
            "clusters": {
                name: {"url": c.url, "faults": c.faults.to_dict(), "member": c.spec.member}
                for name, c in emu.clusters.items()
            },
            "kubeconfig": str(emu.kubeconfig_path) if emu.kubeconfig_path else None,
            "fleetConfig": str(emu.fleet_config_path) if emu.fleet_config_path else None,
        })

    async def fault(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        try:
            msg = await apply_action(
                emu, request.match_info["cluster"], str(body.get("action", "")), body
            )
        except (ControlError, ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True, "message": msg})

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/clusters", index)
    app.router.add_post("/clusters/{cluster}/faults", fault)
    return app
