"""The fault control endpoint of real members: the emulator's protocol, so ``fleetq sim
fault CLUSTER ACTION`` works on both kinds of members.

``fleetq controlplane serve`` runs it on loopback beside the members' fault proxies and
writes its URL (``controlUrl``) into ``<out-dir>/emulator.json``, the file ``fleetq sim
fault`` looks for next to the fleet config. ``GET /clusters`` lists the members and their
fault state; ``POST /clusters/{name}/faults`` with ``{"action": ...}`` applies one of
:data:`fleetq.emulator.faults.ACTIONS`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aiohttp import web

from fleetq.emulator.faults import ACTIONS, ControlError

if TYPE_CHECKING:
    from fleetq.controlplane.runner import RealFleet


def apply_action(fleet: RealFleet, cluster: str, action: str, args: dict[str, Any]) -> str:
    """Apply one fault action to a real member (blocking); a one-line description."""
    names = [p.name for p in fleet.planes]
    if cluster not in names:
        raise ControlError(f"unknown cluster {cluster!r} (have: {', '.join(names)})")
    if action in ("unreachable", "reachable"):
        fleet.set_reachable(cluster, action == "reachable")
        return f"{cluster}: {action} (API server {'thawed' if action == 'reachable' else 'frozen'})"
    if action == "fail-job":
        ns, _, name = str(args.get("job") or "").rpartition("/")
        if not name:
            raise ControlError("fail-job needs NAMESPACE/NAME")
        if not fleet.fail_job(cluster, ns or "default", name):
            raise ControlError(f"{cluster}: no PyTorchJob {ns or 'default'}/{name}")
        return f"{cluster}: job {ns or 'default'}/{name} failed"
    if action in ("cordon", "uncordon"):
        node = str(args.get("node") or "")
        if not fleet.cordon(cluster, node, action == "cordon"):
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
        fleet.inject_errors(cluster, status, rate, None if ra is None else float(ra))
        return f"{cluster}: {int(rate * 100)}% of requests answer {status}"
    if action == "latency":
        seconds = float(args.get("seconds", 0))
        if seconds < 0:
            raise ControlError("latency --seconds must not be negative")
        fleet.set_latency(cluster, seconds)
        return f"{cluster}: {seconds:g}s added latency"
    if action == "clear":
        fleet.clear_faults(cluster)
        return f"{cluster}: faults cleared"
    raise ControlError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")


def control_app(fleet: RealFleet) -> web.Application:
    async def index(request: web.Request) -> web.Response:
        return web.json_response({
            "clusters": {
                p.name: {"url": p.public_url, "member": p.spec.member,
                         "faults": p.proxy.faults.to_dict() if p.proxy else {}}
                for p in fleet.planes
            },
            "kubeconfig": str(fleet.kubeconfig_path),
            "fleetConfig": str(fleet.fleet_config_path),
        })

    async def fault(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        cluster = request.match_info["cluster"]
        action = str(body.get("action", ""))
        try:  # blocking (API calls, signals): off the loop the proxies share
            msg = await asyncio.get_running_loop().run_in_executor(
                None, apply_action, fleet, cluster, action, body)
        except (ControlError, ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True, "message": msg})

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/clusters", index)
    app.router.add_post("/clusters/{cluster}/faults", fault)
    return app
