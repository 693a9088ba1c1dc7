"""``fleetq validate`` (and, for preemption annotations, ``fleetq apply``): what a user sees
for good and bad manifests, and the exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fleetq.cli import app
from fleetq.client.apply import apply_objects, load_for_apply
from fleetq.client.errors import InvalidInput
from fleetq.models import parse_object
from tests.cli.conftest import CliFleet

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB_YAML = (EXAMPLES / "pytorch-test.yaml").read_text()
TREE_YAML = (EXAMPLES / "elasticquotatree.yaml").read_text()
POLICY_YAML = (EXAMPLES / "propagationpolicy-gang-queue.yaml").read_text()

runner = CliRunner()

TREE = "ElasticQuotaTree kube-system/elasticquotatree"
JOB = "PyTorchJob default/pytorch-test"
POLICY = "PropagationPolicy default/example-policy"


def validate(*args: str, stdin: str | bytes | None = None) -> tuple[int, list[str]]:
    result = runner.invoke(app, ["validate", *args], input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.output.splitlines()


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def test_examples_directory_passes() -> None:
    code, lines = validate("-f", str(EXAMPLES))
    assert code == 0
    assert lines[:3] == [
        "OK ElasticQuotaTree kube-system/elasticquotatree",
        "OK PropagationPolicy default/example-policy",
        "OK PyTorchJob default/pytorch-test",
    ]
    assert all(line.startswith("note: ") for line in lines[3:])


def test_repeatable_files_and_stdin() -> None:
    code, lines = validate(
        "-f", str(EXAMPLES / "elasticquotatree.yaml"), "--filename", "-", stdin=JOB_YAML
    )
    assert (code, lines) == (0, [f"OK {TREE}", f"OK {JOB}"])


def _mutated(text: str, edit: str, replacement: str) -> str:
    assert edit in text
    return text.replace(edit, replacement)


# Each case: (file content, the exact line a user sees after "<file>: " or as is).
CASES = {
    "tree outside kube-system": (
        _mutated(TREE_YAML, "namespace: kube-system", "namespace: default"),
        "ElasticQuotaTree default/elasticquotatree: metadata.namespace must be kube-system "
        "(ElasticQuotaTree is only read there), got 'default'",
    ),
    "duplicate node names": (
        _mutated(TREE_YAML, "- name: child-2", "- name: root"),
        f"{TREE}: spec.root.children[0].name 'root' is used twice (also at spec.root)",
    ),
    "namespace on a non-leaf": (
        _mutated(TREE_YAML, "    children:\n", "    namespaces: [team]\n    children:\n"),
        f"{TREE}: spec.root.namespaces namespaces attach to leaves only; 'root' has children",
    ),
    "namespace on two leaves": (
        TREE_YAML + "    - name: child-3\n      namespaces: [default]\n",
        f"{TREE}: spec.root.children[1].namespaces namespace 'default' is already on leaf "
        "'child-2'",
    ),
    "children min exceeds parent min": (
        _mutated(TREE_YAML, "      namespaces:", "      min: {cpu: 1}\n      namespaces:")
        + "    - name: child-3\n      min: {cpu: 999900}\n",
        f"{TREE}: spec.root.children the children's min cpu 999901 exceeds 'root' min cpu 999900",
    ),
    "negative quantity": (
        _mutated(TREE_YAML, "cpu: 10000", "cpu: -4"),
        f"{TREE}: spec.root.children[0].max.cpu '-4' must not be negative",
    ),
    "malformed quantity": (
        _mutated(TREE_YAML, "memory: 10000Gi", "memory: 10000 GB"),
        f"{TREE}: spec.root.children[0].max.memory '10000 GB' is not a quantity",
    ),
    "min greater than max": (
        _mutated(TREE_YAML, "      namespaces:", "      min: {cpu: 20000}\n      namespaces:"),
        f"{TREE}: spec.root.children[0].min.cpu 20000 exceeds max.cpu 10000",
    ),
    "negative replicas": (
        _mutated(JOB_YAML, "replicas: 2", "replicas: -1"),
        f"{JOB}: spec.pytorchReplicaSpecs.Worker.replicas must be at least 1",
    ),
    "no Master": (
        _mutated(JOB_YAML, "    Master:", "    Launcher:"),
        f"{JOB}: spec.pytorchReplicaSpecs 'Launcher' is not a PyTorchJob replica type "
        "(Master, Worker)",
    ),
    "Master without replicas": (
        _mutated(JOB_YAML, "      replicas: 1\n", ""),
        f"{JOB}: spec.pytorchReplicaSpecs.Master.replicas must be 1",
    ),
    "container without image": (
        _mutated(JOB_YAML, "            image: registry-cn-hangzhou.ack.aliyuncs.com/acs/nginx\n"
                 "            imagePullPolicy: Always\n            name: pytorch\n"
                 "            resources:\n              limits:\n                cpu: \"3\"",
                 "            name: pytorch\n"
                 "            resources:\n              limits:\n                cpu: \"3\""),
        f"{JOB}: spec.pytorchReplicaSpecs.Master.template.spec.containers[0].image is required",
    ),
    "no container named pytorch": (
        JOB_YAML.replace("name: pytorch\n", "name: trainer\n", 1),
        f"{JOB}: spec.pytorchReplicaSpecs.Master.template.spec.containers must have a container "
        "named pytorch",
    ),
    "name not a DNS-1035 label": (
        _mutated(JOB_YAML, "name: pytorch-test\n  namespace", "name: 1-test\n  namespace"),
        "PyTorchJob default/1-test: metadata.name '1-test' is not a DNS-1035 label (lowercase "
        "letters, digits and '-', starting with a letter, ending with a letter or digit, at most "
        "63 characters)",
    ),
    "elastic nProcPerNode with nprocPerNode": (
        _mutated(JOB_YAML, "  pytorchReplicaSpecs:\n",
                 "  nprocPerNode: \"2\"\n  elasticPolicy: {nProcPerNode: 2}\n"
                 "  pytorchReplicaSpecs:\n"),
        f"{JOB}: spec.elasticPolicy.nProcPerNode must not be used with spec.nprocPerNode",
    ),
    "cleanPodPolicy not a string": (
        _mutated(JOB_YAML, "  pytorchReplicaSpecs:\n",
                 "  runPolicy: {cleanPodPolicy: 3}\n  pytorchReplicaSpecs:\n"),
        f"{JOB}: spec.runPolicy.cleanPodPolicy must be a string",
    ),
    "policy without resourceSelectors": (
        POLICY_YAML[: POLICY_YAML.index("  resourceSelectors:")],
        f"{POLICY}: spec.resourceSelectors is required",
    ),
    "negative tolerationSeconds": (
        _mutated(POLICY_YAML, "tolerationSeconds: 30", "tolerationSeconds: -30"),
        f"{POLICY}: spec.failover.application.decisionConditions.tolerationSeconds must be >= 0",
    ),
    "unknown purgeMode": (
        _mutated(POLICY_YAML, "purgeMode: Immediately", "purgeMode: Eventually"),
        f"{POLICY}: spec.failover.application.purgeMode 'Eventually' is not a purgeMode "
        "(Immediately|Graciously|Never or Directly|Gracefully|Never)",
    ),
    "unknown scheduling field": (
        _mutated(POLICY_YAML, "  propagateDeps: true", "  propagateDependencies: true"),
        f"{POLICY}: spec.propagateDependencies is not a known field",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rejection_is_one_line_naming_object_and_field(tmp_path: Path, case: str) -> None:
    content, expected = CASES[case]
    path = write(tmp_path, "m.yaml", content)
    code, lines = validate("-f", path)
    assert code == 1
    assert lines == [expected]


def test_second_tree_names_both(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", TREE_YAML)
    second = write(tmp_path, "b.yaml", TREE_YAML.replace("name: elasticquotatree", "name: two"))
    code, lines = validate("-f", first, "-f", second)
    assert code == 1
    assert lines == [
        f"OK {TREE}",
        "ElasticQuotaTree kube-system/two: is a second ElasticQuotaTree; only one is supported "
        f"and {TREE} ({first}) is already defined",
    ]


def test_good_and_bad_objects_together(tmp_path: Path) -> None:
    bad = JOB_YAML.replace("name: pytorch-test\n  namespace", "name: bad-job\n  namespace")
    bad = bad.replace("replicas: 2", "replicas: -2")
    path = write(tmp_path, "jobs.yaml", f"{JOB_YAML}---\n{bad}")
    code, lines = validate("-f", path)
    assert code == 1
    assert lines == [
        f"OK {JOB}",
        "PyTorchJob default/bad-job: spec.pytorchReplicaSpecs.Worker.replicas must be at least 1",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "is empty (no manifests)"),
        (
            "just some text\n",
            "document 1 is not a mapping (a Kubernetes object); it is the text 'just some text'",
        ),
        (
            "kind: [\n",
            "line 2, column 1: did not find expected node content while parsing a "
            "flow node (not valid YAML)",
        ),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "is a binary file, not YAML or JSON"),
        (b"\xc3\x28", "is not UTF-8 text (byte 0xc3 at offset 0)"),
        ("a: 1\na: 2\n", "line 2: duplicate key 'a' (first at line 1)"),
    ],
)
def test_files_that_are_not_manifests(tmp_path: Path, content: str | bytes, message: str) -> None:
    path = write(tmp_path, "x.yaml", content)
    code, lines = validate("-f", path)
    assert (code, lines) == (1, [f"{path}: {message}"])


def test_paths_that_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, lines = validate("-f", str(tmp_path / "missing.yaml"), "-f", str(tmp_path / "empty"))
    assert code == 1
    assert lines == [
        f"{tmp_path}/missing.yaml: no such file or directory",
        f"{tmp_path}/empty: no *.yaml, *.yml or *.json files in this directory",
    ]


def test_yaml_bomb_on_stdin() -> None:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    code, out = validate("-f", "-", stdin="\n".join(lines))
    assert code == 1
    assert out == [
        "<stdin>: document 1: line 6: expands to more than 200000 nodes through aliases "
        "(a YAML bomb?)"
    ]


def test_round_trip_of_pod_template_fields_is_not_validated_away(tmp_path: Path) -> None:
    doc = yaml.safe_load(JOB_YAML)
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["shareProcessNamespace"] = True
    path = write(tmp_path, "job.yaml", yaml.safe_dump(doc))
    assert validate("-f", path) == (0, [f"OK {JOB}"])


def test_missing_filename_option_is_a_usage_error() -> None:
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_real_process_plain_output_and_exit_code(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", JOB_YAML.replace("replicas: 2", "replicas: -1"))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from fleetq.cli import main; main()",
            "validate",
            "-f",
            str(EXAMPLES / "pytorch-test.yaml"),
            "-f",
            bad,
            "-f",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "\x1b[" not in proc.stdout  # no colour codes when not a terminal
    assert proc.stdout.splitlines() == [
        f"OK {JOB}",
        f"{JOB}: spec.pytorchReplicaSpecs.Worker.replicas must be at least 1",
    ]
    assert proc.stderr == ""


def test_dangling_symlink_is_reported_not_raised(tmp_path: Path) -> None:
    link = tmp_path / "gone.yaml"
    link.symlink_to(tmp_path / "nowhere.yaml")
    code, lines = validate("-f", str(tmp_path))
    assert (code, lines) == (1, [f"{link}: cannot be read (No such file or directory)"])


def test_master_only_and_elastic_worker_only_jobs_pass(tmp_path: Path) -> None:
    master_only = JOB_YAML[: JOB_YAML.index("    Worker:")]
    elastic = _mutated(JOB_YAML, "  pytorchReplicaSpecs:\n",
                       "  elasticPolicy: {minReplicas: 1, maxReplicas: 2, rdzvBackend: c10d}\n"
                       "  runPolicy: {cleanPodPolicy: All, activeDeadlineSeconds: 60}\n"
                       "  pytorchReplicaSpecs:\n")
    elastic = elastic.replace("name: pytorch-test\n  namespace", "name: elastic\n  namespace")
    elastic = elastic[: elastic.index("    Master:")] + elastic[elastic.index("    Worker:"):]
    code, lines = validate("-f", write(tmp_path, "a.yaml", master_only),
                           "-f", write(tmp_path, "b.yaml", elastic))
    assert (code, lines) == (0, [f"OK {JOB}", "OK PyTorchJob default/elastic"])


# --------------------------------------------------------------------------- preemption annotations
# fleetq.io/preemption, reclaim and fair-share-weight on the tree, fleetq.io/preemptible and
# preemption-grace-seconds on a job: refused by validate and apply with the line the quota
# and job workflows use, before anything is created.


def annotated(text: str, name: str | None = None, **annotations: str) -> str:
    doc = yaml.safe_load(text)
    doc["metadata"]["annotations"] = annotations
    if name is not None:
        doc["metadata"]["name"] = name
    return yaml.safe_dump(doc, sort_keys=False)


ANNOTATIONS = "metadata.annotations"
# Each case: (the manifest it goes on, its annotations, the line after "<Kind> <ns>/<name>: ").
BAD_PREEMPTION = {
    "tree preemption": (
        TREE_YAML, {"fleetq.io/preemption": "Always"},
        f"{ANNOTATIONS}.fleetq.io/preemption must be Never or LowerPriority, got 'Always'",
    ),
    "tree reclaim": (
        TREE_YAML, {"fleetq.io/reclaim": "x"},
        f"{ANNOTATIONS}.fleetq.io/reclaim must be Never, LowerPriority or Any, got 'x'",
    ),
    "tree reclaim in the wrong case": (
        TREE_YAML, {"fleetq.io/preemption": "LowerPriority", "fleetq.io/reclaim": "any"},
        f"{ANNOTATIONS}.fleetq.io/reclaim must be Never, LowerPriority or Any, got 'any'",
    ),
    "fair-share weight zero": (
        TREE_YAML, {"fleetq.io/fair-share-weight": "child-2=0"},
        f"{ANNOTATIONS}.fleetq.io/fair-share-weight weight of 'child-2' must be a positive "
        "number, got '0'",
    ),
    "fair-share weight of an unknown node": (
        TREE_YAML, {"fleetq.io/fair-share-weight": "root=1,team-x=2"},
        f"{ANNOTATIONS}.fleetq.io/fair-share-weight names no node of the tree: 'team-x'",
    ),
    "fair-share weight without a node": (
        TREE_YAML, {"fleetq.io/fair-share-weight": "2"},
        f"{ANNOTATIONS}.fleetq.io/fair-share-weight must be node=weight pairs separated by "
        "commas, got '2'",
    ),
    "job preemptible": (
        JOB_YAML, {"fleetq.io/preemptible": "no"},
        f"{ANNOTATIONS}.fleetq.io/preemptible must be \"true\" or \"false\", got 'no'",
    ),
    "job grace negative": (
        JOB_YAML, {"fleetq.io/preemption-grace-seconds": "-1"},
        f"{ANNOTATIONS}.fleetq.io/preemption-grace-seconds must be a whole number of seconds "
        "between 0 and 86400, got '-1'",
    ),
    "job grace over a day": (
        JOB_YAML, {"fleetq.io/preemptible": "false", "fleetq.io/preemption-grace-seconds": "86401"},
        f"{ANNOTATIONS}.fleetq.io/preemption-grace-seconds must be a whole number of seconds "
        "between 0 and 86400, got '86401'",
    ),
    "job grace not whole": (
        JOB_YAML, {"fleetq.io/preemption-grace-seconds": "1.5"},
        f"{ANNOTATIONS}.fleetq.io/preemption-grace-seconds must be a whole number of seconds "
        "between 0 and 86400, got '1.5'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_PREEMPTION))
def test_bad_preemption_annotation_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    base, notes, message = BAD_PREEMPTION[case]
    ref = TREE if base is TREE_YAML else JOB
    path = write(tmp_path, "m.yaml", annotated(base, **notes))
    assert validate("-f", path) == (1, [f"{ref}: {message}"])


def test_good_preemption_annotations_pass(tmp_path: Path) -> None:
    tree = annotated(TREE_YAML, **{"fleetq.io/preemption": "LowerPriority",
                                   "fleetq.io/reclaim": "Any",
                                   "fleetq.io/fair-share-weight": "root=1, child-2=2.5"})
    never = annotated(TREE_YAML, name="never", **{"fleetq.io/preemption": "Never",
                                                  "fleetq.io/reclaim": "LowerPriority"})
    opted_out = annotated(JOB_YAML, **{"fleetq.io/preemptible": "false",
                                       "fleetq.io/preemption-grace-seconds": "0"})
    day = annotated(JOB_YAML, name="day", **{"fleetq.io/preemptible": "true",
                                            "fleetq.io/preemption-grace-seconds": "86400"})
    code, lines = validate("-f", write(tmp_path, "tree.yaml", tree),
                           "-f", write(tmp_path, "jobs.yaml", f"{opted_out}---\n{day}"))
    assert (code, lines) == (0, [f"OK {TREE}", f"OK {JOB}", "OK PyTorchJob default/day"])
    code, lines = validate("-f", write(tmp_path, "never.yaml", never))
    assert (code, lines) == (0, ["OK ElasticQuotaTree kube-system/never"])
    # the apply path loads them the same way
    objects, _, _ = load_for_apply([str(tmp_path / "tree.yaml"), str(tmp_path / "jobs.yaml")])
    assert [o.metadata.name for o, _ in objects] == ["elasticquotatree", "pytorch-test", "day"]


def test_bad_annotations_of_several_objects_are_all_listed(tmp_path: Path) -> None:
    tree = annotated(TREE_YAML, **{"fleetq.io/preemption": "Always"})
    job = annotated(JOB_YAML, **{"fleetq.io/preemptible": "no"})
    code, lines = validate("-f", write(tmp_path, "all.yaml", f"{tree}---\n{job}"))
    assert code == 1
    assert lines == [f"{TREE}: {BAD_PREEMPTION['tree preemption'][2]}",
                     f"{JOB}: {BAD_PREEMPTION['job preemptible'][2]}"]


class _NoFleet:
    """A Temporal client that must not be used."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"apply_objects used the client ({name}) for refused input")


