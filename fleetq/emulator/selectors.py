"""Kubernetes label and field selector strings, parsed once and matched against objects.

The API server accepts ``labelSelector=a=b,c!=d,e in (x,y),f notin (z),g,!h`` and
``fieldSelector=spec.nodeName=n1,status.phase!=Running``; list, watch and
deletecollection all filter with them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]


class SelectorError(ValueError):
    """A selector string the API server would reject (HTTP 400)."""


_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/\-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9._/\-]+)\s*(==|=|!=)\s*([A-Za-z0-9._\-]*)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    terms: list[str] = []
    depth = 0
    cur = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise SelectorError(f"unbalanced parentheses in selector {text!r}")
    terms.append(cur)
    return [t for t in terms if t.strip()]


LabelTest = Callable[[Mapping[str, str]], bool]


def _label_term(term: str) -> tuple[LabelTest, tuple[str, str] | None]:
    """The test of one term, and its ``(key, value)`` when it is an equality."""
    m = _EQ_RE.match(term)
    if m:
        key, op, value = m.groups()
        if op == "!=":
            return (lambda labels: labels.get(key) != value), None
        return (lambda labels: labels.get(key) == value), (key, value)
    m = _SET_RE.match(term)
    if m:
        neg, key, op, values = m.groups()
        if op:
            if neg:
                raise SelectorError(f"invalid selector term {term.strip()!r}")
            vals = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                return (lambda labels: key in labels and labels[key] in vals), None
            return (lambda labels: key not in labels or labels[key] not in vals), None
        if neg:
            return (lambda labels: key not in labels), None
        return (lambda labels: key in labels), None
    raise SelectorError(f"invalid label selector term {term.strip()!r}")


def _label_selector(text: str | None) -> tuple[LabelTest | None, list[tuple[str, str]]]:
    if not text or not text.strip():
        return None, []
    parsed = [_label_term(t) for t in _split_terms(text)]
    tests = [test for test, _ in parsed]
    return (lambda labels: all(t(labels) for t in tests)), [eq for _, eq in parsed if eq]


def parse_label_selector(text: str | None) -> LabelTest | None:
    """A predicate over a labels mapping, or None for "everything"."""
    return _label_selector(text)[0]


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(text: str | None) -> Matcher | None:
    if not text or not text.strip():
        return None
    tests: list[Matcher] = []
    for term in _split_terms(text):
        m = _EQ_RE.match(term)
        if not m:
            raise SelectorError(f"invalid field selector term {term.strip()!r}")
        path, op, value = m.groups()

        def test(obj: Mapping[str, Any], p: str = path, o: str = op, v: str = value) -> bool:
            got = _field_value(obj, p)
            return got != v if o == "!=" else got == v

        tests.append(test)
    return lambda obj: all(t(obj) for t in tests)


@dataclass(frozen=True)
class Selection:
    """A request's label and field selectors, parsed once."""

    #: one predicate over whole objects (None = match all)
    matcher: Matcher | None
    #: the label selector's ``key=value`` terms, which a label index can answer
    equality: list[tuple[str, str]] = field(default_factory=list)


def parse_selectors(label_selector: str | None, field_selector: str | None) -> Selection:
    labels, equality = _label_selector(label_selector)
    fields = parse_field_selector(field_selector)
    if labels is None and fields is None:
        return Selection(None)

    def match(obj: Mapping[str, Any]) -> bool:
        if labels is not None and not labels((obj.get("metadata") or {}).get("labels") or {}):
            return False
        return fields is None or fields(obj)

    return Selection(match, equality)


def selector_matcher(label_selector: str | None, field_selector: str | None) -> Matcher | None:
    """One predicate over whole objects combining both selectors (None = match all)."""
    return parse_selectors(label_selector, field_selector).matcher


def match_label_selector(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A structured ``{matchLabels, matchExpressions}`` selector (as in Reservation owners)."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for req in selector.get("matchExpressions") or []:
        key = req.get("key")
        op = req.get("operator")
        values = req.get("values") or []
        present = key in labels
        if op == "In" and (not present or labels[key] not in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True
