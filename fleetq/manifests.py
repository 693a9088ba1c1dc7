"""Reading the manifests users keep in files into validated models, safely.

Users hand us YAML or JSON from files, directories and stdin, like ``kubectl apply -f``;
this turns it into :mod:`fleetq.models` objects or one clear line per problem, never an
exception. It refuses input that would hurt the scheduler later: duplicate mapping keys
(silently "last wins" in plain YAML), alias bombs, absurd nesting, objects too large for
a Temporal payload. Lines read ``<Kind> <ns>/<name>: <field> <message>``, or
``<file>: <message>`` before a document is an object. Upstream fields fleetq accepts
without acting on them give one warning each (``LoadResult.warnings``). Duplicates across
files, directories, and why preemption annotations are checked here and not in the
models: docs/decisions/010.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import yaml
from yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    ScalarEvent,
)
from yaml.nodes import MappingNode, ScalarNode

from fleetq.models import (
    ElasticQuotaTree,
    FleetObject,
    ManifestError,
    ManifestErrors,
    PriorityClass,
    PyTorchJob,
    object_ref,
    parse_object,
    upstream_warnings,
)
from fleetq.preemption import job_policy, tree_policy

MIB = 1024 * 1024
#: Largest file (or stdin) we read at all.
MAX_FILE_BYTES = 8 * MIB
#: Largest object, measured as compact JSON. Objects travel in Temporal payloads (2 MB
#: limit, with room needed for the rest of the workflow input) and in etcd (1.5 MiB).
MAX_OBJECT_BYTES = 1 * MIB
#: Deepest nesting of mappings and lists in one document.
MAX_DEPTH = 64
#: Most nodes one document may have once aliases are expanded.
MAX_NODES = 200_000
#: Longest integer literal (``int()`` of a few thousand digits is slow and refused).
MAX_INT_DIGITS = 40

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"
STDIN_NAME = "<stdin>"

T = TypeVar("T")


@dataclass(frozen=True)
class Source:
    """Where an object came from: a path (or ``<stdin>``) and its 1-based document index."""

    path: str
    document: int = 1

    def __str__(self) -> str:
        return self.path if self.document == 1 else f"{self.path} (document {self.document})"


@dataclass
class LoadResult:
    """Validated objects in input order (one per kind/namespace/name, the later file
    winning), plus one line per problem, per note and per warning (a field upstream
    defines that fleetq accepts without acting on it, :func:`upstream_warnings`)."""

    objects: list[tuple[Source, FleetObject]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def of_kind(self, kind: type[T]) -> list[T]:
        """All loaded objects of one model class, e.g. ``result.of_kind(PyTorchJob)``."""
        return [obj for _, obj in self.objects if isinstance(obj, kind)]

    def priority_classes(self) -> dict[str, int]:
        """``{name: value}`` of the PriorityClasses in this load (for ``gang_of``)."""
        return {pc.metadata.name: pc.value for pc in self.of_kind(PriorityClass)}


# --------------------------------------------------------------------------- YAML loader


class _Problem(Exception):
    """A problem found while decoding one file; its text is the whole message after
    ``<file>: ``."""


_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_MERGE = "tag:yaml.org,2002:merge"


class _ManifestLoader(_Base):  # type: ignore[misc]
    """Safe loader that rejects duplicate keys and non-string keys, leaves dates as
    strings (as JSON would), and refuses absurdly long integers."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != _TIMESTAMP]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        written: dict[Any, tuple[int, str]] = {}  # key -> (line, text as written)
        if isinstance(node, MappingNode):
            for key_node, _ in node.value:
                if key_node.tag == _MERGE or not isinstance(key_node, ScalarNode):
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = written.get(key)
                except TypeError:
                    continue
                if first is not None:
                    raise _Problem(
                        f"line {line}: duplicate key {str(key)[:64]!r} (first at line {first[0]})"
                    )
                written[key] = (line, str(key_node.value))
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        out: dict[str, Any] = {}
        for key, value in mapping.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                line, text = written.get(key, (node.start_mark.line + 1, str(key)))
                raise _Problem(
                    f"line {line}: key {text[:64]!r} is not a string but "
                    f"{type(key).__name__} {str(key)[:64]!r} in YAML; quote it"
                )
            out[str(key)] = value
        return out

    def construct_yaml_int(self, node: Any) -> int:
        digits = str(node.value).lstrip("+-").replace("_", "")
        if len(digits) > MAX_INT_DIGITS:
            raise _Problem(
                f"line {node.start_mark.line + 1}: number {digits[:20]}... is too large "
                f"({len(digits)} digits)"
            )
        value: int = super().construct_yaml_int(node)
        return value


