"""``<state-dir>/fleetq.json``: how a running ``fleetq up`` tells every other command where
its fleet is (its pid, the Temporal address, the Web UI and its HTTP API, the members'
kubeconfig and the fleet config). Standard library only, so a CLI command that merely
looks the fleet up does not import the embedded runtime (:mod:`fleetq.runtime.embedded`
writes the file).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_DIR_ENV = "FLEETQ_STATE_DIR"
INFO_FILE = "fleetq.json"
LOCK_FILE = "fleetq.lock"


def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or "~/.fleetq").expanduser()


@dataclass
class FleetInfo:
    """What ``fleetq up`` publishes in ``<state-dir>/fleetq.json``."""

    pid: int
    address: str
    ui_url: str = ""
    kubeconfig: str = ""
    fleet_config: str = ""
    state_dir: str = ""
    #: the Web UI server whose HTTP API (``/api/v1``) read-only commands may use instead
    #: of the Temporal SDK (:mod:`fleetq.client.http_api`); empty: none
    http_api: str = ""
    children: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_info(state_dir: Path | None = None) -> FleetInfo | None:
    """The running embedded fleet's info, or None (missing file or dead pid)."""
    path = (state_dir or default_state_dir()) / INFO_FILE
    try:
        data = json.loads(path.read_text())
        info = FleetInfo(**{k: v for k, v in data.items() if k in FleetInfo.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None
    return info if pid_alive(info.pid) else None


def write_info(info: FleetInfo, state_dir: Path) -> Path:
    path = state_dir / INFO_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(info.to_json())
    os.replace(tmp, path)
    return path
