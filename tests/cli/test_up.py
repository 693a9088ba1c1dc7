"""``fleetq up`` and ``fleetq demo`` as real processes: readiness, discovery by other
commands, refusing a second instance, Ctrl-C stopping every child, and the demo's exit
code."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetq.runtime.fleet_info import pid_alive
from fleetq.runtime.supervisor import Child, RestartBudget, free_port, spawn_child

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
    # no link into a Web UI that is gone by the time the demo has exited (--keep has one)
    assert "Web UI of the job" not in out
    assert "fleetq demo --keep keeps it running" in proc.stderr
    # its views read its own members, not a fallback to the workflow's view
    assert "no fleet config" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- the hint


def test_the_hint_applies_the_queued_walkthrough_and_names_the_state_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fleetq apply -f examples/`` would apply the non-queued policy (two files define
    default/example-policy; the later one wins, tests/core/test_manifests.py): the hint
    names the walkthrough's files, and exports FLEETQ_STATE_DIR when the next command
    would otherwise look elsewhere."""
    from fleetq.cli.up import next_steps, walkthrough_dir
    from fleetq.manifests import load_manifests
    from fleetq.models import PropagationPolicy

    monkeypatch.setenv("FLEETQ_STATE_DIR", str(tmp_path / "default"))
    monkeypatch.chdir(tmp_path)
    examples = walkthrough_dir()
    assert next_steps(tmp_path / "default", examples)[0].startswith("fleetq apply -f ")
    steps = next_steps(tmp_path / "my state", examples)
    assert steps[0] == f"export FLEETQ_STATE_DIR='{tmp_path / 'my state'}'"
    assert steps[-1] == "fleetq get pytorchjob -M"
    files = shlex.split(steps[1])[3::2]
    assert [Path(f).name for f in files] == [
        "elasticquotatree.yaml", "propagationpolicy-gang-queue.yaml", "pytorch-test.yaml"]
    result = load_manifests(files)
    assert result.errors == [] and result.notes == []
    (policy,) = result.of_kind(PropagationPolicy)
    assert policy.queued


# --------------------------------------------------------------------------- supervision


class DyingWorkers:
    """A fleet whose worker exits with code 3 each time it is (re)started: real child
    processes through the supervisor, so a test sees what ``fleetq up`` would print."""

    def __init__(self, logs: Path, first: str = "worker") -> None:
        self.logs = logs
        self.starts = 0
        self.child = self._spawn(first)

    def _spawn(self, name: str) -> Child:
        self.starts += 1
        child = spawn_child(name, [sys.executable, "-c",
                                   f"print('boom {self.starts}'); raise SystemExit(3)"],
                            self.logs)
        child.proc.wait(30)
        return child

    def check(self) -> Child | None:
        return None if self.child.alive() else self.child

    def restart(self, child: Child, timeout: float = 60.0) -> Child:
        self.child = self._spawn(child.name)
        return self.child


def test_a_dying_worker_is_restarted_until_the_budget_is_spent(tmp_path: Path) -> None:
    from fleetq.cli.up import supervise

    fleet = DyingWorkers(tmp_path)
    said: list[str] = []
    code = supervise(fleet, threading.Event(), RestartBudget(limit=2, window=600.0),
                     said.append, poll=0.01)
    assert code == 1
    assert fleet.starts == 3  # the first start and 2 restarts
    assert said[0].startswith("worker (pid ") and "exited with code 3: boom 1" in said[0]
    assert said[0].endswith("restarting it (1 of at most 2 restarts in 10 minutes)")
    assert said[-1].startswith("error: worker (pid ") and "boom 3" in said[-1]
    assert "it exited 3 times within 10 minutes, so fleetq up stops" in said[-1]


def test_temporal_or_the_members_dying_stops_the_fleet_at_once(tmp_path: Path) -> None:
    from fleetq.cli.up import supervise

    fleet = DyingWorkers(tmp_path, first="temporal")
    said: list[str] = []
    assert supervise(fleet, threading.Event(), RestartBudget(), said.append, poll=0.01) == 1
    assert fleet.starts == 1
    assert len(said) == 1 and said[0].startswith("error: temporal (pid ")
    assert said[0].endswith("; stopping")


def _read_until(path: Path, proc: subprocess.Popen[str], text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        assert proc.poll() is None, content
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path} within {timeout}s")


def test_up_hint_works_as_printed_and_a_killed_worker_comes_back(tmp_path: Path) -> None:
    """Run with --state-dir and no FLEETQ_STATE_DIR: the printed commands, run as
    printed, find the fleet and apply the queued walkthrough. Then SIGKILL the worker:
    fleetq up says so, starts a new one (fleetq.json names it) and keeps serving."""
    state = tmp_path / "state"
    env = {k: v for k, v in _env(state).items() if k != "FLEETQ_STATE_DIR"}
    env["HOME"] = str(tmp_path / "home")  # the default state dir is elsewhere
    out_file, err_file = tmp_path / "up.out", tmp_path / "up.err"
    with open(out_file, "w") as out, open(err_file, "w") as err:
        proc = subprocess.Popen(
            [*FLEETQ, "up", "--state-dir", str(state), "--port", str(free_port()),
             "--ui-port", str(free_port())], stdout=out, stderr=err, text=True, env=env,
            cwd=tmp_path)
    try:
        printed = _read_until(out_file, proc, "fleetq get pytorchjob -M", 90)
        steps = [line.strip() for line in printed.splitlines()[-3:]]
        assert steps[0] == f"export FLEETQ_STATE_DIR={state}"
        next_env = dict(env, FLEETQ_STATE_DIR=steps[0].split("=", 1)[1])
        applied = subprocess.run([*FLEETQ, *shlex.split(steps[1])[1:]], capture_output=True,
                                 text=True, env=next_env, timeout=60)
        assert applied.returncode == 0, applied.stderr
        assert "propagationpolicy.policy.one.alibabacloud.com/example-policy created" in \
            applied.stdout + applied.stderr
        policy = subprocess.run([*FLEETQ, "get", "propagationpolicy"], capture_output=True,
                                text=True, env=next_env, timeout=60)
        assert policy.stdout.split()[4:7] == ["example-policy", "Gang", "true"], policy.stdout

        before = json.loads((state / "fleetq.json").read_text())["children"]["worker"]
        os.kill(before, signal.SIGKILL)
        _read_until(err_file, proc, "worker restarted (pid ", 120)
        after = json.loads((state / "fleetq.json").read_text())["children"]["worker"]
        assert after != before and pid_alive(after)
        log = (state / "logs" / "worker.log").read_text()
        assert f"--- fleetq up: the worker (pid {before}) exited with code -9" in log
        got = subprocess.run([*FLEETQ, "get", "pytorchjob"], capture_output=True, text=True,
                             env=next_env, timeout=60)
        assert got.returncode == 0 and got.stdout.split()[3] == "pytorch-test", got

        proc.send_signal(signal.SIGINT)
        assert proc.wait(40) == 0
        errors = err_file.read_text()
        assert f"worker (pid {before}) exited with code -9" in errors
        assert "restarting it (1 of at most 5 restarts in 10 minutes)" in errors
        assert "Traceback" not in errors
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