_ManifestLoader.add_constructor("tag:yaml.org,2002:int", _ManifestLoader.construct_yaml_int)


def _precheck(text: str) -> None:
    """Walk the event stream once (cheap, not recursive) and refuse nesting deeper than
    :data:`MAX_DEPTH` and documents that expand, through aliases, to more than
    :data:`MAX_NODES` nodes, before anything is built."""
    walk = _EventWalk()
    events = yaml.parse(text, Loader=_ManifestLoader)
    while True:
        try:
            event = next(events)
        except StopIteration:
            return
        except yaml.YAMLError as exc:
            # libyaml (bundled with PyYAML >= 6.0.4) refuses nesting past its own limit,
            # and its look-ahead can get there before we see the 65th level: give our
            # line rather than PyYAML's. Anything else is reported as invalid YAML.
            if _is_nesting_error(exc, text):
                mark = exc.problem_mark if isinstance(exc, yaml.MarkedYAMLError) else None
                line = mark.line + 1 if mark is not None else 1
                raise _Problem(
                    f"document {max(walk.document, 1)}: line {line}: nested deeper than "
                    f"{MAX_DEPTH} levels"
                ) from None
            raise
        walk.on_event(event)


class _EventWalk:
    """The state :func:`_precheck` keeps across events, with one handler per event kind."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.stack: list[list[Any]] = []  # [anchor, expanded size so far] per open collection
        self.document = 0

    def on_event(self, event: yaml.Event) -> None:
        line = event.start_mark.line + 1 if event.start_mark else 0
        if isinstance(event, DocumentStartEvent):
            self.document += 1
            self.sizes.clear()
        elif isinstance(event, ScalarEvent):
            self._done(1, event.anchor, line)
        elif isinstance(event, AliasEvent):
            self._on_alias(event, line)
        elif isinstance(event, CollectionStartEvent):
            self._on_collection_start(event, line)
        elif isinstance(event, CollectionEndEvent):
            anchor, size = self.stack.pop()
            self._done(size, anchor, line)

    def _on_alias(self, event: AliasEvent, line: int) -> None:
        if any(entry[0] == event.anchor for entry in self.stack):
            raise _Problem(
                f"document {self.document}: line {line}: alias *{event.anchor} refers to a "
                "collection that contains it (recursive)"
            )
        self._done(self.sizes.get(event.anchor or "", 1), None, line)

    def _on_collection_start(self, event: CollectionStartEvent, line: int) -> None:
        if len(self.stack) >= MAX_DEPTH:
            raise _Problem(
                f"document {self.document}: line {line}: nested deeper than {MAX_DEPTH} levels"
            )
        self.stack.append([event.anchor, 1])

    def _done(self, size: int, anchor: str | None, line: int) -> None:
        if anchor is not None:
            self.sizes[anchor] = size
        if self.stack:
            self.stack[-1][1] += size
            if self.stack[-1][1] > MAX_NODES:
                raise _Problem(
                    f"document {self.document}: line {line}: expands to more than {MAX_NODES} "
                    "nodes through aliases (a YAML bomb?)"
                )


def _is_nesting_error(exc: yaml.YAMLError, text: str) -> bool:
    """Whether PyYAML gave up because of nesting depth: its message says so ("exceeded
    maximum nesting depth" in PyYAML 6.0.4), or, whatever the wording, the brackets open
    where it stopped are deeper than :data:`MAX_DEPTH`."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return False
    words = f"{exc.problem or ''} {exc.context or ''}".lower()
    if "nesting" in words or "depth" in words:
        return True
    mark = exc.problem_mark
    if mark is None or not isinstance(getattr(mark, "index", None), int):
        return False
    depth = deepest = 0
    for ch in text[: mark.index + 1]:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest > MAX_DEPTH


def _yaml_documents(text: str) -> Iterator[Any]:
    _precheck(text)
    yield from yaml.load_all(text, Loader=_ManifestLoader)


def _json_document(text: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise _Problem(f"duplicate key {key[:64]!r} (JSON)")
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise _Problem(f"line {exc.lineno}, column {exc.colno}: {exc.msg} (JSON)") from None
    except RecursionError:
        raise _Problem(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # e.g. an integer with thousands of digits
        raise _Problem(f"{str(exc)[:120]} (JSON)") from None


def _yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "is not valid YAML"
        context = f" {exc.context}" if exc.context and exc.problem else ""
        return f"{where}{problem}{context} (not valid YAML)"
    return f"{str(exc)[:200]} (not valid YAML)"


def _documents(text: str, path: str) -> Iterator[tuple[int, Any]]:
    """Decoded documents with their 1-based index; raises :class:`_Problem`."""
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            yield 1, _json_document(text)
            return
        except _Problem:
            if path.lower().endswith(".json"):
                raise
        # Not JSON after all: YAML flow syntax is a superset, try that.
    index = 0
    try:
        for index, doc in enumerate(_yaml_documents(text), start=1):  # noqa: B007
            yield index, doc
    except yaml.YAMLError as exc:
        raise _Problem(_yaml_error(exc)) from None
    except RecursionError:
        raise _Problem(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise _Problem(f"document {index + 1}: {str(exc)[:120]}") from None


# --------------------------------------------------------------------------- per-object checks


def _json_problem(value: Any) -> tuple[str, str] | None:
    """First value that JSON (and so Kubernetes and Temporal) cannot carry, as
    ``(field path, message)``. Iterative, so deep input cannot exhaust the stack."""
    todo: list[tuple[str, Any, int]] = [("", value, 0)]
    while todo:
        path, v, depth = todo.pop()
        if depth > MAX_DEPTH:
            return path, f"is nested deeper than {MAX_DEPTH} levels"
        if isinstance(v, dict):
            problem = _push_mapping(path, v, depth, todo)
        elif isinstance(v, list):
            todo.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(v))
            problem = None
        else:
            problem = _scalar_problem(v)
        if problem is not None:
            return path, problem
    return None


def _push_mapping(
    path: str, v: dict[Any, Any], depth: int, todo: list[tuple[str, Any, int]]
) -> str | None:
    """Queue a mapping's values for :func:`_json_problem`; the problem with a key that is
    not a string, if any."""
    for k, item in v.items():
        if not isinstance(k, str):
            return f"has a key {str(k)[:64]!r} that is not a string"
        todo.append((f"{path}.{k}" if path else k, item, depth + 1))
    return None


def _scalar_problem(v: Any) -> str | None:
    """Why JSON cannot hold the scalar ``v``, or None when it can."""
    if isinstance(v, float):
        return None if math.isfinite(v) else f"{v} is not a finite number"
    if isinstance(v, bytes):
        return "is binary data (!!binary), which JSON cannot hold"
    if v is not None and not isinstance(v, (str, int, bool)):
        return f"is a {type(v).__name__}, which JSON cannot hold"
    return None


def _object_size(doc: Any) -> int:
    return len(json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def preemption_annotation_error(obj: FleetObject) -> ManifestError | None:
    """The error the quota workflow (a tree's ``fleetq.io/preemption``, ``reclaim`` and
    ``fair-share-weight``) or the job workflow (a job's ``fleetq.io/preemptible`` and
    ``preemption-grace-seconds``) would refuse ``obj`` with, or None when its preemption
    annotations are good. The first bad annotation of an object is reported."""
    try:
        if isinstance(obj, ElasticQuotaTree):
            tree_policy(obj)
        elif isinstance(obj, PyTorchJob):
            job_policy(obj)
    except ManifestError as exc:
        return exc
    return None


@dataclass
class _Entry:
    source: Source
    obj: FleetObject
    raw: Any


def _check_document(doc: Any, source: Source, errors: list[str]) -> FleetObject | None:
    ref = object_ref(doc)
    problem = _json_problem(doc)
    if problem is not None:
        errors.append(str(ManifestError(ref, problem[0], problem[1])))
        return None
    size = _object_size(doc)
    if size > MAX_OBJECT_BYTES:
        errors.append(
            str(
                ManifestError(
                    ref,
                    "",
                    f"is {size / MIB:.1f} MiB as JSON; an object may be at most "
                    f"{MAX_OBJECT_BYTES // MIB} MiB (it must fit a Temporal payload)",
                )
            )
        )
        return None
    try:
        obj = parse_object(doc)
    except ManifestErrors as exc:
        errors.extend(str(e) for e in exc.errors)
        return None
    except RecursionError:
        errors.append(str(ManifestError(ref, "", f"is nested deeper than {MAX_DEPTH} levels")))
        return None
    refused = preemption_annotation_error(obj)
    if refused is not None:
        errors.append(str(refused))
        return None
    return obj


@dataclass
class _Parsed:
    entries: list[_Entry] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: bool = False  # a directory's file that is not a manifest


def _is_kubernetes_object(doc: Any) -> bool:
    return isinstance(doc, dict) and ("apiVersion" in doc or "kind" in doc)


def _parse_text(text: str, path: str, found_in_directory: bool = False) -> _Parsed:
    out = _Parsed()
    docs = _read_documents(text, path, out)
    if docs is None:
        return out
    if found_in_directory and all(
        isinstance(doc, dict) and not _is_kubernetes_object(doc) for _, doc in docs
    ):
        # Other YAML that lives beside manifests (kustomization, values, sim traces).
        out.notes.append(f"{path}: skipped, not a Kubernetes manifest (no apiVersion or kind)")
        out.skipped = True
        return out
    for index, doc in docs:
        _check_items(doc, index, path, out)
    return out


def _read_documents(text: str, path: str, out: _Parsed) -> list[tuple[int, Any]] | None:
    """The file's non-empty documents, or None (with the reason in ``out.errors``) when
    the file is too large, binary, not YAML or empty."""
    if len(text) > MAX_FILE_BYTES:
        out.errors.append(f"{path}: is larger than {MAX_FILE_BYTES // MIB} MiB")
        return None
    if "\x00" in text:
        out.errors.append(f"{path}: is a binary file, not YAML or JSON")
        return None
    try:
        docs = [(index, doc) for index, doc in _documents(text, path) if doc is not None]
    except _Problem as exc:
        out.errors.append(f"{path}: {exc}")
        return None
    if not docs:
        out.errors.append(f"{path}: is empty (no manifests)")
        return None
    return docs


def _check_items(doc: Any, index: int, path: str, out: _Parsed) -> None:
    """Check one document (each item, for a List) into ``out``."""
    items: list[tuple[Any, str]] = [(doc, f"document {index}")]
    if (
        isinstance(doc, dict)
        and doc.get("kind") == "List"
        and isinstance(doc.get("items"), list)
    ):
        # kubectl's List wrapper, as `kubectl get -o yaml` writes it
        items = [(it, f"document {index} item {i}") for i, it in enumerate(doc["items"])]
    source = Source(path, index)
    for item, where in items:
        if not isinstance(item, dict):
            out.errors.append(
                f"{path}: {where} is not a mapping (a Kubernetes object); "
                f"it is {_describe(item)}"
            )
            continue
        obj = _check_document(item, source, out.errors)
        if obj is not None:
            out.entries.append(_Entry(source, obj, item))


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return f"the value {str(value)[:40]!r}"


# --------------------------------------------------------------------------- cross-object checks


def _key(obj: FleetObject) -> tuple[str, str, str]:
    ns = "" if isinstance(obj, PriorityClass) else obj.metadata.namespace
    return (obj.kind, ns, obj.metadata.name)


def _cross_check(entries: list[_Entry]) -> LoadResult:
    result = LoadResult()
    final: dict[tuple[str, str, str], _Entry] = {}
    for entry in entries:
        key = _key(entry.obj)
        ref = object_ref(entry.raw)
        earlier = final.get(key)
        if earlier is None:
            final[key] = entry
            continue
        if earlier.source.path == entry.source.path:
            result.errors.append(
                f"{ref}: is defined twice in {entry.source.path} "
                f"(documents {earlier.source.document} and {entry.source.document})"
            )
            continue
        if earlier.obj.model_dump() == entry.obj.model_dump():
            result.notes.append(
                f"{ref}: defined identically in {earlier.source} and {entry.source}"
            )
        else:
            result.notes.append(
                f"{ref}: defined in {earlier.source} and again in {entry.source}; "
                "the later one is used (as kubectl apply would)"
            )
        del final[key]  # re-insert to keep "last applied" order
        final[key] = entry

    tree: _Entry | None = None
    for key, entry in list(final.items()):
        if entry.obj.kind != "ElasticQuotaTree":
            continue
        if tree is None:
            tree = entry
            continue
        result.errors.append(
            f"{object_ref(entry.raw)}: is a second ElasticQuotaTree; only one is supported "
            f"and {object_ref(tree.raw)} ({tree.source}) is already defined"
        )
        del final[key]
    result.objects = [(e.source, e.obj) for e in final.values()]
    result.warnings = [w for _, obj in result.objects for w in upstream_warnings(obj)]
    return result


# --------------------------------------------------------------------------- public API


def parse_manifest_text(text: str, source: str) -> LoadResult:
    """Validate the manifests in one text (YAML, possibly several documents, or JSON);
    ``source`` names it in messages."""
    parsed = _parse_text(text, source)
    result = _cross_check(parsed.entries)
    result.errors[:0] = parsed.errors
    result.notes[:0] = parsed.notes
    return result


def _decode(data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise _Problem("is a binary file, not YAML or JSON")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _Problem(
            f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def _read_file(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except IsADirectoryError:
        raise _Problem("is a directory") from None
    except OSError as exc:
        raise _Problem(f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_FILE_BYTES:
        raise _Problem(f"is larger than {MAX_FILE_BYTES // MIB} MiB")
    return _decode(data)


def _read_stdin(stdin: TextIO) -> str:
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        return _decode(buffer.read(MAX_FILE_BYTES + 1))
    try:
        text = stdin.read(MAX_FILE_BYTES + 1)
    except UnicodeDecodeError as exc:
        raise _Problem(f"is not UTF-8 text ({exc.reason})") from None
    return text


def _walk(directory: str) -> list[str]:
    found: list[tuple[tuple[str, ...], str]] = []
    for root, dirs, files in os.walk(directory, onerror=None):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith(".") or not name.lower().endswith(MANIFEST_SUFFIXES):
                continue
            full = os.path.join(root, name)
            rel = os.path.relpath(full, directory)
            found.append((tuple(rel.split(os.sep)), full))
    return [full for _, full in sorted(found)]


def _sources(paths: Sequence[str], errors: list[str]) -> Iterator[tuple[str, str | None]]:
    """Each file to read once, with the directory argument it was found under (if any)."""
    seen: set[str] = set()
    for path in paths:
        if path == STDIN:
            if STDIN not in seen:
                seen.add(STDIN)
                yield STDIN, None
            continue
        directory: str | None = None
        if os.path.isdir(path):
            directory = path
            candidates = _walk(path)
            if not candidates:
                errors.append(f"{path}: no *.yaml, *.yml or *.json files in this directory")
        elif os.path.lexists(path):
            candidates = [path]
        else:
            errors.append(f"{path}: no such file or directory")
            continue
        for file in candidates:
            real = os.path.realpath(file)
            if real not in seen:
                seen.add(real)
                yield file, directory


def load_manifests(paths: Sequence[str], stdin: TextIO | None = None) -> LoadResult:
    """Load and validate every manifest under ``paths`` (files, directories, or ``-``
    for stdin). Never raises for bad input: problems are in ``.errors``."""
    errors: list[str] = []
    notes: list[str] = []
    entries: list[_Entry] = []
    manifests_in: dict[str, int] = {}  # directory argument -> files not skipped
    for path, directory in _sources(paths, errors):
        name = STDIN_NAME if path == STDIN else path
        if directory is not None:
            manifests_in[directory] = manifests_in.get(directory, 0) + 1
        try:
            text = _read_stdin(stdin or sys.stdin) if path == STDIN else _read_file(path)
        except _Problem as exc:
            errors.append(f"{name}: {exc}")
            continue
        except (OSError, io.UnsupportedOperation) as exc:
            errors.append(f"{name}: cannot be read ({exc})")
            continue
        parsed = _parse_text(text, name, found_in_directory=directory is not None)
        entries.extend(parsed.entries)
        errors.extend(parsed.errors)
        notes.extend(parsed.notes)
        if directory is not None and parsed.skipped:
            manifests_in[directory] -= 1  # skipped: not a manifest
    for directory, count in manifests_in.items():
        if not count:
            errors.append(f"{directory}: no Kubernetes manifests in this directory")
    result = _cross_check(entries)
    result.errors[:0] = errors
    result.notes[:0] = notes
    return result