async def test_apply_objects_refuses_objects_built_without_the_loader() -> None:
    good = parse_object(yaml.safe_load(POLICY_YAML))
    tree = parse_object(yaml.safe_load(annotated(TREE_YAML, **{"fleetq.io/reclaim": "x"})))
    job = parse_object(yaml.safe_load(
        annotated(JOB_YAML, **{"fleetq.io/preemption-grace-seconds": "soon"})))
    objects = [(o, o.model_dump(mode="json", by_alias=True)) for o in (good, tree, job)]
    with pytest.raises(InvalidInput) as refused:
        await apply_objects(_NoFleet(), objects)  # type: ignore[arg-type]
    assert str(refused.value).splitlines() == [
        f"{TREE}: {BAD_PREEMPTION['tree reclaim'][2]}",
        f"{JOB}: {ANNOTATIONS}.fleetq.io/preemption-grace-seconds must be a whole number of "
        "seconds between 0 and 86400, got 'soon'",
    ]


@pytest.mark.parametrize("case", list(BAD_PREEMPTION))
async def test_apply_refuses_bad_preemption_annotation_and_creates_nothing(
    cli_fleet: CliFleet, tmp_path: Path, case: str
) -> None:
    base, notes, message = BAD_PREEMPTION[case]
    is_tree = base is TREE_YAML
    name = "preempting-tree" if is_tree else "preempting-job"
    bad = write(tmp_path, "bad.yaml", annotated(base, name=name, **notes))
    policy = write(tmp_path, "policy.yaml", POLICY_YAML.replace(
        "name: example-policy", "name: never-applied-preemption"))
    r = await cli_fleet.run("apply", "-f", policy, "-f", bad)
    assert r.exit_code == 1
    ref = f"ElasticQuotaTree kube-system/{name}" if is_tree else f"PyTorchJob default/{name}"
    assert r.stderr.splitlines() == [f"{ref}: {message}"]
    assert r.stdout == ""
    r = await cli_fleet.run("get", "elasticquotatree" if is_tree else "pytorchjob", name)
    assert r.exit_code == 1
    assert "NotFound" in r.stderr
    r = await cli_fleet.run("get", "propagationpolicy", "never-applied-preemption")
    assert r.exit_code == 1
    assert "NotFound" in r.stderr


