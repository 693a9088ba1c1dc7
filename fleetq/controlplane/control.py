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

from fleetq.emulator.faults import ControlError, parse_fault

if TYPE_CHECKING:
    from fleetq.controlplane.runner import RealFleet


def apply_action(fleet: RealFleet, cluster: str, action: str, args: dict[str, Any]) -> str:
    """Apply one fault action to a real member (blocking); a one-line description."""
    req = parse_fault([p.name for p in fleet.planes], cluster, action, args)
    if req.action in ("unreachable", "reachable"):
        fleet.set_reachable(cluster, req.action == "reachable")  # SIGSTOP / SIGCONT
    elif req.action == "fail-job":
        if not fleet.fail_job(cluster, req.namespace, req.name):
            raise ControlError(f"{cluster}: no PyTorchJob {req.namespace}/{req.name}")
    elif req.action in ("cordon", "uncordon"):
        if not fleet.cordon(cluster, req.node, req.action == "cordon"):
            raise ControlError(f"{cluster}: no node {req.node!r}")
    elif req.action == "errors":
        fleet.inject_errors(cluster, req.status, req.rate, req.retry_after)
    elif req.action == "latency":
        fleet.set_latency(cluster, req.seconds)
    else:
        fleet.clear_faults(cluster)
    return req.done(cluster)


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
