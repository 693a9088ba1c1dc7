"""The fleet config file: paths, defaults and one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.fleet import Fleet
from fleetq.fleet_config import FleetConfigError, load_fleet_config

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- {name: a, cluster: {server: "http://127.0.0.1:1"}}
users:
- {name: u, user: {token: t}}
contexts:
- {name: a, context: {cluster: a, user: u}}
current-context: a
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "kube").mkdir(exist_ok=True)
    (tmp_path / "kube" / "config").write_text(KUBECONFIG)
    p = tmp_path / "fleet.yaml"
    p.write_text(text)
    return p


def test_relative_paths_resolve_against_the_config_directory(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "kubeconfig: kube/config\n"
        "source: {context: a}\n"
        "clusters:\n"
        "- {name: cluster-a, context: a, labels: {region: east}, reservation: true,\n"
        "   taints: [{key: gpu, value: 'yes', effect: NoSchedule}]}\n"
        "- {name: cluster-b, kubeconfig: ./kube/config}\n",
    )
    cfg = load_fleet_config(p)
    kube = str((tmp_path / "kube" / "config").resolve())
    assert cfg.kubeconfig == kube
    assert cfg.cluster_kubeconfig(cfg.clusters[1]) == kube
    assert cfg.source_kubeconfig() == kube
    assert cfg.clusters[0].labels == {"region": "east"} and cfg.clusters[0].reservation
    assert cfg.clusters[1].context_name == "cluster-b"  # context defaults to the name
    assert (cfg.timeouts.connectSeconds, cfg.timeouts.readSeconds) == (3.0, 10.0)
    assert cfg.cacheTTLSeconds == 2.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clusters: []\nkubeconfig: kube/config\n", "clusters must not be empty"),
        ("kubeconfig: kube/config\nclusters:\n- {context: a}\n", "clusters[0].name is required"),
        ("kubeconfig: kube/config\nclusters:\n- {name: Bad_Name}\n", "clusters[0].name"),
        ("clusters:\n- {name: a}\n", "clusters[0].kubeconfig is required"),
        ("kubeconfig: nope.yaml\nclusters:\n- {name: a}\n", "kubeconfig"),
        ("kubeconfig: kube/config\nclusters:\n- {name: a, colour: red}\n",
         "clusters[0].colour is not a known field"),
        ("kubeconfig: kube/config\nclusters:\n- {name: a}\n- {name: a}\n",
         "clusters[1].name 'a' is declared twice"),
        ("kubeconfig: kube/config\ntimeouts: {connectSeconds: -1}\nclusters:\n- {name: a}\n",
         "timeouts.connectSeconds"),
        ("kubeconfig: kube/config\nclusters: [\n", "not valid YAML"),
        ("- just a list\n", "must be a mapping"),
    ],
)
def test_bad_config_is_one_line_naming_the_field(tmp_path: Path, text: str, expected: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(FleetConfigError) as err:
        load_fleet_config(p)
    msg = str(err.value)
    assert expected in msg
    assert "\n" not in msg
    assert str(p) in msg


def test_missing_file_and_unknown_context(tmp_path: Path) -> None:
    with pytest.raises(FleetConfigError, match="cannot read"):
        load_fleet_config(tmp_path / "absent.yaml")
    p = write(tmp_path, "kubeconfig: kube/config\nclusters:\n- {name: a, context: nosuch}\n")
    with pytest.raises(FleetConfigError, match=r"clusters\[0\]\.context: .*'nosuch'"):
        Fleet.from_config(p, start_caches=False)


def test_from_env_requires_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEETQ_CONFIG", raising=False)
    with pytest.raises(FleetConfigError, match="FLEETQ_CONFIG is not set"):
        Fleet.from_env()


def test_fleet_lookup_names_the_known_clusters(tmp_path: Path) -> None:
    p = write(tmp_path, "kubeconfig: kube/config\nclusters:\n- {name: x, context: a}\n")
    with Fleet.from_config(p, start_caches=False) as fleet:
        assert list(fleet.clusters) == ["x"]
        with pytest.raises(KeyError, match="unknown cluster 'y' \\(fleet has x\\)"):
            fleet.get("y")


def test_cluster_failover_settings_default_to_evict_after_300s(tmp_path: Path) -> None:
    cfg = load_fleet_config(write(tmp_path, "kubeconfig: kube/config\nclusters: [{name: a}]\n"))
    s = cfg.clusterFailover.settings()
    assert (s.no_execute, s.unreachable_toleration_seconds, s.not_ready_toleration_seconds) == (
        True, 300, 300)
    assert cfg.unschedulableGraceSeconds == 60


def test_cluster_failover_settings_are_read_and_checked(tmp_path: Path) -> None:
    cfg = load_fleet_config(write(
        tmp_path,
        "kubeconfig: kube/config\nclusters: [{name: a}]\nunschedulableGraceSeconds: 5\n"
        "clusterFailover: {noExecute: false, defaultUnreachableTolerationSeconds: null}\n"))
    s = cfg.clusterFailover.settings()
    assert (s.no_execute, s.unreachable_toleration_seconds) == (False, None)
    assert cfg.unschedulableGraceSeconds == 5
    with pytest.raises(FleetConfigError,
                       match=r"clusterFailover\.defaultNotReadyTolerationSeconds"):
        load_fleet_config(write(
            tmp_path, "kubeconfig: kube/config\nclusters: [{name: a}]\n"
            "clusterFailover: {defaultNotReadyTolerationSeconds: -1}\n"))
