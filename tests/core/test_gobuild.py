"""The Go build steps both builds share (fleetq.gobuild), with a stand-in ``go``: the
toolchain lookup, the logged run and its one-line error, the module-cache lookup."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from fleetq import gobuild


def fake_go(tmp_path: Path, script: str) -> str:
    go = tmp_path / "go"
    go.write_text("#!/bin/sh\n" + script)
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    return str(go)


def test_the_toolchain_comes_from_fleetq_go_first(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    go = fake_go(tmp_path, "exit 0\n")
    monkeypatch.setenv(gobuild.GO_ENV, go)
    assert gobuild.go_binary("1.26") == go


def test_a_run_logs_its_command_and_answers_its_stdout(tmp_path: Path) -> None:
    go = fake_go(tmp_path, 'echo "$GOFLAGS"; echo oops >&2\n')
    log = tmp_path / "build.log"
    out = gobuild.run([go, "env"], tmp_path, log)
    assert out.strip().endswith("-buildvcs=false")
    text = log.read_text()
    assert text.startswith(f"$ {go} env\n") and "oops" in text


def test_a_failed_run_is_one_line_with_the_log_tail(tmp_path: Path) -> None:
    go = fake_go(tmp_path, "echo 'cannot find package' >&2; exit 1\n")
    log = tmp_path / "build.log"
    with pytest.raises(gobuild.BuildError) as err:
        gobuild.go_build(go, str(tmp_path / "bin") + "/", ["./cmd/x"], tmp_path, log)
    message = str(err.value)
    assert message.startswith(f"go build failed in {tmp_path.name}: ")
    assert "cannot find package" in message and str(log) in message
    assert "\n" not in message


def test_a_module_is_found_in_the_module_cache(tmp_path: Path) -> None:
    found = {"Dir": str(tmp_path / "mod")}
    go = fake_go(tmp_path, f"echo '{json.dumps(found)}'\n")
    assert gobuild.module_dir(go, "example.com/m", "v1.0.0", tmp_path,
                              tmp_path / "log") == tmp_path / "mod"
    go = fake_go(tmp_path, "echo '{\"Error\": \"not found\"}'\n")
    with pytest.raises(gobuild.BuildError, match="example.com/m@v1.0.0: not found"):
        gobuild.module_dir(go, "example.com/m", "v1.0.0", tmp_path, tmp_path / "log")
