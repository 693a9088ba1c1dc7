"""The Markdown fleetq gives the Temporal Web UI (issue 27 item 5), as text: spaced table
cells, no digit/digit the UI's renderer would draw as a fraction, and static details
that name the job's resolved priority. How it renders is tests/webui's (a real browser).

The renderer is ui-server's ``/render`` (temporalio/ui ``server/server/route/ui.go``:
gomarkdown with ``parser.CommonExtensions`` and ``html.CommonFlags``, which include
Smartypants fractions; its page's CSS sets ``padding: 0`` on every element)."""

from __future__ import annotations

from typing import Any

from fleetq.admission import UI_CELL_GAP, markdown_header, markdown_row, ui_text
from fleetq.client.jobs import job_details, named_priority_classes, priority_source
from fleetq.models import parse_job


def manifest(**template: Any) -> dict[str, Any]:
    def role(replicas: int, cpu: str) -> dict[str, Any]:
        spec = {"containers": [{"name": "pytorch", "image": "busybox",
                                "resources": {"requests": {"cpu": cpu}}}], **template}
        return {"replicas": replicas, "template": {"spec": spec}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "j", "namespace": "default"},
            "spec": {"pytorchReplicaSpecs": {"Master": role(1, "1"), "Worker": role(2, "2")}}}


def test_a_row_spaces_every_column_but_the_last_and_escapes_pipes() -> None:
    assert markdown_row(("a", 1, "x|y")) == f"| a{UI_CELL_GAP} | 1{UI_CELL_GAP} | x\\|y |"
    header, delimiter = markdown_header(("queue", "waiting"), "lr")
    assert header == f"| queue{UI_CELL_GAP} | waiting |"
    assert delimiter == "|:--|--:|"


def test_digits_around_a_slash_are_spaced_so_no_fraction_is_drawn() -> None:
    assert ui_text("kube-queue/max-jobs 1/1 in use") == "kube-queue/max-jobs 1 / 1 in use"
    assert ui_text("cpu 4.01/8, nvidia.com/gpu 0/4") == "cpu 4.01 / 8, nvidia.com/gpu 0 / 4"
    assert markdown_row(("q", "memory 4Gi/16Gi, max-jobs 1/10")).endswith(
        "memory 4Gi/16Gi, max-jobs 1 / 10 |")


def test_static_details_lead_with_the_priority_and_what_gives_it() -> None:
    job = parse_job(manifest(priorityClassName="high"))
    assert named_priority_classes(job) == ["high"]
    text = job_details(job, {"high": 1000})
    assert text.splitlines()[0] == "**Priority 1000** (PriorityClass high)"
    assert f"| master{UI_CELL_GAP} | 1{UI_CELL_GAP} | cpu 1 |" in text
    assert f"| worker{UI_CELL_GAP} | 2{UI_CELL_GAP} | cpu 2 |" in text
    # a class the fleet does not know counts as absent (job_priority), and says so
    assert job_details(job).splitlines()[0] == \
        "**Priority 0** (no PriorityClass; PriorityClass high not known)"
    assert priority_source(parse_job(manifest(priority=7))) == "spec.priority"
    assert priority_source(parse_job(manifest())) == "no PriorityClass"
