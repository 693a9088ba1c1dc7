"""statePreservation: at a failover, values read from the old copy's status become labels
of the new copy, as Karmada release-1.18 does (pkg/util/helper/failover.go
``BuildPreservedLabelState``/``parseJSONValue``; pkg/controllers/binding/common.go
``injectReservedLabelState``: only when the purge mode is Directly/Immediately).

The rules are kubectl JSONPath templates (k8s.io/client-go/util/jsonpath, missing keys an
error), e.g. ``{.replicaStatuses.Worker.succeeded}``; each ``{...}`` is evaluated with
jsonpath-ng and printed as that package prints: a scalar as Go's ``fmt.Fprint`` (``2``,
``true``), a map or list as compact JSON, several results separated by one space. Where
Karmada would refuse the eviction (status not synced, a rule failing), fleetq fails over
without the labels and says why (a :class:`PreservationError`). Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
from jsonpath_ng.ext.parser import ExtendedJsonPathParser

from fleetq.models import PropagationPolicy, PurgeMode, StatePreservation, StatePreservationRule

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ACTION = re.compile(r"\{([^{}]*)\}")
#: one parser (jsonpath-ng loads its pre-generated PLY tables once, here)
_PARSER = ExtendedJsonPathParser()


@dataclass(frozen=True)
class PreservationError(Exception):
    """Why no labels are carried: the rule (``aliasLabelName``) and a one-line message."""

    label: str
    message: str

    def __str__(self) -> str:
        return f"statePreservation rule {self.label}: {self.message}"


def _go_text(value: Any) -> str:
    """One result as client-go's jsonpath ``PrintResults`` writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<nil>"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))  # Go's %v of a float64 from JSON: 2, not 2.0
    return str(value)


def _expression(action: str) -> str:
    expr = action.strip()
    if expr in ("@", "$"):
        return "$"
    if expr.startswith("$"):
        return expr
    if expr.startswith((".", "[")):
        return "$" + expr
    raise ValueError(f"unsupported action {{{expr}}} (write {{.field}})")


def json_value(status: Mapping[str, Any], template: str) -> str:
    """``parseJSONValue``: the template evaluated on ``status``; ValueError when it does
    not parse or a key is missing (``AllowMissingKeys(false)``)."""
    out: list[str] = []
    pos = 0
    for m in _ACTION.finditer(template):
        out.append(template[pos:m.start()])
        pos = m.end()
        try:
            expr = _expression(m.group(1))
        except ValueError as exc:
            raise ValueError(f"jsonPath {template!r} does not parse: {exc}") from None
        try:
            found = [hit.value for hit in _PARSER.parse(expr).find(status)]
        except (JsonPathLexerError, JsonPathParserError) as exc:
            raise ValueError(f"jsonPath {template!r} does not parse: {exc}") from None
        if not found and "?(" not in expr:  # a filter matching nothing prints nothing
            raise ValueError(f"jsonPath {template!r}: {m.group(1).strip()} is not found")
        out.append(" ".join(_go_text(v) for v in found))
    rest = template[pos:]
    if "{" in rest or "}" in rest:
        raise ValueError(f"jsonPath {template!r} does not parse: unclosed action")
    out.append(rest)
    return "".join(out)


def preserved_labels(
    rules: Sequence[StatePreservationRule], status: Mapping[str, Any] | None
) -> dict[str, str]:
    """``BuildPreservedLabelState``: aliasLabelName -> value, every rule or none
    (:class:`PreservationError` naming the first rule that fails)."""
    if not rules:
        return {}
    if not status:
        raise PreservationError(rules[0].aliasLabelName,
                                "the old copy's status has not been synced yet")
    labels: dict[str, str] = {}
    for rule in rules:
        try:
            value = json_value(status, rule.jsonPath)
        except ValueError as exc:
            raise PreservationError(rule.aliasLabelName, str(exc)) from None
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            raise PreservationError(rule.aliasLabelName,
                                    f"value {value[:70]!r} is not a valid label value")
        labels[rule.aliasLabelName] = value
    return labels


def failover_labels(
    preservation: StatePreservation | None, directly: bool, status: Mapping[str, Any] | None
) -> dict[str, str]:
    """The labels the new copy carries after one failover: none without rules, or unless
    the old copy is purged Directly (``injectReservedLabelState``'s third restriction)."""
    if preservation is None or not directly:
        return {}
    return preserved_labels(preservation.rules, status)


def labels_at_failover(
    policy: PropagationPolicy,
    purge: PurgeMode,
    status: Mapping[str, Any] | None,
    *,
    cluster_failure: bool,
) -> dict[str, str]:
    """The new copy's labels for one failover of a job under ``policy``: the rules of
    ``failover.cluster`` when its cluster failed (a NoExecute taint evicted it, Karmada's
    taint manager), else of ``failover.application``; ``purge``: how fleetq purges the old
    copy (Karmada injects only after a Directly purge)."""
    fo = policy.spec.failover
    if fo is None:
        return {}
    part = fo.cluster if cluster_failure else fo.application
    rules = part.statePreservation if part is not None else None
    return failover_labels(rules, purge == PurgeMode.DIRECTLY, status)
