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

from fleetq.emulator.faults import ControlError, fault_control_app, parse_fault

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
    def index() -> dict[str, Any]:
        return {
            "clusters": {
                p.name: {"url": p.public_url, "member": p.spec.member,
                         "faults": p.proxy.faults.to_dict() if p.proxy else {}}
                for p in fleet.planes
            },
            "kubeconfig": str(fleet.kubeconfig_path),
            "fleetConfig": str(fleet.fleet_config_path),
        }

    async def apply(cluster: str, action: str, body: dict[str, Any]) -> str:
        # blocking (API calls, signals): off the loop the proxies share
        return await asyncio.get_running_loop().run_in_executor(
            None, apply_action, fleet, cluster, action, body)

    return fault_control_app(index, apply)
