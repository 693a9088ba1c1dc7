"""Kubernetes' value formats, one parser each (``fleetq.kube_values``): Go durations as
``time.ParseDuration`` reads them, RFC 3339 timestamps as the API server writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetq.kube_values import (
    format_go_duration,
    go_duration_or_none,
    human_duration,
    parse_go_duration,
    parse_rfc3339,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("10m", 600.0), ("1h30m", 5400.0), ("1.5h", 5400.0), (".5s", 0.5),
     ("300ms", 0.3), ("2h45m30s", 9930.0), ("24h", 86400.0), ("1us", 1e-6),
     ("1µs", 1e-6), ("-1m", -60.0), ("+2s", 2.0), ("1.h", 3600.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "h", "1d", "1h 30m", "m10", "1hh", "-", "0s0"])
def test_not_go_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_go_duration(text)
    assert go_duration_or_none(text) is None


def test_a_missing_field_is_none() -> None:
    assert go_duration_or_none(None) is None and go_duration_or_none(600) is None


@given(st.integers(min_value=1, max_value=10 * 365 * 86400))
def test_format_and_parse_round_trip(seconds: int) -> None:
    assert parse_go_duration(format_go_duration(seconds)) == seconds


def test_rfc3339() -> None:
    assert parse_rfc3339("2026-11-30T14:26:20Z") == datetime(2026, 11, 30, 14, 26, 20,
                                                             tzinfo=UTC)
    offset = parse_rfc3339("2026-11-30T16:26:20+02:00")
    assert offset is not None and offset.utcoffset() == timedelta(hours=2)
    assert offset == datetime(2026, 11, 30, 14, 26, 20, tzinfo=UTC)
    naive = parse_rfc3339(datetime(2026, 1, 1))
    assert naive is not None and naive.tzinfo is UTC
    aware = datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-5)))
    assert parse_rfc3339(aware) is aware
    for bad in ("", "yesterday", None, 17):
        assert parse_rfc3339(bad) is None


def test_ages_like_kubectl() -> None:
    cases = {0: "0s", 59: "59s", 119: "119s", 120: "2m", 224: "3m44s", 383: "6m23s",
             600: "10m", 3 * 3600: "3h", 5 * 3600 + 120: "5h2m", 30 * 3600: "30h",
             3 * 86400 + 3600: "3d1h", 15 * 86400: "15d", 800 * 86400: "2y70d"}
    assert {s: human_duration(s) for s in cases} == cases

