"""``fleetq up`` and ``fleetq demo`` as real processes: readiness, discovery by other
commands, refusing a second instance, Ctrl-C stopping every child, and the demo's exit
code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleetq.runtime.embedded import pid_alive
from fleetq.runtime.supervisor import free_port

FLEETQ = [sys.executable, "-c", "from fleetq.cli import main; main()"]


def _env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "FLEETQ_"))}
    env["FLEETQ_STATE_DIR"] = str(state_dir)
    return env


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if path.exists():
            try:
                return json.loads(path.read_text())
            except ValueError:
                pass
        time.sleep(0.1)
    raise AssertionError(f"{path} did not appear within {timeout}s")


def test_up_serves_refuses_a_second_instance_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port, ui_port = free_port(), free_port()
    env = _env(state)
    proc = subprocess.Popen(
        [*FLEETQ, "up", "--state-dir", str(state), "--port", str(port), "--ui-port", str(ui_port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        info = _wait_for(state / "fleetq.json", proc, 60)
        assert info["pid"] == proc.pid
        assert info["address"] == f"127.0.0.1:{port}"
        assert info["ui_url"] == f"http://127.0.0.1:{ui_port}"
        children = info["children"]
        assert set(children) == {"temporal", "emulator", "worker"}
        assert all(pid_alive(pid) for pid in children.values())
        assert Path(info["fleet_config"]).is_file() and Path(info["kubeconfig"]).is_file()

        # other commands find the fleet through the state dir
        got = subprocess.run([*FLEETQ, "get", "pytorchjob"], capture_output=True, text=True,
                             env=env, timeout=60)
        assert (got.returncode, got.stderr.strip()) == (
            0, "No resources found in default namespace.")

        second = subprocess.run(
            [*FLEETQ, "up", "--state-dir", str(state), "--port", str(free_port()),
             "--ui-port", str(free_port())], capture_output=True, text=True, env=env, timeout=60)
        assert second.returncode == 1
        assert second.stderr.startswith(f"error: fleetq is already running (pid {proc.pid})")

        other = subprocess.run(
            [*FLEETQ, "up", "--state-dir", str(tmp_path / "other"), "--port", str(port)],
            capture_output=True, text=True, env=env, timeout=60)
        assert other.returncode == 1
        assert f"port 127.0.0.1:{port} is already in use" in other.stderr

        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=40)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        assert f"Web UI          http://127.0.0.1:{ui_port}" in out
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in children.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in children.values())
        assert not (state / "fleetq.json").exists()
        assert (state / "temporal.db").exists()  # history survives a restart
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_runs_the_walkthrough(tmp_path: Path) -> None:
    proc = subprocess.run([*FLEETQ, "demo"], capture_output=True, text=True,
                          env=_env(tmp_path / "unused"), timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "pytorchjob.kubeflow.org/pytorch-test created" in out
    assert "ScheduleBindingSucceed" in out
    pods = [line.split() for line in out.splitlines() if line.startswith("pytorch-test-")]
    assert len(pods) == 3
    assert len({p[1] for p in pods}) == 1 and all(p[3] == "Running" for p in pods)
    assert "OK: all 3 pods of default/pytorch-test are Running on" in out
    # its views read its own members, not a fallback to the workflow's view
    assert "no fleet config" not in proc.stderr, proc.stderr
