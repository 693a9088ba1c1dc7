"""Security: no credential or Secret data in any workflow history, memo, search attribute
or worker log; namespace isolation of quota, policies and propagated Secrets; loopback-only
listeners by default.

The log scan captures every record of the worker process at INFO (the worker's default,
``FLEETQ_LOG_LEVEL``) and fleetq's / Temporal's own loggers at DEBUG. The ``kubernetes``
client and urllib3 are kept at INFO: at DEBUG the kubernetes client itself logs raw
response bodies (a Secret read from the source cluster included), which no production
worker should enable.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

from fleetq.resources import MAX_JOBS
from fleetq.runtime.embedded import EmbeddedFleet
from fleetq.runtime.supervisor import free_port
from fleetq.testing.chaos import complete_pods, job_manifest, member_copies, policy_manifest
from tests.reliability.conftest import REL_TREE, Stack
from workflows.quota_tree import QuotaView

MEMBERS = ["cluster-a", "cluster-b", "cluster-c"]


def secret_on_hub(stack: Stack, namespace: str, name: str, value: str) -> None:
    from kubernetes import client as k8s

    api = k8s.CoreV1Api(stack.emulated.api_client("hub"))
    try:
        api.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    api.create_namespaced_secret(namespace, k8s.V1Secret(
        metadata=k8s.V1ObjectMeta(name=name),
        data={"password": base64.b64encode(value.encode()).decode()}))


def with_secret(manifest: dict[str, Any], secret: str) -> dict[str, Any]:
    for spec in manifest["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        pod["containers"][0]["env"] = [{"name": "PASSWORD", "valueFrom": {
            "secretKeyRef": {"name": secret, "key": "password"}}}]
        pod["volumes"] = [{"name": "creds", "secret": {"secretName": secret}}]
    return manifest


async def all_history_bytes(stack: Stack) -> list[tuple[str, bytes]]:
    """Every event of every run of every workflow in the namespace, as raw protobuf (all
    payloads, memo and search attributes included), plus each execution's description."""
    out: list[tuple[str, bytes]] = []
    async for wf in stack.client.list_workflows():
        handle = stack.client.get_workflow_handle(wf.id, run_id=wf.run_id)
        async for event in handle.fetch_history_events():
            out.append((wf.id, event.SerializeToString()))
        desc = await handle.describe()
        out.append((wf.id, desc.raw_description.SerializeToString()))
    return out


async def test_no_token_or_secret_value_in_histories_memos_attributes_or_logs(
        stack: Stack) -> None:
    ns = "sec"
    value = f"hunter2-{secrets.token_hex(12)}"
    name = f"db-creds-{uuid.uuid4().hex[:6]}"
    secret_on_hub(stack, ns, name, value)
    await stack.apply(policy_manifest(ns, clusters=MEMBERS, propagate_deps=True))
    handle = await stack.start_job(with_secret(job_manifest(ns, f"sec-{uuid.uuid4().hex[:6]}"),
                                               name), run_seconds=1)
    view = await stack.wait_end(handle, timeout=60)
    assert view.state == "Succeeded" and view.cluster is not None
    # The Secret really travelled (so the scan below is not vacuous).
    copies = [s for s in stack.emulated.objects(view.cluster, "secrets")
              if s["metadata"]["name"] == name and s["metadata"].get("namespace") == ns]
    assert len(copies) == 1
    tokens = {c: stack.emulated.token(c) for c in stack.emulated.clusters}
    needles = {f"token of {c}": t.encode() for c, t in tokens.items()}
    needles["secret value"] = value.encode()
    needles["secret value (base64)"] = base64.b64encode(value.encode())
    blobs = await all_history_bytes(stack)
    assert len({wid for wid, _ in blobs}) >= 3  # registry, quota tree, jobs
    leaks = [f"{what} in {wid}" for wid, blob in blobs for what, n in needles.items()
             if n in blob]
    assert leaks == []
    log = "\n".join(stack.logs.lines).encode()
    assert stack.logs.lines, "no worker log captured"
    assert [what for what, n in needles.items() if n in log] == []


def test_kubeconfig_and_fleet_config_holding_tokens_are_owner_only(stack: Stack) -> None:
    for path in (stack.emulated.kubeconfig_path, stack.emulated.fleet_config_path):
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode == 0o600, f"{path}: mode {oct(mode)}"


# ----------------------------------------------------------------------------- isolation


async def test_a_job_consumes_only_its_own_namespace_quota_leaf(stack: Stack) -> None:
    await stack.apply(policy_manifest("iso-a", clusters=MEMBERS))
    # held (no run-seconds): it holds its quota until completed below, however long the
    # query of the quota tree takes
    handle = await stack.job("iso-a", "own-leaf", run_seconds=None)
    running = await stack.wait_state(handle, "Running")
    assert running.cluster is not None
    view: QuotaView = await stack.client.get_workflow_handle(
        f"quota/kube-system/{REL_TREE}").query("view", result_type=QuotaView)
    usage = {q.node: q.usage for q in view.queues}
    assert usage["iso-a"].get(MAX_JOBS) == 1000 and usage["iso-a"].get("cpu", 0) > 0
    others = {n: u for n, u in usage.items() if n not in ("iso-a", "root") and any(u.values())}
    assert others == {}
    await complete_pods(stack.emulated, str(running.cluster), running.namespace, running.name)
    assert (await stack.wait_end(handle)).state == "Succeeded"


