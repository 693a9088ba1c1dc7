"""``fleetq get cluster``: the member clusters as fleetq sees them, in Karmada's terms.

Each member of the fleet config is asked once, directly (short timeouts, no retries):
its Ready condition (``True``; ``False`` when its API answers with errors; ``Unknown``
when it does not answer) and the taints that condition puts on it
(``cluster.karmada.io/unreachable`` / ``not-ready``: ``NoSchedule``, and ``NoExecute``
where the fleet's ``clusterFailover.noExecute`` says so), beside the taints the fleet
config gives it. New jobs avoid a member with a ``NoSchedule`` taint they do not
tolerate; jobs on it are evicted once a ``NoExecute`` taint outlasts their toleration.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleetq.capacity import Taint
from fleetq.cli.context import CliError, fleet_config_path
from fleetq.cli.output import as_list, print_object, print_table
from fleetq.client.members import probe_member
from fleetq.cluster_health import ClusterCondition, cluster_taints, taint_text
from fleetq.fleet_config import ClusterConfig, FleetConfig, FleetConfigError, load_fleet_config


def _probe(cluster: ClusterConfig, config: FleetConfig) -> dict[str, Any]:
    probe = probe_member(cluster, config)
    row: dict[str, Any] = {"name": cluster.name, "version": probe.version,
                           "ready": probe.ready, "reason": probe.reason}
    condition = ClusterCondition(row["ready"], time.time(), row["reason"])
    static = tuple(Taint(t.key, t.value, t.effect) for t in cluster.taints)
    taints = static + cluster_taints(condition, config.clusterFailover.settings())
    row["taints"] = [taint_text(t) for t in taints]
    row["labels"] = dict(cluster.labels)
    row["reservation"] = cluster.reservation
    return row


def show_clusters(name: str | None, output: str | None) -> None:
    try:
        config = load_fleet_config(fleet_config_path())
    except FleetConfigError as exc:
        raise CliError(f"error: {exc}") from None
    clusters = [c for c in config.clusters if name is None or c.name == name]
    if name is not None and not clusters:
        raise CliError(f'Error from server (NotFound): clusters.cluster.karmada.io "{name}" '
                       "not found")
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(clusters)))) as pool:
        rows = list(pool.map(lambda c: _probe(c, config), clusters))
    if output in ("yaml", "json"):
        objs = [{"apiVersion": "cluster.karmada.io/v1alpha1", "kind": "Cluster",
                 "metadata": {"name": r["name"], "labels": r["labels"]},
                 "spec": {"taints": [_taint_obj(t) for t in r["taints"]]},
                 "status": {"kubernetesVersion": r["version"], "conditions": [
                     {"type": "Ready", "status": r["ready"], "message": r["reason"]}]}}
                for r in rows]
        print_object(objs[0] if name is not None else as_list(objs), output)
        return
    headers = ["NAME", "VERSION", "READY", "TAINTS"]
    if output == "wide":
        headers += ["RESERVATION", "LABELS", "REASON"]
    table = []
    for r in rows:
        line: list[Any] = [r["name"], r["version"] or "<unknown>", r["ready"],
                           ",".join(r["taints"]) or "<none>"]
        if output == "wide":
            labels = ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items()))
            line += [str(r["reservation"]).lower(), labels or "<none>", r["reason"] or "-"]
        table.append(line)
    print_table(headers, table)


def _taint_obj(text: str) -> dict[str, str]:
    key_value, _, effect = text.rpartition(":")
    key, _, value = key_value.partition("=")
    out = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    return out
