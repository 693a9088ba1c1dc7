"""fleetq's own quantity parser follows Kubernetes' ``resource.ParseQuantity``
(k8s.io/apimachinery pkg/api/resource/quantity.go ``parseQuantityString`` and suffix.go
``interpret``): ``<signedNumber><suffix>``, ``<number> ::= <digits> | <digits>.<digits> |
<digits>. | .<digits>``, suffixes ``n u m "" k M G T P E``, ``Ki Mi Gi Ti Pi Ei`` or
``e``/``E`` and a signed integer; a binarySI value is capped at 2^63-1.

Checked against ``kubernetes.utils.parse_quantity`` (the Python client's parser, which
fleetq used before) on every well-formed quantity hypothesis draws, and against the
grammar itself on arbitrary text: the Python client is looser than the API server
(``1K``, `` 1``, ``1_000``, ``inf``, ``1e3m``), and those the API server refuses, we refuse.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as kube_parse_quantity

from fleetq import resources as R

DECIMAL = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"]
BINARY = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]

#: quantity.go's grammar as its scanner reads it: the number's digits may all be absent
#: (a lone sign, ``.``, ``+.``, ``e3`` are zero), the exponent is a signed integer
GRAMMAR = re.compile(
    r"[+-]?[0-9]*(\.[0-9]*)?(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+)?")


def exact(q: R.Quantity) -> Fraction:
    value = Fraction(q.mantissa << q.exp2) * Fraction(10) ** q.exp10
    return -value if q.negative else value


def number() -> st.SearchStrategy[str]:
    """``<number>`` with at least one digit, at most 8 (so that the Python client's
    28-digit Decimal context multiplies by 1024**6 exactly)."""
    digits = st.text("0123456789", min_size=1, max_size=4)
    return st.one_of(
        digits,
        st.builds(lambda a, b: f"{a}.{b}", digits, digits),
        st.builds(lambda a: f"{a}.", digits),
        st.builds(lambda b: f".{b}", digits),
    )


def suffix() -> st.SearchStrategy[str]:
    exponent = st.builds(lambda e, s, n: f"{e}{s}{n}", st.sampled_from("eE"),
                         st.sampled_from(["", "+", "-"]), st.integers(0, 30))
    return st.one_of(st.sampled_from(DECIMAL), st.sampled_from(BINARY), exponent)


@given(st.sampled_from(["", "+", "-"]), number(), suffix())
def test_well_formed_quantities_agree_with_the_kubernetes_client(
        sign: str, num: str, suf: str) -> None:
    text = f"{sign}{num}{suf}"
    expected = Fraction(kube_parse_quantity(text))
    if suf in BINARY and expected > R.MAX_BINARY:
        expected = Fraction(R.MAX_BINARY)  # quantity.go: "8Ei" parses as 2^63-1
    assert exact(R.parse_quantity(text)) == expected
    if expected < 0:
        with pytest.raises(R.QuantityError, match="must not be negative"):
            R.parse_milli(text)
    elif expected > R.MAX_QUANTITY_INT:
        with pytest.raises(R.QuantityError, match="is too large"):
            R.parse_milli(text)
    else:  # rounded up to the next milli-unit, as Kubernetes rounds cpu
        assert R.parse_milli(text) == math.ceil(expected * 1000)


@given(st.text("0123456789.+-eEinumkKMGTPi _x", max_size=8))
def test_exactly_the_grammar_parses(text: str) -> None:
    try:
        R.parse_quantity(text)
        parsed = True
    except ValueError:
        parsed = False
    assert parsed == (bool(text) and GRAMMAR.fullmatch(text) is not None), text


@pytest.mark.parametrize("text", ["1K", " 1", "1 ", "1_000", "inf", "Infinity", "NaN",
                                  "1e3m", "1e3Ki", "1ki", "1e", "1e+", "0x10", "1,5"])
def test_what_the_api_server_refuses_is_refused(text: str) -> None:
    """The Python client accepts some of these (``1K`` = 1000, ``1e3m`` = 1); the API
    server, and so fleetq, does not."""
    with pytest.raises(ValueError):
        R.parse_quantity(text)
    with pytest.raises(R.QuantityError, match="is not a quantity"):
        R.parse_milli(text)


@pytest.mark.parametrize(("text", "milli"), [
    ("+", 0), ("-", 0), (".", 0), ("+.", 0), ("e3", 0), ("Ki", 0),  # no digits: zero
    ("1.G", 10**12), (".5", 500), ("5.", 5000), ("007", 7000), ("-0", 0),
    ("1E", 10**21), ("1E3", 10**6), ("5e-1", 500), ("1n", 1), ("1u", 1),
    ("1.5Gi", 3 * (1 << 29) * 1000),
    ("8Ei", ((1 << 63) - 1) * 1000), ("100Ei", ((1 << 63) - 1) * 1000),  # capped
    ("1e-999999999", 1), ("0e999999999", 0),  # no huge integers built
])
def test_upstream_edge_cases(text: str, milli: int) -> None:
    assert R.parse_milli(text) == milli


@pytest.mark.parametrize("text", ["1e999999999", "1E22", "2000E", "1e9223372036854775807"])
def test_absurd_exponents_are_too_large(text: str) -> None:
    with pytest.raises(R.QuantityError, match="is too large"):
        R.parse_milli(text)


def test_an_exponent_beyond_int64_is_refused() -> None:
    """suffix.go parses the exponent with strconv.ParseInt(.., 10, 64)."""
    with pytest.raises(R.QuantityError, match="is not a quantity"):
        R.parse_milli("1e9223372036854775808")


@pytest.mark.parametrize(("value", "milli"), [
    (0.1, 100), (0.3, 300), (1e-05, 1), (2.5, 2500), (Decimal("1.5"), 1500),
    (Decimal("1E+3"), 10**6), (7, 7000),
])
def test_a_number_is_read_as_its_literal(value: object, milli: int) -> None:
    """A YAML/JSON number reaches the API server as its text, ``0.1`` as 100m (not the
    binary float 0.1000000000000000055..., which would round up to 101m)."""
    assert R.parse_milli(value) == milli


@given(st.floats(min_value=0, max_value=1e20, allow_nan=False))
def test_floats_parse_as_their_repr(value: float) -> None:
    assert R.parse_milli(value) == math.ceil(Fraction(repr(value)) * 1000)
