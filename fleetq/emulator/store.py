"""The object store of one emulated cluster: what etcd plus the API server's watch cache
do for a real one.

Objects are plain dicts that are never mutated in place once stored (writers store a new
dict), so a LIST can reuse each object's cached JSON bytes and watch events can share
them. Every write bumps one cluster-wide ``resourceVersion`` counter, is appended to a
per-resource history (so a watch can resume from a resourceVersion) and is fanned out to
live watchers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleetq.emulator.selectors import Matcher

Key = tuple[str, str]  # (namespace or "", name)
Obj = dict[str, Any]
Hook = Callable[[str, str, Obj | None, Obj | None], None]  # plural, type, new, old

HISTORY = 20_000  # events kept per resource for watch resumption
WATCH_QUEUE_LIMIT = 100_000  # a watcher further behind than this is dropped


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def encode_continue(rv: str, key: Key) -> str:
    """A LIST continue token (like the real one: base64 JSON of the list's
    resourceVersion and the last key returned)."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": int(rv), "start": f"{key[0]}/{key[1]}"})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[str, Key]:
    """``(resourceVersion, last key)`` of a continue token; ApiError 400 if malformed."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        ns, _, name = str(data["start"]).partition("/")
        return str(int(data["rv"])), (ns, name)
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, "BadRequest",
                       f"continue key is not valid: {type(exc).__name__}") from None


@dataclass(frozen=True)
class ResourceType:
    """One REST resource (``pods``, ``pytorchjobs``) as discovery describes it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    has_status: bool = False
    verbs: tuple[str, ...] = (
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch",
    )

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


CORE = [
    ResourceType("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",), True),
    ResourceType("", "v1", "nodes", "Node", False, "node", ("no",), True),
    ResourceType("", "v1", "pods", "Pod", True, "pod", ("po",), True),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",)),
    ResourceType("", "v1", "secrets", "Secret", True, "secret"),
    ResourceType(
        "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True,
        "persistentvolumeclaim", ("pvc",), True,
    ),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, "serviceaccount", ("sa",)),
    ResourceType("", "v1", "events", "Event", True, "event", ("ev",)),
    # the training-operator's headless Service per replica
    ResourceType("", "v1", "services", "Service", True, "service", ("svc",), True),
]
PYTORCHJOBS = ResourceType(
    "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", True, "pytorchjob", (), True
)
RESERVATIONS = ResourceType(
    "scheduling.koordinator.sh", "v1alpha1", "reservations", "Reservation", False,
    "reservation", ("reserv",), True,
)
#: ``coordination.k8s.io/v1`` Leases: what Kubernetes components (and fleetq's bind, see
#: ``activities.member_cluster``) use as a lock. Their updates must name a
#: resourceVersion (the real strategy refuses unconditional updates), so two writers
#: racing for one Lease get a 409 Conflict.
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, "lease")