# --------------------------------------------------------------------------- accepted, not used

SPREAD = POLICY_YAML.replace(
    "  placement:\n",
    "  placement:\n    spreadConstraints:\n    - spreadByField: cluster\n      maxGroups: 1\n",
)
SPREAD_WARNING = (
    f"warning: {POLICY}: spec.placement.spreadConstraints accepted, not used by fleetq "
    "(a gang goes to one cluster)"
)


def test_validate_warns_once_per_field_accepted_but_not_used(tmp_path: Path) -> None:
    """A Karmada field fleetq does not act on (pkg/apis/policy/v1alpha1
    propagation_types.go Placement.SpreadConstraints) passes with one warning line, and
    a koord-queue quota node's attributes too; the exit code stays 0."""
    assert SPREAD != POLICY_YAML
    tree = TREE_YAML.replace("    - name: child-2\n",
                             "    - name: child-2\n      attributes: {team: vision}\n")
    assert tree != TREE_YAML
    code, lines = validate("-f", write(tmp_path, "p.yaml", SPREAD),
                           "-f", write(tmp_path, "t.yaml", tree))
    assert code == 0
    assert lines == [
        f"OK {POLICY}",
        f"OK {TREE}",
        SPREAD_WARNING,
        f"warning: {TREE}: spec.root.children[0].attributes accepted, not used by fleetq",
    ]