async def test_a_policy_applies_only_to_its_own_namespace(stack: Stack) -> None:
    await stack.apply(policy_manifest("iso-b", clusters=MEMBERS, name="iso-b-only"))
    handle = await stack.job("iso-c", "no-policy")
    try:
        view = await stack.wait_state(handle, "Pending", timeout=20)
        assert "no PropagationPolicy in namespace iso-c" in view.reason
        assert view.policy is None and view.cluster is None
    finally:
        await handle.cancel()
    await stack.wait_end(handle)
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert member_copies(stack.emulated, "iso-c", view.name, MEMBERS) == {}


async def test_a_job_deleted_while_waiting_for_a_policy_ends_deleted(stack: Stack) -> None:
    handle = await stack.job("iso-c", "no-policy-del")
    await stack.wait_state(handle, "Pending", timeout=20)
    await handle.cancel()
    end = await stack.wait_end(handle)
    assert end.state == "Deleted", [(e.reason, e.message) for e in end.events]


async def test_a_job_cannot_bring_another_namespace_policy(stack: Stack) -> None:
    foreign = policy_manifest("iso-b", clusters=MEMBERS, name="foreign")
    handle = await stack.job("iso-a", "foreign-policy", policy=foreign)
    with pytest.raises(WorkflowFailureError) as err:
        await handle.result()
    assert "metadata.namespace must be the job's namespace iso-a" in str(err.value.cause)


@pytest.mark.parametrize("ref", ["cross-secret", "../../iso-b/secrets/cross-secret",
                                 "..%2F..%2Fiso-b%2Fsecrets%2Fcross-secret"])
async def test_a_job_cannot_propagate_another_namespace_secret(stack: Stack, ref: str) -> None:
    value = f"other-{secrets.token_hex(8)}"
    try:
        secret_on_hub(stack, "iso-b", "cross-secret", value)
    except Exception as exc:  # created by an earlier parameter
        if "409" not in str(exc) and "AlreadyExists" not in str(exc):
            raise
    await stack.apply(policy_manifest("iso-a", clusters=MEMBERS, propagate_deps=True))
    manifest = with_secret(job_manifest("iso-a", f"cross-{uuid.uuid4().hex[:6]}"), ref)
    handle = await stack.start_job(manifest, run_seconds=1)
    view = await stack.wait_end(handle, timeout=60)
    assert (await handle.describe()).status in (WorkflowExecutionStatus.COMPLETED,
                                                WorkflowExecutionStatus.FAILED)
    for c in MEMBERS:
        leaked = [s["metadata"] for s in stack.emulated.objects(c, "secrets")
                  if "cross-secret" in s["metadata"]["name"]
                  or s["metadata"].get("namespace") == "iso-b"]
        assert leaked == [], f"{c}: {leaked}"
    if view.state == "Succeeded":
        assert sum(member_copies(stack.emulated, "iso-a", view.name, MEMBERS).values()) == 1


# ----------------------------------------------------------------------------- loopback


def listening(port: int) -> set[str]:
    """Local addresses listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found: set[str] = set()
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            addr, hexport = parts[1].split(":")
            if parts[3] != "0A" or int(hexport, 16) != port:
                continue
            if v6:
                raw = bytes.fromhex(addr)
                words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                import ipaddress

                found.add(str(ipaddress.IPv6Address(words)))
            else:
                found.add(".".join(str(b) for b in bytes.fromhex(addr)[::-1]))
    return found


def test_the_emulator_listens_on_loopback_only(stack: Stack) -> None:
    from urllib.parse import urlparse

    ports = [urlparse(stack.emulated.endpoint(c)).port for c in stack.emulated.clusters]
    ports.append(urlparse(stack.emulated.control_url).port)
    for port in ports:
        assert port is not None
        assert listening(port) == {"127.0.0.1"}, (port, listening(port))


@pytest.mark.timeout(120)
async def test_the_embedded_fleet_listens_on_loopback_only(tmp_path: Path) -> None:
    fleet = EmbeddedFleet(tmp_path / "state", port=free_port(), ui_port=free_port(),
                          worker=False)
    await asyncio.to_thread(fleet.start)
    try:
        for port in (fleet.port, fleet.ui_port):
            assert listening(port) == {"127.0.0.1"}, (port, listening(port))
        import json

        info = json.loads((tmp_path / "state" / "sim" / "emulator.json").read_text())
        from urllib.parse import urlparse

        for url in [*info["clusters"].values(), info["controlUrl"]]:
            port = urlparse(url).port
            assert port is not None and listening(port) == {"127.0.0.1"}, url
    finally:
        await asyncio.to_thread(fleet.stop)
