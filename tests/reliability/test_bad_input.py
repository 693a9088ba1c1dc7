"""Malformed and hostile manifests, through the CLI and straight through ``temporal
workflow start``.

A hypothesis generator mutates a valid PyTorchJob at a random field (wrong types, huge
and negative numbers, deep nesting, 1 MB strings, unicode and invalid Kubernetes names)
and also produces hostile YAML text (duplicate keys, alias bombs, recursive anchors).
Through ``fleetq validate`` / ``fleetq apply`` each must be rejected with short lines
naming the object and field, never a traceback, and nothing reaches Temporal. Through the
raw ``temporal`` CLI the job workflow must fail fast with the validation message: no
WorkflowTaskFailed event (a task that fails is retried forever), no quota, no
Reservation, no member object.

Temporal refuses payloads above 2 MB. ``fleetq apply`` refuses objects above 1 MiB before
anything is sent; the raw ``temporal`` CLI gets the server's own error
("BlobSizeLimitError"-style, exit code non-zero) and no workflow is created.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError
from typer.testing import CliRunner

from fleetq.cli import app
from fleetq.client.connection import temporal_cli_path
from fleetq.naming import TASK_QUEUE, job_workflow_id
from fleetq.testing.chaos import history_events, job_manifest, member_copies, workflow_task_failures
from tests.reliability.conftest import REL_TREE, Stack

NS = "bad"
MEMBERS = ["cluster-a", "cluster-b", "cluster-c"]
MB = 1 << 20
RUNNER = CliRunner()

# ----------------------------------------------------------------------------- generators

FIELDS: dict[str, tuple[str | int, ...]] = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "metadata": ("metadata",),
    "spec": ("spec",),
    "spec.pytorchReplicaSpecs": ("spec", "pytorchReplicaSpecs"),
    "replicas": ("spec", "pytorchReplicaSpecs", "Master", "replicas"),
    "template": ("spec", "pytorchReplicaSpecs", "Worker", "template"),
    "containers": ("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers"),
    "cpu": ("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0,
            "resources", "requests", "cpu"),
    "memory": ("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers", 0,
               "resources", "limits", "memory"),
}

INVALID_NAMES = ["UPPER", "-lead", "trail-", "a..b", "a/b", "../../etc", "", " ", "a" * 300,
                 "名前", "jöb", "emoji-\U0001F600", "rtl-\u202e", "nul\x00byte", "a_b"]


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"n": value}
    return value


hostile_values = st.one_of(
    st.sampled_from([None, True, [], {}, 3.5, "text", ["a", 1], {"k": "v"}]),  # wrong types
    st.sampled_from([10**30, -(10**30), 10**39, 1e308, -1, -1000, "-1", "-100m", "1e400",
                     "99999999999999999999999Ei", "NaN", "Infinity"]),  # huge / negative
    st.sampled_from([nested(80), [[[[[[[[[[[[["deep"]]]]]]]]]]]]]]),  # deep nesting
    st.just("x" * MB),  # a 1 MB string
    st.sampled_from(INVALID_NAMES),
    # arbitrary unicode; NEL (U+0085) is pinned by its own test below
    st.text(alphabet=st.characters(blacklist_characters="\x85"), min_size=1, max_size=40),
)


def set_path(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    cur: Any = doc
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value


@st.composite
def mutated_manifests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    field = draw(st.sampled_from(sorted(FIELDS)))
    value = draw(hostile_values)
    doc = job_manifest(NS, f"hyp-{draw(st.integers(0, 10**6))}")
    set_path(doc, FIELDS[field], copy.deepcopy(value))
    return field, doc


BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{c}: &{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcdefg", "bcdefgh",
                                                                    strict=True)]
)
HOSTILE_TEXTS = {
    "duplicate key": "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  name: a\n"
                     "  name: b\n",
    "alias bomb": BOMB,
    "recursive anchor": "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: &m\n"
                        "  name: x\n  self: *m\n",
    "merge-key anchor": "base: &b {cpu: '1'}\napiVersion: kubeflow.org/v1\nkind: PyTorchJob\n"
                        "metadata: {name: x, <<: *b}\n",
    "python tag": "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\n"
                  "metadata: !!python/object/apply:os.system ['true']\n",
    "non-string key": "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {1: x}\n",
    "not a mapping": "- just\n- a\n- list\n",
    "binary garbage": "\x00\x01\x02\xff",
    "json duplicate": '{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", '
                      '"kind": "PyTorchJob"}',
    "json deep": "[" * 5000 + "]" * 5000,
    "json huge int": '{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": '
                     '{"name": "x"}, "spec": {"n": ' + "9" * 5000 + "}}",
}

LINE = re.compile(r"^(PyTorchJob |ElasticQuotaTree |PropagationPolicy |PriorityClass "
                  r"|\S+\.(yaml|json)\b|<stdin>|error: )")


def check_rejection(output: str, exit_code: int) -> list[str]:
    """Rejected, in short lines each naming the object (or file) — never a traceback."""
    assert exit_code == 1, output[:500]
    assert "Traceback" not in output
    lines = [ln for ln in output.splitlines() if ln.strip()]
    problems = [ln for ln in lines if not ln.startswith(("OK ", "note: "))]
    assert problems, output[:500]
    for ln in problems:
        assert LINE.match(ln), f"line does not name the object or file: {ln[:200]!r}"
        assert len(ln) <= 400, f"line too long ({len(ln)} chars): {ln[:200]!r}"
    return problems


def validate(path: Path) -> tuple[int, str]:
    res = RUNNER.invoke(app, ["validate", "-f", str(path)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output


def dump(doc: Any, as_json: bool) -> str:
    return json.dumps(doc) if as_json else yaml.safe_dump(doc, allow_unicode=True)


# ----------------------------------------------------------------------------- CLI


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=mutated_manifests(), as_json=st.booleans())
def test_cli_validate_rejects_hostile_fields_with_one_line_naming_object_and_field(
        tmp_path_factory: pytest.TempPathFactory, case: tuple[str, dict[str, Any]],
        as_json: bool) -> None:
    field, doc = case
    path = tmp_path_factory.mktemp("hyp") / ("job.json" if as_json else "job.yaml")
    path.write_text(dump(doc, as_json), encoding="utf-8")
    code, out = validate(path)
    if code == 0:
        # Some mutations are legal (e.g. any text is a fine label-free template field):
        # then the job must come back OK, whole.
        assert out.startswith("OK PyTorchJob"), out[:300]
        return
    problems = check_rejection(out, code)
    leaf = FIELDS[field][-1]
    if isinstance(leaf, str) and all(ln.startswith("PyTorchJob ") for ln in problems):
        # The line names the field, unless the whole object is refused for its size.
        assert any(leaf in ln or "MiB as JSON" in ln for ln in problems), (field, problems)


@pytest.mark.parametrize("name", sorted(HOSTILE_TEXTS))
def test_cli_validate_rejects_hostile_yaml_and_json(tmp_path: Path, name: str) -> None:
    text = HOSTILE_TEXTS[name]
    suffix = ".json" if text.lstrip().startswith(("{", "[")) else ".yaml"
    path = tmp_path / f"hostile{suffix}"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    code, out = validate(path)
    check_rejection(out, code)


def test_a_name_with_a_c1_line_break_still_yields_one_line(tmp_path: Path) -> None:
    doc = job_manifest(NS, "placeholder")
    doc["metadata"]["name"] = "evil\x85OK PyTorchJob default/fake"
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    code, out = validate(path)
    check_rejection(out, code)
    # One line, and the name cannot forge an "OK" line of its own.
    assert len(out.splitlines()) == 1, out.splitlines()


@pytest.mark.parametrize("name", ["Bad_Name", "名前", "a" * 300, "../../etc"])
async def test_cli_apply_rejects_before_anything_reaches_temporal(
        stack: Stack, tmp_path: Path, name: str) -> None:
    doc = job_manifest(NS, "placeholder")
    doc["metadata"]["name"] = name
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    res = await asyncio.to_thread(RUNNER.invoke, app, ["apply", "-f", str(path)],
                                  env={"TEMPORAL_ADDRESS": stack.address})
    check_rejection(res.output, res.exit_code)
    with pytest.raises(RPCError):
        await stack.client.get_workflow_handle(job_workflow_id(NS, name)).describe()


async def test_cli_apply_refuses_an_object_near_the_payload_limit(stack: Stack,
                                                                   tmp_path: Path) -> None:
    doc = job_manifest(NS, "near-limit")
    doc["metadata"]["annotations"] = {"blob": "x" * (19 * MB // 10)}  # 1.9 MB
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    res = await asyncio.to_thread(RUNNER.invoke, app, ["apply", "-f", str(path)],
                                  env={"TEMPORAL_ADDRESS": stack.address})
    (line,) = check_rejection(res.output, res.exit_code)
    assert "PyTorchJob bad/near-limit" in line and "MiB" in line
    with pytest.raises(RPCError):
        await stack.client.get_workflow_handle(job_workflow_id(NS, "near-limit")).describe()


# ----------------------------------------------------------------------------- raw temporal


def raw_cases() -> dict[str, tuple[str, Any]]:
    """name -> (name used in the workflow id, workflow input)."""
    base = job_manifest(NS, "raw")

    def mut(field: str, value: Any, name: str) -> tuple[str, Any]:
        doc = copy.deepcopy(base)
        doc["metadata"]["name"] = name
        set_path(doc, FIELDS[field], value)
        return doc["metadata"]["name"], doc

    return {
        "replicas-wrong-type": mut("replicas", "three", "raw-type"),
        "replicas-huge": mut("replicas", 10**40, "raw-huge"),
        "cpu-negative": mut("cpu", "-4", "raw-neg"),
        "memory-nan": mut("memory", "NaN", "raw-nan"),
        "containers-not-a-list": mut("containers", {"oops": 1}, "raw-cont"),
        "deep-nesting": mut("template", nested(200), "raw-deep"),
        "invalid-name": ("Bad_Name", {**copy.deepcopy(base),
                                      "metadata": {"name": "Bad_Name", "namespace": NS}}),
        "unicode-name": ("名前", {**copy.deepcopy(base),
                                 "metadata": {"name": "名前", "namespace": NS}}),
        "wrong-kind": ("raw-kind", {**copy.deepcopy(base), "kind": "Deployment",
                                    "metadata": {"name": "raw-kind", "namespace": NS}}),
        "not-an-object": ("raw-list", [1, 2, 3]),
        "bare-string": ("raw-str", "hello"),
    }


def temporal_start(stack: Stack, wid: str, payload: Any,
                   tmp: Path) -> subprocess.CompletedProcess[str]:
    inp = tmp / f"input-{uuid.uuid4().hex[:6]}.json"
    inp.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
    return subprocess.run(
        [str(temporal_cli_path()), "workflow", "start", "--address", stack.address,
         "--namespace", stack.client.namespace, "--task-queue", TASK_QUEUE,
         "--type", "PyTorchJobWorkflow", "--workflow-id", wid, "--input-file", str(inp)],
        capture_output=True, text=True, timeout=60)


async def assert_failed_fast(stack: Stack, wid: str, name: str) -> str:
    handle = stack.client.get_workflow_handle(wid)
    events: list[Any] = []
    for _ in range(150):
        desc = await handle.describe()
        events = await history_events(handle)
        if desc.status != WorkflowExecutionStatus.RUNNING or workflow_task_failures(events):
            break
        await asyncio.sleep(0.1)
    if desc.status == WorkflowExecutionStatus.RUNNING:
        await handle.terminate("reliability test: stuck on a failing workflow task")
    assert workflow_task_failures(events) == 0, f"{wid}: workflow task failed (retried forever)"
    assert desc.status == WorkflowExecutionStatus.FAILED, f"{wid}: {desc.status}"
    (failed,) = [e for e in events
                 if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED]
    failure = failed.workflow_execution_failed_event_attributes.failure
    message = failure.message or failure.cause.message
    assert "\n" not in message.strip() and len(message) < 400, message[:400]
    # no activity of any kind ran: no member call, no resolution, no enqueue (the quota
    # signal is a local activity, recorded as a marker)
    assert not any(e.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                                    EventType.EVENT_TYPE_MARKER_RECORDED,
                                    EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED)
                   for e in events), "it got past validation"
    assert member_copies(stack.emulated, NS, name, MEMBERS) == {}
    return message


async def quota_untouched(stack: Stack) -> None:
    from workflows.quota_tree import QuotaView

    view = await stack.client.get_workflow_handle(f"quota/kube-system/{REL_TREE}").query(
        "view", result_type=QuotaView)
    (leaf,) = [q for q in view.queues if q.node == NS]
    assert leaf.length == 0 and not any(leaf.usage.values())


@pytest.mark.parametrize("case", sorted(raw_cases()))
async def test_raw_temporal_start_fails_fast_with_the_validation_message(
        stack: Stack, tmp_path: Path, case: str) -> None:
    name, payload = raw_cases()[case]
    if case in ("not-an-object", "bare-string"):
        name = f"{name}-{uuid.uuid4().hex[:4]}"
    wid = job_workflow_id(NS, name)
    proc = temporal_start(stack, wid, payload, tmp_path)
    assert proc.returncode == 0, proc.stderr
    message = await assert_failed_fast(stack, wid, name)
    if case == "wrong-kind":
        assert message.startswith("Deployment bad/raw-kind: kind"), message
    elif isinstance(payload, dict) and case != "deep-nesting":
        assert message.startswith(f"PyTorchJob {NS}/"), message
    else:
        assert message.startswith("workflow input"), message
    await quota_untouched(stack)


@pytest.mark.parametrize("payload", [
    {"manifest": "not a manifest"},
    {"manifest": job_manifest(NS, "raw-rs"), "run_seconds": "soon"},
], ids=["manifest-not-an-object", "run-seconds-not-a-number"])
async def test_raw_wrapped_input_with_bad_fields_fails_fast(stack: Stack, tmp_path: Path,
                                                            payload: dict[str, Any]) -> None:
    wid = job_workflow_id(NS, f"wrapped-{uuid.uuid4().hex[:6]}")
    proc = temporal_start(stack, wid, payload, tmp_path)
    assert proc.returncode == 0, proc.stderr
    await assert_failed_fast(stack, wid, wid.rsplit("/", 1)[1])


async def test_raw_temporal_start_above_the_payload_limit_is_refused_by_the_server(
        stack: Stack, tmp_path: Path) -> None:
    doc = job_manifest(NS, "raw-big")
    doc["metadata"]["annotations"] = {"blob": "x" * (5 * MB // 2)}  # 2.5 MB
    wid = job_workflow_id(NS, "raw-big")
    proc = temporal_start(stack, wid, doc, tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert re.search(r"(?i)size|limit|too large", proc.stderr), proc.stderr[:500]
    with pytest.raises(RPCError):
        await stack.client.get_workflow_handle(wid).describe()