def test_upstream_refusal_is_one_line(tmp_path: Path) -> None:
    """Karmada ValidatePropagationSpec: application failover needs propagateDeps."""
    bad = POLICY_YAML.replace("  propagateDeps: true", "  propagateDeps: false")
    assert bad != POLICY_YAML
    code, lines = validate("-f", write(tmp_path, "p.yaml", bad))
    assert (code, lines) == (1, [
        f"{POLICY}: spec.propagateDeps must be true when spec.failover.application is set"])


async def test_apply_prints_the_warning_and_applies(cli_fleet: CliFleet,
                                                    tmp_path: Path) -> None:
    """``fleetq apply -f`` shows the same warning line (stderr, no traceback), applies the
    policy and keeps the field as written."""
    doc = SPREAD.replace("name: example-policy", "name: spread-policy")
    r = await cli_fleet.run("apply", "-f", write(tmp_path, "p.yaml", doc))
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == \
        "propagationpolicy.policy.one.alibabacloud.com/spread-policy created"
    assert r.stderr.splitlines() == [
        SPREAD_WARNING.replace("example-policy", "spread-policy")]
    r = await cli_fleet.run("get", "propagationpolicy", "spread-policy", "-o", "yaml")
    got = yaml.safe_load(r.stdout)
    assert got["spec"]["placement"]["spreadConstraints"] == [
        {"spreadByField": "cluster", "maxGroups": 1}]
