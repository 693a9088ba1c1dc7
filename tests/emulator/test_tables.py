"""The emulator's server-side printing (Table responses kubectl asks for) follows
kube-apiserver's columns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetq.emulator.tables import table


def test_the_emulators_age_column_is_kube_apiservers() -> None:
    """Server-side printing's AGE is translateTimestampSince → HumanDuration, so a pod
    created 224 s ago reads 3m44s on the emulator as on a real member (it read 3m)."""
    created = datetime.now(UTC) - timedelta(seconds=224.5)
    pod = {"metadata": {"name": "p", "namespace": "default",
                        "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
           "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}}
    rows = table("pods", [pod], "1")["rows"]
    headers = [c["name"] for c in table("pods", [pod], "1")["columnDefinitions"]]
    assert rows[0]["cells"][headers.index("Age")] in ("3m44s", "3m45s")
