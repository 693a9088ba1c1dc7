"""Resource arithmetic: Kubernetes quantities parse exactly into milli-units and print
back the way users write them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetq import resources as R


@pytest.mark.parametrize(
    ("value", "milli"),
    [
        ("10m", 10),
        ("1", 1000),
        (3, 3000),
        ("1.5", 1500),
        (0.25, 250),
        ("2Gi", 2 * (1 << 30) * 1000),
        ("1k", 1_000_000),
        ("999900", 999_900_000),
        ("10000Gi", 10_000 * (1 << 30) * 1000),
        ("1e3", 1_000_000),
        ("0.0001", 1),  # rounds up to the next milli-unit, like Kubernetes
        ("0", 0),
    ],
)
def test_parse_milli(value: Any, milli: int) -> None:
    assert R.parse_milli(value) == milli


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "'-1' must not be negative"),
        ("abc", "'abc' is not a quantity"),
        ("1.5.5", "'1.5.5' is not a quantity"),
        ("", "'' is not a quantity"),
        (True, "True is not a quantity"),
        (None, "None is not a quantity"),
        ({"a": 1}, "{'a': 1} is not a quantity"),
        (float("nan"), "'nan' is not a finite quantity"),
        (float("inf"), "'inf' is not a finite quantity"),
        ("1e400", "'1e400' is too large"),
        (10**30, f"'{10**30}' is too large"),
    ],
)
def test_parse_milli_rejects(value: Any, message: str) -> None:
    with pytest.raises(R.QuantityError) as info:
        R.parse_milli(value)
    assert str(info.value) == message


def test_parse_resources_names_the_key() -> None:
    assert R.parse_resources({"cpu": "500m", "nvidia.com/gpu": 2}) == {
        "cpu": 500,
        "nvidia.com/gpu": 2000,
    }
    assert R.parse_resources(None) == {}
    with pytest.raises(R.QuantityError, match=r"^memory: 'lots' is not a quantity$"):
        R.parse_resources({"memory": "lots"})


def test_arithmetic() -> None:
    a = {"cpu": 1000, "memory": 10}
    b = {"cpu": 500, "nvidia.com/gpu": 1000}
    assert R.add(a, b) == {"cpu": 1500, "memory": 10, "nvidia.com/gpu": 1000}
    assert R.sub(a, b) == {"cpu": 500, "memory": 10, "nvidia.com/gpu": -1000}
    acc = dict(a)
    R.add_into(acc, {"cpu": 1000, "memory": 10}, sign=-1)
    assert acc == {}  # keys that fall to zero are dropped
    assert R.scale(b, 3) == {"cpu": 1500, "nvidia.com/gpu": 3000}
    assert R.maximum([a, b]) == {"cpu": 1000, "memory": 10, "nvidia.com/gpu": 1000}


def test_fits_and_shortfalls() -> None:
    free = {"cpu": 2000, "memory": 100}
    assert R.fits({"cpu": 2000}, free)
    assert R.fits({"cpu": 0, "nvidia.com/gpu": 0}, free)
    assert not R.fits({"cpu": 2001}, free)
    assert R.shortfalls({"cpu": 3000, "memory": 50, "nvidia.com/gpu": 1000}, free) == [
        "cpu",
        "nvidia.com/gpu",
    ]


@pytest.mark.parametrize(
    ("name", "milli", "text"),
    [
        ("cpu", 10, "10m"),
        ("cpu", 4010, "4.01"),
        ("cpu", 3000, "3"),
        ("memory", 4 * (1 << 30) * 1000, "4Gi"),
        ("memory", 1500 * (1 << 20) * 1000, "1500Mi"),
        ("memory", 1000 * 1000, "1000"),
        ("kube-queue/max-jobs", 1000, "1"),
        ("ephemeral-storage", (1 << 40) * 1000, "1Ti"),
    ],
)
def test_format_quantity(name: str, milli: int, text: str) -> None:
    assert R.format_quantity(name, milli) == text


def test_format_resources_is_ordered_and_skips_zero() -> None:
    r = {"example.com/fpga": 1000, "memory": 4 * (1 << 30) * 1000, "cpu": 4010, "nvidia.com/gpu": 0}
    assert R.format_resources(r) == "cpu 4.01, memory 4Gi, example.com/fpga 1"


@given(
    st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"]),
    st.integers(min_value=0, max_value=10**21),
)
def test_quantity_round_trip(name: str, milli: int) -> None:
    assert R.parse_milli(R.to_quantity_map({name: milli})[name]) == milli
