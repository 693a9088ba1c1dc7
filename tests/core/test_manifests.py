"""Loading manifests from files, directories and stdin: one clear line per problem,
never an exception, and no way to make the loader hang or blow up."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetq import models as M
from fleetq import resources as R
from fleetq.manifests import (
    MAX_OBJECT_BYTES,
    LoadResult,
    Source,
    load_manifests,
    parse_manifest_text,
    preemption_annotation_error,
)
from fleetq.preemption import job_policy, tree_policy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB_YAML = (EXAMPLES / "pytorch-test.yaml").read_text()
TREE_YAML = (EXAMPLES / "elasticquotatree.yaml").read_text()
POLICY_YAML = (EXAMPLES / "propagationpolicy-gang-queue.yaml").read_text()


def load_text(text: str, name: str = "m.yaml") -> LoadResult:
    return parse_manifest_text(text, name)


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def job_doc(**meta: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(JOB_YAML)
    doc["metadata"].update(meta)
    return doc


# --------------------------------------------------------------------------- the examples


def test_examples_directory_loads_with_notes_for_cross_file_copies() -> None:
    result = load_manifests([str(EXAMPLES)])
    assert result.errors == []
    kinds = sorted(obj.kind for _, obj in result.objects)
    assert kinds == ["ElasticQuotaTree", "PropagationPolicy", "PyTorchJob"]
    # The later file wins, as with kubectl apply -f examples/.
    (policy,) = result.of_kind(M.PropagationPolicy)
    assert not policy.queued
    ex = str(EXAMPLES)
    assert result.notes[-2:] == [
        f"PropagationPolicy default/example-policy: defined in "
        f"{ex}/propagationpolicy-gang-queue.yaml and again in {ex}/propagationpolicy-gang.yaml; "
        "the later one is used (as kubectl apply would)",
        f"PyTorchJob default/pytorch-test: defined identically in {ex}/pytorch-test.json "
        f"and {ex}/pytorch-test.yaml",
    ]


def test_json_example_is_the_same_job() -> None:
    from_json = load_manifests([str(EXAMPLES / "pytorch-test.json")])
    from_yaml = load_manifests([str(EXAMPLES / "pytorch-test.yaml")])
    assert from_json.errors == [] and from_yaml.errors == []
    (job_j,) = from_json.of_kind(M.PyTorchJob)
    (job_y,) = from_yaml.of_kind(M.PyTorchJob)
    assert job_j == job_y
    gang = M.gang_of(job_j)
    assert R.format_resources(gang.total) == "cpu 4.01, memory 4Gi"
    assert M.binding_result("cluster-a", gang) == "{cluster-a:0,[{master 1} {worker 2}]}"


def test_multi_document_sources_and_priority_class_from_same_load() -> None:
    doc = job_doc()
    for role in ("Master", "Worker"):
        doc["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["priorityClassName"] = "high"
    pc = (
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\n"
        "metadata: {name: high}\nvalue: 1000\n"
    )
    result = load_text(f"{pc}---\n{dump(doc)}---\n{TREE_YAML}", "all.yaml")
    assert result.errors == []
    assert [str(src) for src, _ in result.objects] == [
        "all.yaml",
        "all.yaml (document 2)",
        "all.yaml (document 3)",
    ]
    assert result.objects[1][0] == Source("all.yaml", 2)
    assert result.priority_classes() == {"high": 1000}
    (job,) = result.of_kind(M.PyTorchJob)
    assert M.gang_of(job, result.priority_classes()).priority == 1000
    assert M.gang_of(job).priority == 0


def test_kubectl_list_is_unwrapped() -> None:
    items = [yaml.safe_load(TREE_YAML), job_doc()]
    result = load_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}), "l.json")
    assert result.errors == []
    assert [o.kind for _, o in result.objects] == ["ElasticQuotaTree", "PyTorchJob"]


def test_stdin() -> None:
    result = load_manifests(["-"], stdin=io.StringIO(JOB_YAML))
    assert result.errors == []
    assert [str(src) for src, _ in result.objects] == ["<stdin>"]
    binary = io.TextIOWrapper(io.BytesIO(b"kind: \xff\n"))
    assert load_manifests(["-"], stdin=binary).errors == [
        "<stdin>: is not UTF-8 text (byte 0xff at offset 6)"
    ]


# --------------------------------------------------------------------------- cross-object checks


def test_second_elastic_quota_tree_names_both() -> None:
    other = TREE_YAML.replace("name: elasticquotatree", "name: second")
    result = load_text(f"{TREE_YAML}---\n{other}", "trees.yaml")
    assert result.errors == [
        "ElasticQuotaTree kube-system/second: is a second ElasticQuotaTree; only one is "
        "supported and ElasticQuotaTree kube-system/elasticquotatree (trees.yaml) is already "
        "defined"
    ]
    assert len(result.of_kind(M.ElasticQuotaTree)) == 1


def test_second_tree_in_another_file(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", TREE_YAML)
    b = write(tmp_path, "b.yaml", TREE_YAML.replace("name: elasticquotatree", "name: other"))
    assert load_manifests([a, b]).errors == [
        "ElasticQuotaTree kube-system/other: is a second ElasticQuotaTree; only one is "
        f"supported and ElasticQuotaTree kube-system/elasticquotatree ({a}) is already defined"
    ]


def test_same_object_twice_in_one_file_is_an_error() -> None:
    result = load_text(f"{JOB_YAML}---\n{JOB_YAML}", "jobs.yaml")
    assert result.errors == [
        "PyTorchJob default/pytorch-test: is defined twice in jobs.yaml (documents 1 and 2)"
    ]


def test_same_name_in_other_namespace_or_kind_is_fine() -> None:
    other_ns = dump(job_doc(namespace="team-a"))
    result = load_text(f"{JOB_YAML}---\n{other_ns}", "jobs.yaml")
    assert result.errors == [] and len(result.objects) == 2


def test_same_object_in_two_files_last_wins(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", POLICY_YAML)
    b = write(tmp_path, "b.yaml", (EXAMPLES / "propagationpolicy-gang.yaml").read_text())
    result = load_manifests([a, b])
    assert result.errors == []
    (policy,) = result.of_kind(M.PropagationPolicy)
    assert not policy.queued
    assert result.notes == [
        f"PropagationPolicy default/example-policy: defined in {a} and again in {b}; "
        "the later one is used (as kubectl apply would)"
    ]


def test_same_path_given_twice_is_read_once(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", JOB_YAML)
    result = load_manifests([a, a, str(tmp_path)])
    assert result.errors == [] and result.notes == [] and len(result.objects) == 1


# --------------------------------------------------------------------------- files and directories


def test_directory_is_read_recursively_in_lexical_order(tmp_path: Path) -> None:
    write(tmp_path, "b/job.yml", dump(job_doc(name="job-b")))
    write(tmp_path, "a.json", json.dumps(job_doc(name="job-a")))
    write(tmp_path, "c/d/job.yaml", dump(job_doc(name="job-c")))
    write(tmp_path, "notes.txt", "not a manifest")
    write(tmp_path, ".hidden/job.yaml", "garbage: [")
    result = load_manifests([str(tmp_path)])
    assert result.errors == []
    assert [o.metadata.name for _, o in result.objects] == ["job-a", "job-b", "job-c"]


def test_missing_path_and_directory_without_manifests(tmp_path: Path) -> None:
    write(tmp_path, "empty/readme.txt", "hi")
    result = load_manifests([str(tmp_path / "nope.yaml"), str(tmp_path / "empty")])
    assert result.errors == [
        f"{tmp_path}/nope.yaml: no such file or directory",
        f"{tmp_path}/empty: no *.yaml, *.yml or *.json files in this directory",
    ]


def test_other_yaml_in_a_directory_is_skipped_with_a_note(tmp_path: Path) -> None:
    write(tmp_path, "job.yaml", JOB_YAML)
    trace = write(tmp_path, "traces/t.yaml", "topology: {clusters: []}\nquota:\n  kind: X\n")
    result = load_manifests([str(tmp_path)])
    assert result.errors == []
    assert result.notes == [f"{trace}: skipped, not a Kubernetes manifest (no apiVersion or kind)"]
    assert len(result.objects) == 1
    # Named explicitly, it is a mistake.
    assert load_manifests([trace]).errors == ["object default/<unnamed>: kind is required"]
    # A directory with nothing but such files has no manifests.
    only = str(tmp_path / "traces")
    assert load_manifests([only]).errors == [f"{only}: no Kubernetes manifests in this directory"]


def test_a_manifest_missing_kind_in_a_directory_is_still_an_error(tmp_path: Path) -> None:
    write(tmp_path, "job.yaml", JOB_YAML.replace("kind: PyTorchJob\n", ""))
    assert load_manifests([str(tmp_path)]).errors == [
        "object default/pytorch-test: kind is required"
    ]


def test_explicit_file_with_any_extension_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "job.txt", JOB_YAML)
    assert load_manifests([path]).errors == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty (no manifests)"),
        ("# just a comment\n---\n", "is empty (no manifests)"),
        ("   \n\n", "is empty (no manifests)"),
    ],
)
def test_empty_files(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path, "e.yaml", content)
    assert load_manifests([path]).errors == [f"{path}: {message}"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "kind: PyTorchJob\nspec: [1, 2\n",
            "line 3, column 1: did not find expected ',' or ']' while parsing a flow sequence "
            "(not valid YAML)",
        ),
        (
            "hello world\n",
            "document 1 is not a mapping (a Kubernetes object); it is the text 'hello world'",
        ),
        ("- a\n- b\n", "document 1 is not a mapping (a Kubernetes object); it is a list"),
        (
            "a:\tb: c\n\t",
            "line 1, column 5: mapping values are not allowed in this context (not valid YAML)",
        ),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is a binary file, not YAML or JSON"),
        (b"name: caf\xe9\n", "is not UTF-8 text (byte 0xe9 at offset 9)"),
        ("a: 1\nb: 2\na: 3\n", "line 3: duplicate key 'a' (first at line 1)"),
        ("on: 1\n", "line 1: key 'on' is not a string but bool 'True' in YAML; quote it"),
        ("x: !!python/object:os.system {}\n", None),
    ],
)
def test_non_manifest_input(tmp_path: Path, content: str | bytes, message: str | None) -> None:
    path = write(tmp_path, "bad.yaml", content)
    (line,) = load_manifests([path]).errors
    if message is None:
        assert line.startswith(f"{path}: line 1, column 4: could not determine a constructor")
    else:
        assert line == f"{path}: {message}"


def test_duplicate_keys_deep_in_a_manifest() -> None:
    text = JOB_YAML.replace("      replicas: 2\n", "      replicas: 2\n      replicas: 3\n")
    (line,) = load_text(text).errors
    assert line == "m.yaml: line 52: duplicate key 'replicas' (first at line 51)"


def test_merge_keys_are_not_duplicates() -> None:
    text = (
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\n"
        "base: &b {value: 5}\nmetadata: {name: high}\n<<: *b\nvalue: 10\n"
    )
    result = load_text(text)
    assert result.errors == []
    assert result.priority_classes() == {"high": 10}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"kind": "PyTorchJob", "kind": "PyTorchJob"}', "duplicate key 'kind' (JSON)"),
        ('{"kind": \n', "line 2, column 1: Expecting value (JSON)"),
        ("[" * 5000 + "]" * 5000, "nested deeper than 64 levels"),
    ],
)
def test_json_problems(tmp_path: Path, content: str, message: str) -> None:
    path = write(tmp_path, "bad.json", content)
    assert load_manifests([path]).errors == [f"{path}: {message}"]


def test_yaml_flow_mapping_is_not_mistaken_for_json() -> None:
    text = "{apiVersion: scheduling.k8s.io/v1, kind: PriorityClass, metadata: {name: a}, value: 1}"
    assert load_text(text).errors == []


def test_dates_stay_strings() -> None:
    doc = job_doc()
    doc["metadata"]["annotations"] = {"since": "2024-01-01"}
    text = dump(doc).replace("'2024-01-01'", "2024-01-01")
    assert "since: 2024-01-01" in text
    result = load_text(text)
    assert result.errors == []
    (job,) = result.of_kind(M.PyTorchJob)
    assert job.metadata.annotations == {"since": "2024-01-01"}


def test_values_json_cannot_carry() -> None:
    doc = job_doc()
    text = dump(doc).replace("cleanPodPolicy: None", "cleanPodPolicy: !!binary aGVsbG8=")
    assert load_text(text).errors == [
        "PyTorchJob default/pytorch-test: spec.cleanPodPolicy is binary data (!!binary), which "
        "JSON cannot hold"
    ]
    text = dump(doc).replace("cleanPodPolicy: None", "cleanPodPolicy: .inf")
    assert load_text(text).errors == [
        "PyTorchJob default/pytorch-test: spec.cleanPodPolicy inf is not a finite number"
    ]


def test_bad_preemption_annotations_are_refused_with_the_workflows_line() -> None:
    tree = yaml.safe_load(TREE_YAML)
    tree["metadata"]["annotations"] = {"fleetq.io/reclaim": "Always"}
    bad_job = job_doc(name="bad", annotations={"fleetq.io/preemption-grace-seconds": "1e3"})
    good_job = job_doc(annotations={"fleetq.io/preemptible": "false"})
    result = load_text("---\n".join(dump(d) for d in (tree, bad_job, good_job)))
    # the models still parse them (stored trees and job histories must keep parsing) ...
    parsed_tree, parsed_job = M.parse_tree(tree), M.parse_job(bad_job)
    # ... the loader refuses them with exactly what the quota and job workflows raise
    with pytest.raises(M.ManifestError) as tree_error:
        tree_policy(parsed_tree)
    with pytest.raises(M.ManifestError) as job_error:
        job_policy(parsed_job)
    assert result.errors == [str(tree_error.value), str(job_error.value)]
    assert result.errors == [
        "ElasticQuotaTree kube-system/elasticquotatree: metadata.annotations.fleetq.io/reclaim "
        "must be Never, LowerPriority or Any, got 'Always'",
        "PyTorchJob default/bad: metadata.annotations.fleetq.io/preemption-grace-seconds must "
        "be a whole number of seconds between 0 and 86400, got '1e3'",
    ]
    assert [(o.kind, o.metadata.name) for _, o in result.objects] == [
        ("PyTorchJob", "pytorch-test")
    ]


def test_objects_without_preemption_annotations_are_never_refused_for_them() -> None:
    result = load_text("---\n".join((TREE_YAML, POLICY_YAML, JOB_YAML)))
    assert result.errors == []
    assert [preemption_annotation_error(o) for _, o in result.objects] == [None, None, None]


# --------------------------------------------------------------------------- hostile input


def test_billion_laughs_is_rejected_quickly() -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    start = time.perf_counter()
    result = load_text("\n".join(lines) + "\n", "bomb.yaml")
    assert time.perf_counter() - start < 1.0
    assert result.errors == [
        "bomb.yaml: document 1: line 6: expands to more than 200000 nodes through aliases "
        "(a YAML bomb?)"
    ]


def test_recursive_alias_is_rejected() -> None:
    assert load_text("x: &a [1, *a]\n").errors == [
        "m.yaml: document 1: line 1: alias *a refers to a collection that contains it (recursive)"
    ]


def test_a_few_aliases_are_fine() -> None:
    doc = job_doc()
    text = dump(doc).replace("  cleanPodPolicy: None\n", "  cleanPodPolicy: &p None\n  x: *p\n")
    assert load_text(text).errors == []


def test_deep_nesting_is_rejected() -> None:
    text = "a: " + "[" * 10_000 + "]" * 10_000 + "\n"
    assert load_text(text).errors == ["m.yaml: document 1: line 1: nested deeper than 64 levels"]
    block = "".join("  " * i + f"k{i}:\n" for i in range(100)) + "  " * 100 + "v\n"
    assert load_text(block).errors == ["m.yaml: document 1: line 65: nested deeper than 64 levels"]


def test_object_of_a_megabyte_is_rejected_with_its_name() -> None:
    doc = job_doc()
    doc["metadata"]["annotations"] = {"blob": "x" * MAX_OBJECT_BYTES}
    start = time.perf_counter()
    result = load_text(json.dumps(doc), "big.json")
    assert time.perf_counter() - start < 2.0
    assert result.errors == [
        "PyTorchJob default/pytorch-test: is 1.0 MiB as JSON; an object may be at most 1 MiB "
        "(it must fit a Temporal payload)"
    ]
    doc["metadata"]["annotations"] = {"blob": "x" * 500_000}
    assert load_text(dump(doc)).errors == []


def test_huge_numbers() -> None:
    text = JOB_YAML.replace("replicas: 2", "replicas: " + "9" * 5000)
    assert load_text(text).errors == [
        "m.yaml: line 51: number 99999999999999999999... is too large (5000 digits)"
    ]
    text = JOB_YAML.replace("replicas: 2", "replicas: 99999999999999999999")
    assert load_text(text).errors == [
        "PyTorchJob default/pytorch-test: spec.pytorchReplicaSpecs.Worker.replicas must be <= 10000"
    ]
    text = TREE_YAML.replace("cpu: 10000", "cpu: 1e30")
    assert load_text(text).errors == [
        "ElasticQuotaTree kube-system/elasticquotatree: spec.root.children[0].max.cpu '1e30' is "
        "too large"
    ]


def test_invalid_and_unicode_names() -> None:
    text = JOB_YAML.replace("name: pytorch-test\n  namespace", "name: pytörch\n  namespace")
    assert load_text(text).errors == [
        "PyTorchJob default/pytörch: metadata.name 'pytörch' is not a DNS-1035 label "
        "(lowercase letters, digits and '-', starting with a letter, ending with a letter or "
        "digit, at most 63 characters)"
    ]
    text = JOB_YAML.replace("namespace: default", "namespace: Default")
    assert load_text(text).errors == [
        "PyTorchJob Default/pytorch-test: metadata.namespace 'Default' is not a valid "
        "Kubernetes name (lowercase letters, digits, '-')"
    ]


def test_unknown_fields_in_pod_templates_survive_a_round_trip() -> None:
    text = JOB_YAML.replace(
        "          schedulerName: default-scheduler\n",
        "          schedulerName: default-scheduler\n          someFutureField: {a: [1]}\n",
    )
    (job,) = load_text(text).of_kind(M.PyTorchJob)
    assert job.model_dump(mode="json", exclude_unset=True) == yaml.safe_load(text)


@settings(max_examples=150, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("ab:- \n[]{}&*!|>'\"#,.?%@`\t0") + ["\u00e9"]), max_size=60
    )
)
def test_arbitrary_text_never_raises(text: str) -> None:
    result = load_text(text)
    for line in result.errors:
        assert "\n" not in line


# --------------------------------------------------------------------------- warnings


def test_warnings_are_for_the_copy_that_is_used(tmp_path: Path) -> None:
    """A field accepted but not used warns once, for the object the load keeps: a later
    file without it (kubectl's "last applied wins") leaves no warning, and a refused
    object gives its error only."""
    spread = POLICY_YAML.replace(
        "  placement:\n", "  placement:\n    spreadConstraints:\n    - maxGroups: 1\n")
    assert spread != POLICY_YAML
    policy = "PropagationPolicy default/example-policy"
    line = (f"{policy}: spec.placement.spreadConstraints accepted, not used by fleetq "
            "(a gang goes to one cluster)")
    result = load_manifests([write(tmp_path, "a.yaml", spread)])
    assert (result.errors, result.warnings) == ([], [line])
    result = load_manifests([write(tmp_path, "a.yaml", spread),
                             write(tmp_path, "b.yaml", POLICY_YAML)])
    assert result.ok and result.warnings == []
    assert len(result.of_kind(M.PropagationPolicy)) == 1
    bad = spread.replace("  propagateDeps: true", "  propagateDeps: false")
    result = load_text(bad)
    assert result.warnings == []
    assert result.errors == [
        f"{policy}: spec.propagateDeps must be true when spec.failover.application is set"]
