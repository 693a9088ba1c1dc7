"""The generated cluster configuration: each process gets its own ports where two
processes of one service would clash, and every file loads as YAML Temporal reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleetq.temporal_cluster.config import Layout, Ports, service_of, write_configs


def test_two_history_processes_each_get_their_own_ports(tmp_path: Path) -> None:
    layout = Layout(histories=2, shards=4)
    ports = Ports.pick(layout.histories)
    files = write_configs(tmp_path, ports, layout)
    assert list(files) == ["temporal-history-0", "temporal-history-1", "temporal-matching",
                           "temporal-frontend", "temporal-worker"]
    docs = {name: yaml.safe_load(path.read_text()) for name, path in files.items()}
    history = [docs[f"temporal-history-{i}"]["services"]["history"]["rpc"] for i in (0, 1)]
    assert history[0]["grpcPort"] != history[1]["grpcPort"]
    assert history[0]["membershipPort"] != history[1]["membershipPort"]
    for doc in docs.values():
        assert doc["persistence"]["numHistoryShards"] == 4
        for store in doc["persistence"]["datastores"].values():
            assert store["sql"]["pluginName"] == "postgres12"
            assert store["sql"]["connectAddr"] == f"127.0.0.1:{ports.postgres}"
        assert doc["services"]["frontend"]["rpc"]["grpcPort"] == ports.frontend
        assert Path(doc["dynamicConfigClient"]["filepath"]).is_file()
    every = [ports.postgres, ports.frontend, ports.frontend_http, ports.frontend_membership,
             ports.matching, ports.matching_membership, ports.worker, ports.worker_membership,
             *ports.history, *ports.history_membership]
    assert len(set(every)) == len(every)


def test_processes_name_their_service() -> None:
    assert [service_of(p) for p in Layout(histories=3).processes] == [
        "history", "history", "history", "matching", "frontend", "worker"]


def test_postgres_has_room_for_every_pool() -> None:
    assert Layout(histories=2).postgres_connections >= 5 * 24
    with pytest.raises(ValueError):
        Layout(histories=0)


async def test_history_kill_is_refused_on_the_dev_server() -> None:
    from fleetq.testing.chaos import run_matrix

    with pytest.raises(ValueError, match="history-kill needs temporal='cluster'"):
        await run_matrix((), ("history-kill",))


def test_the_crash_matrix_command_offers_history_kill_only_on_the_cluster(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.chaos import main

    assert main(["--points", "", "--restarts", "history-kill"]) == 2
    assert "unknown kill point(s) history-kill" in capsys.readouterr().err