class ApiError(Exception):
    """An API failure rendered as a Kubernetes ``Status`` body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:
            del body["reason"]  # as the real server's internal errors
        if self.details is not None:
            body["details"] = self.details
        return body


def status_details(rt: ResourceType, name: str, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "kind": rt.plural}
    if rt.group:
        d["group"] = rt.group
    d.update(extra)
    return d


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.group_resource} "{name}" not found',
                    status_details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{rt.group_resource} "{name}" already exists',
        status_details(rt, name),
    )


def conflict(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.group_resource} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        status_details(rt, name),
    )


def invalid(rt: ResourceType, name: str, field_path: str, message: str) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f'{rt.kind} "{name}" is invalid: {field_path}: {message}',
        {**status_details(
            rt, name,
            causes=[{"reason": "FieldValueInvalid", "message": message, "field": field_path}],
        ), "kind": rt.kind},  # a real 422 names the Kind here, not the resource
    )


@dataclass
class WatchEvent:
    rv: int
    type: str
    new: Obj | None
    old: Obj | None
    _line: dict[str, bytes] = field(default_factory=dict)

    def line(self, type_: str, obj: Obj, cached: bytes | None = None) -> bytes:
        got = self._line.get(type_)
        if got is None:
            body = cached if cached is not None else dumps(obj)
            got = b'{"type":"' + type_.encode() + b'","object":' + body + b"}\n"
            self._line[type_] = got
        return got


class Watcher:
    """One open watch: a queue of ready-to-send JSON lines (None = end of stream)."""

    def __init__(self, rt: ResourceType, namespace: str | None, matcher: Matcher | None) -> None:
        self.rt = rt
        self.namespace = namespace
        self.matcher = matcher
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False

    def _selects(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.matcher is None or self.matcher(obj)

    def offer(self, ev: WatchEvent, cache: Callable[[Obj], bytes]) -> None:
        if self.closed:
            return
        now_in = self._selects(ev.new)
        was_in = self._selects(ev.old)
        if ev.type == "DELETED":
            if was_in and ev.old is not None:
                self.queue.put_nowait(ev.line("DELETED", ev.old))
            return
        if now_in and ev.new is not None:
            type_ = "MODIFIED" if was_in else "ADDED"
            self.queue.put_nowait(ev.line(type_, ev.new, cache(ev.new)))
        elif was_in and ev.new is not None:
            self.queue.put_nowait(ev.line("DELETED", ev.new, cache(ev.new)))
        if self.queue.qsize() > WATCH_QUEUE_LIMIT:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)


class Store:
    """All objects of one cluster, by resource plural then ``(namespace, name)``."""

    def __init__(self, types: Iterable[ResourceType]) -> None:
        self.types: dict[str, ResourceType] = {t.plural: t for t in types}
        self.rv = 1
        self.objects: dict[str, dict[Key, Obj]] = {p: {} for p in self.types}
        # id(obj) -> (obj, JSON) for stored objects (immutable once stored); holding obj
        # keeps its id from being reused while the entry lives.
        self._bytes: dict[int, tuple[Obj, bytes]] = {}
        self._item_bytes: dict[int, tuple[Obj, bytes]] = {}  # same, as a LIST item
        self.history: dict[str, deque[WatchEvent]] = {p: deque() for p in self.types}
        self.floor: dict[str, int] = {p: 0 for p in self.types}  # oldest rv still resumable
        self.watchers: dict[str, set[Watcher]] = {p: set() for p in self.types}
        self.hooks: list[Hook] = []
        self.dirty = False
        # plural -> (label key, value) -> keys of the objects carrying it (an ordered set),
        # so a LIST by ``key=value`` costs the matches, not the whole resource: the
        # adapter lists a job's pods by label on every status read
        self._by_label: dict[str, dict[tuple[str, str], dict[Key, None]]] = {
            p: {} for p in self.types
        }

    # ------------------------------------------------------------------ reads

    def get(self, plural: str, namespace: str, name: str) -> Obj | None:
        return self.objects[plural].get((namespace, name))

    def items(self, plural: str, namespace: str | None = None) -> list[Obj]:
        objs = self.objects[plural].values()
        if namespace is None:
            return list(objs)
        return [o for o in objs if o["metadata"].get("namespace") == namespace]

    def cached_json(self, obj: Obj) -> bytes:
        entry = self._bytes.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        b = dumps(obj)
        self._bytes[id(obj)] = (obj, b)
        return b

    def _candidates(
        self, plural: str, namespace: str | None, label_terms: Iterable[tuple[str, str]]
    ) -> list[Obj]:
        """Objects that may match: those carrying every ``key=value`` of the selector
        (all of them when it has none), in the order they were first labelled so."""
        terms = list(label_terms)
        if not terms:
            return self.items(plural, namespace)
        index = self._by_label[plural]
        sets = sorted((index.get(t, {}) for t in terms), key=len)
        objs = self.objects[plural]
        return [
            objs[k]
            for k in sets[0]
            if all(k in other for other in sets[1:])
            and (namespace is None or k[0] == namespace)
        ]

    def _index(self, plural: str, key: Key, new: Obj | None, old: Obj | None) -> None:
        index = self._by_label[plural]
        before = (old or {}).get("metadata", {}).get("labels") or {}
        after = (new or {}).get("metadata", {}).get("labels") or {}
        for term in before.items():
            if after.get(term[0]) != term[1] and term in index:
                index[term].pop(key, None)
                if not index[term]:
                    del index[term]
        for term in after.items():
            if isinstance(term[1], str):
                index.setdefault(term, {})[key] = None

    def list_item_json(self, obj: Obj) -> bytes:
        """A built-in object as a LIST item: a real API server leaves its ``kind`` and
        ``apiVersion`` out there (custom resources keep them)."""
        entry = self._item_bytes.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        b = dumps({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
        self._item_bytes[id(obj)] = (obj, b)
        return b

    def list_json(
        self,
        plural: str,
        namespace: str | None,
        matcher: Matcher | None,
        label_terms: Iterable[tuple[str, str]] = (),
        limit: int = 0,
        token: str = "",
    ) -> bytes:
        """The LIST body; ``label_terms`` are the selector's ``key=value`` terms (the
        matcher still decides, they only narrow what it is asked about). With ``limit``
        the items come in key order (namespace, name), at most ``limit`` of them, with a
        ``continue`` token for the rest (``token`` = such a token, from a page before)."""
        rt = self.types[plural]
        rv = str(self.rv)
        objs = self._candidates(plural, namespace, label_terms)
        meta: dict[str, Any] = {"resourceVersion": rv}
        if limit > 0 or token:
            start: Key | None = None
            if token:
                rv, start = decode_continue(token)
                meta["resourceVersion"] = rv
            objs = sorted(objs, key=self._key)
            if start is not None:
                objs = [o for o in objs if self._key(o) > start]
            objs = [o for o in objs if matcher is None or matcher(o)]
            matcher = None
            if 0 < limit < len(objs):
                meta["continue"] = encode_continue(rv, self._key(objs[limit - 1]))
                meta["remainingItemCount"] = len(objs) - limit
                objs = objs[:limit]
        item = self.list_item_json if not rt.group else self.cached_json
        parts = [item(o) for o in objs if matcher is None or matcher(o)]
        head = dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta})
        return head[:-1] + b',"items":[' + b",".join(parts) + b"]}"

    # ------------------------------------------------------------------ writes

    def _key(self, obj: Obj) -> Key:
        meta = obj["metadata"]
        return (meta.get("namespace") or "", meta["name"])

    def _commit(self, plural: str, type_: str, new: Obj | None, old: Obj | None) -> None:
        self.dirty = True
        obj = new if new is not None else old
        if obj is not None:
            self._index(plural, self._key(obj), new, old)
        if old is not None:
            self._bytes.pop(id(old), None)
            self._item_bytes.pop(id(old), None)
        ev = WatchEvent(self.rv, type_, new, old)
        hist = self.history[plural]
        hist.append(ev)
        if len(hist) > HISTORY:
            dropped = hist.popleft()
            self.floor[plural] = dropped.rv
        for w in list(self.watchers[plural]):
            w.offer(ev, self.cached_json)
            if w.closed:
                self.watchers[plural].discard(w)
        for hook in self.hooks:
            hook(plural, type_, new, old)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def create(self, plural: str, obj: Obj) -> Obj:
        """Store a new object (metadata already validated); fills uid, rv, timestamps."""
        rt = self.types[plural]
        key = self._key(obj)
        if key in self.objects[plural]:
            raise already_exists(rt, key[1])
        meta = obj["metadata"]
        meta["uid"] = meta.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = meta.get("creationTimestamp") or now_iso()
        meta["generation"] = 1
        meta["resourceVersion"] = self._next_rv()
        meta.pop("deletionTimestamp", None)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        self.objects[plural][key] = obj
        self._commit(plural, "ADDED", obj, None)
        return obj

    def replace(self, plural: str, obj: Obj, *, expect_rv: str | None = None) -> Obj:
        """Store a new version of an existing object (a fresh dict, never the stored one).
        ``expect_rv`` set = optimistic concurrency (409 Conflict when stale)."""
        rt = self.types[plural]
        key = self._key(obj)
        old = self.objects[plural].get(key)
        if old is None:
            raise not_found(rt, key[1])
        if obj is old:
            raise RuntimeError("store objects must not be mutated in place")
        if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt, key[1])
        meta = obj["metadata"]
        ometa = old["metadata"]
        for k in ("uid", "creationTimestamp"):
            meta[k] = ometa[k]
        gen = int(ometa.get("generation") or 1)
        if obj.get("spec") != old.get("spec"):
            gen += 1
        meta["generation"] = gen
        meta["resourceVersion"] = self._next_rv()
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        self.objects[plural][key] = obj
        self._commit(plural, "MODIFIED", obj, old)
        return obj

    def delete(
        self, plural: str, namespace: str, name: str, *, expect_rv: str | None = None
    ) -> Obj:
        rt = self.types[plural]
        old = self.objects[plural].get((namespace, name))
        if old is None:
            raise not_found(rt, name)
        if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
            raise conflict(rt, name)
        del self.objects[plural][(namespace, name)]
        gone = {**old, "metadata": {**old["metadata"], "resourceVersion": self._next_rv(),
                                    "deletionTimestamp": now_iso()}}
        self._bytes.pop(id(old), None)
        self._commit(plural, "DELETED", None, gone)
        return gone

    # ------------------------------------------------------------------ watch

    def watch(
        self,
        plural: str,
        namespace: str | None,
        matcher: Matcher | None,
        since: int | None,
    ) -> Watcher:
        """Open a watch. ``since`` None = synthetic ADDED for current objects first;
        otherwise replay history after that resourceVersion (410 Gone when too old)."""
        rt = self.types[plural]
        w = Watcher(rt, namespace, matcher)
        if since is None:
            for obj in self.items(plural, namespace):
                if matcher is None or matcher(obj):
                    w.queue.put_nowait(
                        b'{"type":"ADDED","object":' + self.cached_json(obj) + b"}\n"
                    )
        else:
            if since < self.floor[plural]:
                raise ApiError(
                    410, "Expired",
                    f"too old resource version: {since} ({self.floor[plural]})",
                )
            for ev in self.history[plural]:
                if ev.rv > since:
                    w.offer(ev, dumps)  # old versions: not in the per-object cache
        self.watchers[plural].add(w)
        return w

    def compact(self) -> int:
        """Forget the history up to now, as etcd's compaction does: a watch from an
        older resourceVersion then gets 410 Gone. Returns the compacted revision."""
        for plural in self.types:
            self.history[plural].clear()
            self.floor[plural] = self.rv
        return self.rv

    def unwatch(self, w: Watcher) -> None:
        self.watchers[w.rt.plural].discard(w)

    def close_watchers(self) -> None:
        for ws in self.watchers.values():
            for w in ws:
                w.close()
            ws.clear()

    # ------------------------------------------------------------------ persistence

    def dump(self) -> dict[str, Any]:
        return {
            "resourceVersion": self.rv,
            "objects": {p: list(objs.values()) for p, objs in self.objects.items() if objs},
        }

    def load(self, data: dict[str, Any]) -> None:
        """Restore a :meth:`dump` (no events, no hooks: callers resync afterwards)."""
        self.rv = int(data.get("resourceVersion") or 1)
        for plural, objs in (data.get("objects") or {}).items():
            if plural not in self.objects:
                continue
            self.objects[plural] = {self._key(o): o for o in objs}
            self._by_label[plural] = {}
            for key, o in self.objects[plural].items():
                self._index(plural, key, o, None)
        self.floor = {p: self.rv for p in self.types}
        self._bytes.clear()
