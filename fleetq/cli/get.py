"""``fleetq get``: list fleet objects like ``kubectl get`` (and ``kubectl amc get -M``).

The client library reads them (:mod:`fleetq.client`): jobs from their workflows (a
deleted job is gone, a finished one keeps its final state like a completed Kubernetes
object), queues from the quota workflow, policies and PriorityClasses from the fleet
registry, and what the member clusters themselves hold for ``get pytorchjob -M``, ``get
pod`` and ``-m CLUSTER``. This module renders: one view per resource kind, picked from
a table (``GETTERS``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import typer

from fleetq.cli.context import CliError, fleet_config_path, get_client, guarded, run
from fleetq.cli.output import (
    age,
    as_list,
    check_output,
    namespaced,
    print_object,
    print_table,
)
from fleetq.client.errors import NotFound
from fleetq.naming import job_workflow_id

if TYPE_CHECKING:  # the commands import the client library and the core when they run
    from temporalio.client import Client

    from fleetq.cli.member_views import MemberSnapshot
    from fleetq.client.http_api import JobRow, WebApi
    from fleetq.job_view import JobView
    from fleetq.messages import QuotaView

# kubectl-style names and aliases of what `get`/`describe`/`delete` understand.
ALIASES = {
    "pytorchjob": "pytorchjob", "pytorchjobs": "pytorchjob",
    "pytorchjobs.kubeflow.org": "pytorchjob",
    "pytorchjob.kubeflow.org": "pytorchjob", "pj": "pytorchjob",
    "pod": "pod", "pods": "pod", "po": "pod",
    "queue": "queue", "queues": "queue",
    "propagationpolicy": "propagationpolicy", "propagationpolicies": "propagationpolicy",
    "pp": "propagationpolicy",
    "clusterpropagationpolicy": "clusterpropagationpolicy",
    "clusterpropagationpolicies": "clusterpropagationpolicy", "cpp": "clusterpropagationpolicy",
    "elasticquotatree": "elasticquotatree", "elasticquotatrees": "elasticquotatree",
    "eqt": "elasticquotatree",
    "priorityclass": "priorityclass", "priorityclasses": "priorityclass", "pc": "priorityclass",
    "cluster": "cluster", "clusters": "cluster", "clusters.cluster.karmada.io": "cluster",
}


def resource_kind(name: str) -> str:
    kind = ALIASES.get(name.lower())
    if kind is None:
        raise CliError(
            f'error: the server doesn\'t have a resource type "{name}" (fleetq knows: '
            "pytorchjob, pod, queue, propagationpolicy, clusterpropagationpolicy, "
            "elasticquotatree, priorityclass, cluster)"
        )
    return kind


# --------------------------------------------------------------------------- objects


def job_object(view: JobView) -> dict[str, Any]:
    """A job view shaped like a Kubernetes object, for ``-o yaml|json``."""
    status = view.model_dump(mode="json", exclude={"namespace", "name"})
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": view.name,
            "namespace": view.namespace,
            "creationTimestamp": status.get("created_at"),
            "annotations": {"fleetq.io/workflow-id": job_workflow_id(view.namespace, view.name)},
        },
        "status": status,
    }


# --------------------------------------------------------------------------- printers

def _no_resources(namespace: str | None) -> None:
    where = f" in {namespace} namespace" if namespace else ""
    typer.echo(f"No resources found{where}.", err=True)


def print_jobs(views: Sequence[JobView], *, output: str | None, all_namespaces: bool,
               namespace: str | None, single: bool = False,
               queues: dict[tuple[str, str], str] | None = None) -> None:
    """``get pytorchjob``'s output: ``-o yaml|json``, else :func:`print_job_table`."""
    if output in ("yaml", "json"):
        objs = [job_object(v) for v in views]
        print_object(objs[0] if single and objs else as_list(objs), output)
        return
    print_job_table(views, wide=output == "wide", all_namespaces=all_namespaces,
                    namespace=namespace, queues=queues)


def print_job_table(views: Sequence[JobView | JobRow], *, wide: bool, all_namespaces: bool,
                    namespace: str | None,
                    queues: dict[tuple[str, str], str] | None = None) -> None:
    """``get pytorchjob``'s table (``-o wide`` too), of views or of the HTTP reader's
    :class:`~fleetq.client.http_api.JobRow` s, which hold what it shows."""
    if not views:
        _no_resources(None if all_namespaces else namespace)
        return
    headers = ["NAME", "STATE", "AGE"]
    if wide:
        headers += ["CLUSTER", "QUEUE", "PRIORITY", "REASON"]
    rows: list[tuple[str, list[Any]]] = []
    for v in views:
        row: list[Any] = [v.name, v.state, age(v.created_at)]
        if wide:
            queue = v.queue or (queues or {}).get((v.namespace, v.name)) or "<none>"
            row += [v.cluster or "<none>", queue, v.priority, v.reason or "-"]
        rows.append((v.namespace, row))
    print_table(*namespaced(headers, rows, all_namespaces))


def copy_rows(views: list[JobView], all_namespaces: bool) -> tuple[list[str], list[list[Any]]]:
    """``get pytorchjob -M`` from the workflows' view only (no fleet config to read the
    members with): one row per copy fleetq knows of (``ADOPTION Y`` = the fleet owns it)."""
    headers = ["NAME", "CLUSTER", "STATE", "AGE", "ADOPTION"]
    rows: list[tuple[str, list[Any]]] = []
    for v in views:
        clusters = ([v.cluster] if v.cluster else []) + [c for c in v.copies if c != v.cluster]
        for c in clusters:
            state = v.state if c == v.cluster else "Evicted"
            # the copy's own metadata.creationTimestamp, as the job last read it
            rows.append((v.namespace, [v.name, c, state, age(v.copy_created.get(c)), "Y"]))
    return namespaced(headers, rows, all_namespaces)


def pod_rows(views: list[JobView], all_namespaces: bool, wide: bool = False,
             ) -> tuple[list[str], list[list[Any]]]:
    """``get pod -M`` from the workflows' view only: the pods of every job on its
    current cluster, as the job's last watch saw them."""
    headers = ["NAME", "CLUSTER", "READY", "STATUS", "RESTARTS", "AGE"]
    if wide:
        headers.append("NODE")
    rows: list[tuple[str, list[Any]]] = []
    for v in views:
        if not v.cluster:
            continue
        for p in sorted(v.pods, key=lambda p: str(p.get("name"))):
            row: list[Any] = [
                p.get("name", "?"), v.cluster, "1/1" if p.get("ready") else "0/1",
                p.get("phase", "Unknown"), p.get("restarts", 0),
                # the pod's own creationTimestamp, as kubectl's printPod shows it
                age(p.get("created_at")),
            ]
            if wide:
                row.append(p.get("node") or "<none>")
            rows.append((v.namespace, row))
    return namespaced(headers, rows, all_namespaces)


def queue_rows(view: QuotaView, started: datetime | None,
               wide: bool) -> tuple[list[str], list[list[Any]]]:
    """``get queue`` rows; AGE from ``started``: when the queues' tree was applied."""
    from fleetq.resources import format_quantity

    headers = ["NAME", "AGE"]
    if wide:
        headers += ["LENGTH", "ADMITTED", "POLICY", "USAGE", "INADMISSIBLE"]
    rows: list[list[Any]] = []
    for q in sorted(view.queues, key=lambda q: q.name):
        row: list[Any] = [q.name, age(started)]
        if wide:
            usage = ", ".join(
                f"{k} {format_quantity(k, q.usage.get(k, 0))}/{format_quantity(k, v)}"
                for k, v in sorted(q.max.items())
            )
            row += [q.length, q.admitted, q.policy, usage or "-", q.inadmissible]
        rows.append(row)
    return headers, rows


# --------------------------------------------------------------------------- get KIND


@dataclass
class GetArgs:
    """What ``fleetq get`` was asked, shared by the per-resource functions."""

    name: str | None
    namespace: str | None  # as given with -n
    all_namespaces: bool
    output: str | None
    all_clusters: bool
    #: the fleet config to read members with (None: FLEETQ_CONFIG or the running fleet)
    fleet_config: str | None = None

    @property
    def ns(self) -> str | None:
        """The namespace selected (None = all)."""
        return None if self.all_namespaces else (self.namespace or "default")


async def _members(args: GetArgs) -> MemberSnapshot | None:
    import asyncio

    from fleetq.cli.member_views import read_members

    return await asyncio.to_thread(read_members, args.ns, args.fleet_config)


async def _get_pytorchjobs(client: Client, args: GetArgs) -> None:
    from fleetq.client.jobs import list_jobs, require_job, waiting_queues

    if args.name is not None:
        views = [await require_job(client, args.ns or "default", args.name)]
    else:
        views = await list_jobs(client, args.ns)
    if args.all_clusters and args.output not in ("yaml", "json"):
        snap = await _members(args)
        if snap is None:
            headers, rows = copy_rows(views, args.all_namespaces)
        else:
            from fleetq.cli.member_views import member_copy_rows

            headers, rows = member_copy_rows(views, snap, args.all_namespaces,
                                             orphans=args.name is None)
        if rows:
            print_table(headers, rows)
        else:
            _no_resources(args.ns)
        return
    queues = await waiting_queues(client, views) if args.output == "wide" else {}
    print_jobs(views, output=args.output, all_namespaces=args.all_namespaces,
               namespace=args.ns, single=args.name is not None, queues=queues)


def get_pytorchjobs_http(api: WebApi, args: GetArgs) -> None:
    """``get pytorchjob [NAME] [-o wide|yaml|json]`` read over Temporal's HTTP API with
    the standard library (:mod:`fleetq.client.http_api`), printed as
    :func:`_get_pytorchjobs` prints it; :class:`~fleetq.client.http_api.Unsupported`
    (before anything is printed) when the SDK must read instead."""
    from fleetq.client.http_api import JOB_RESOURCE, get_job, list_jobs, waiting_queues

    if args.name is not None:
        view = get_job(api, args.ns or "default", args.name)
        if view is None:
            raise NotFound(JOB_RESOURCE, args.name)
        views = [view]
    else:
        views = list_jobs(api, args.ns)
    queues = waiting_queues(api, views) if args.output == "wide" else {}
    if args.output in ("yaml", "json"):  # each whole view, validated before printing
        print_jobs([v.view() for v in views], output=args.output,
                   all_namespaces=args.all_namespaces, namespace=args.ns,
                   single=args.name is not None)
        return
    print_job_table(views, wide=args.output == "wide", all_namespaces=args.all_namespaces,
                    namespace=args.ns, queues=queues)


async def _get_pods(client: Client, args: GetArgs) -> None:
    import asyncio

    from fleetq.cli.member_views import member_pod_objects, member_pod_rows
    from fleetq.client.jobs import list_jobs

    views, snap = await asyncio.gather(list_jobs(client, args.ns), _members(args))
    wide = args.output == "wide"
    if snap is None:
        headers, rows = pod_rows(views, args.all_namespaces, wide=wide)
        if args.name is not None:
            rows = [r for r in rows if r[1 if args.all_namespaces else 0] == args.name]
        pods = [dict(p, cluster=v.cluster, namespace=v.namespace) for v in views
                for p in v.pods if args.name is None or p.get("name") == args.name]
    else:
        headers, rows = member_pod_rows(views, snap, args.all_namespaces, wide=wide,
                                        name=args.name)
        pods = member_pod_objects(snap, args.name)
    if args.name is not None and not pods and not rows:
        raise NotFound("pods", args.name)
    if args.output in ("yaml", "json"):
        print_object(as_list(pods), args.output)
    elif rows:
        print_table(headers, rows)
    else:
        _no_resources(args.ns)


async def _get_queues(client: Client, args: GetArgs) -> None:
    from fleetq.client.registry import quota_view

    qns = args.namespace or "kube-queue"
    found = await quota_view(client)
    if qns != "kube-queue" and not args.all_namespaces:
        found = None
    if found is None:
        if args.output in ("yaml", "json"):
            print_object(as_list([]), args.output)
        else:
            _no_resources(qns)
        return
    view, started = found.view, found.created  # the tree's applied time
    if args.name is not None:
        view.queues = [q for q in view.queues if q.name == args.name]
        if not view.queues:
            raise NotFound("queues.scheduling.x-k8s.io", args.name)
    if args.output in ("yaml", "json"):
        print_object(as_list([
            {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "Queue",
             "metadata": _with_creation({"metadata": {"name": q.name,
                                                      "namespace": "kube-queue"}},
                                        started)["metadata"],
             "spec": {"quota": q.node, "queuePolicy": q.policy},
             "status": q.model_dump(mode="json", exclude={"name"})}
            for q in view.queues]), args.output)
        return
    headers, rows = queue_rows(view, started, args.output == "wide")
    print_table(headers, rows)


async def _get_policies(client: Client, args: GetArgs, cluster: bool = False) -> None:
    """``get propagationpolicy`` (registry keys ``ns/name``) or, with ``cluster``, ``get
    clusterpropagationpolicy`` (bare names: cluster-scoped, no NAMESPACE column)."""
    from fleetq.client.registry import PLURALS, get_registry

    reg = await get_registry(client)
    ns, name = (None if cluster else args.ns), args.name
    items = _policy_items(reg.policies if reg else {}, cluster, ns, name)
    if name is not None and not items:
        raise NotFound(PLURALS["ClusterPropagationPolicy" if cluster else "PropagationPolicy"],
                       name)
    kind = "ClusterPropagationPolicy" if cluster else "PropagationPolicy"

    def created(p_ns: str, p_name: str) -> datetime | None:  # when it was first applied
        return reg.created_at(kind, p_name if cluster else f"{p_ns}/{p_name}") if reg else None

    if args.output in ("yaml", "json"):
        docs = [_with_creation(d, created(p_ns, p_name)) for p_ns, p_name, d in items]
        print_object(docs[0] if name is not None else as_list(docs), args.output)
        return
    if not items:
        _no_resources(ns)
        return
    with_ns = args.all_namespaces and not cluster
    print_table(*_policy_rows(items, with_ns, created))


def _policy_items(policies: dict[str, dict[str, Any]], cluster: bool, ns: str | None,
                  name: str | None) -> list[tuple[str, str, dict[str, Any]]]:
    """``(namespace, name, manifest)`` of the registry's policies of one scope (cluster:
    bare keys, else ``ns/name``) selected by ``ns`` (None: all) and ``name``."""
    items = []
    for key, doc in sorted(policies.items()):
        if ("/" not in key) != cluster:
            continue
        p_ns, p_name = ("", key) if cluster else key.split("/", 1)
        if (ns is None or p_ns == ns) and (name is None or p_name == name):
            items.append((p_ns, p_name, doc))
    return items


def _policy_rows(items: list[tuple[str, str, dict[str, Any]]], with_ns: bool,
                 created: Callable[[str, str], datetime | None],
                 ) -> tuple[list[str], list[list[Any]]]:
    headers = ["NAME", "SCHEDULING", "QUEUED", "AGE"]
    rows: list[tuple[str, list[Any]]] = []
    for p_ns, p_name, doc in items:
        spec = doc.get("spec") or {}
        sched = ((spec.get("placement") or {}).get("replicaScheduling") or {}).get(
            "customSchedulingType") or "-"
        queued = bool((spec.get("suspension") or {}).get("scheduling"))
        rows.append((p_ns, [p_name, sched, str(queued).lower(), age(created(p_ns, p_name))]))
    return namespaced(headers, rows, with_ns)


def _with_creation(doc: dict[str, Any], created: datetime | None) -> dict[str, Any]:
    """The manifest as applied, with the ``metadata.creationTimestamp`` the registry
    recorded (as the API server adds it)."""
    if created is None:
        return doc
    meta = dict(doc.get("metadata") or {})
    meta["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    return dict(doc, metadata=meta)


async def _get_cluster_policies(client: Client, args: GetArgs) -> None:
    await _get_policies(client, args, cluster=True)


async def _get_priority_classes(client: Client, args: GetArgs) -> None:
    from fleetq.client.registry import PLURALS, get_registry

    reg = await get_registry(client)
    pcs = sorted((reg.priority_classes if reg else {}).items())
    if args.name is not None:
        pcs = [(n, v) for n, v in pcs if n == args.name]
        if not pcs:
            raise NotFound(PLURALS["PriorityClass"], args.name)
    if args.output in ("yaml", "json"):
        objs = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                 "metadata": {"name": n}, "value": v} for n, v in pcs]
        print_object(objs[0] if args.name is not None else as_list(objs), args.output)
    elif pcs:
        print_table(["NAME", "VALUE"], [[n, v] for n, v in pcs])
    else:
        _no_resources(None)


async def _get_tree(client: Client, args: GetArgs) -> None:
    from fleetq.client.registry import PLURALS, get_registry, quota_view

    reg = await get_registry(client)
    found = await quota_view(client)
    tree = found.tree if found else (reg.tree if reg else None)
    if tree is None or (args.name is not None and tree.split("/", 1)[1] != args.name):
        if args.name is not None:
            raise NotFound(PLURALS["ElasticQuotaTree"], args.name)
        _no_resources(args.namespace or "kube-system")
        return
    t_ns, t_name = tree.split("/", 1)
    if args.output in ("yaml", "json"):
        status = found.view.model_dump(mode="json") if found else {}
        print_object({"apiVersion": "scheduling.sigs.k8s.io/v1beta1",
                      "kind": "ElasticQuotaTree",
                      "metadata": _with_creation({"metadata": {"name": t_name,
                                                               "namespace": t_ns}},
                                                 found.created if found else None)["metadata"],
                      "status": status}, args.output)
        return
    headers = ["NAME", "QUEUES", "ADMITTED", "WAITING", "AGE"]
    if found:
        qv = found.view
        row = [t_name, len(qv.queues), qv.holders, qv.waiting, age(found.created)]
    else:
        row = [t_name, "-", "-", "-", age(reg.created_at("ElasticQuotaTree", tree)
                                          if reg else None)]
    print_table(headers, [row])


def _read_over_http(args: GetArgs) -> bool:
    """Print ``get pytorchjob`` read over HTTP when an HTTP API serves this fleet (True),
    else print nothing (False: read through the SDK)."""
    from fleetq.client.http_api import Unsupported, web_api
    from fleetq.runtime.fleet_info import read_info

    try:
        info = read_info()
        api = web_api(info.http_api if info else None)
        if api is None:
            return False
        try:
            get_pytorchjobs_http(api, args)
        finally:
            api.close()
    except Unsupported as exc:
        import os

        if os.environ.get("FLEETQ_DEBUG"):
            typer.echo(f"fleetq: reading over the SDK, not HTTP: {exc}", err=True)
        return False
    return True


GETTERS = {
    "pytorchjob": _get_pytorchjobs,
    "pod": _get_pods,
    "queue": _get_queues,
    "propagationpolicy": _get_policies,
    "clusterpropagationpolicy": _get_cluster_policies,
    "priorityclass": _get_priority_classes,
    "elasticquotatree": _get_tree,
}


async def show_get(
    client: Client, kind: str, name: str | None, *, namespace: str | None,
    all_namespaces: bool, output: str | None, all_clusters: bool,
    fleet_config: str | None = None,
) -> None:
    """Print what ``fleetq get KIND [NAME]`` prints (``-m CLUSTER`` excluded).

    ``get pytorchjob -M`` and ``get pod`` read the member clusters of ``fleet_config``
    (default: ``FLEETQ_CONFIG`` or the running ``fleetq up``)."""
    getter = GETTERS.get(kind)
    if getter is None:
        raise CliError(f'error: fleetq cannot get "{kind}"')
    await getter(client, GetArgs(name, namespace, all_namespaces, output, all_clusters,
                                 fleet_config))


def show_member(kind: str, name: str | None, cluster: str, namespace: str | None,
                output: str | None) -> None:
    """``get pytorchjob [NAME] -m CLUSTER``: the member cluster's own object(s)."""
    from fleetq.client.members import member_jobs
    from fleetq.member_contract import job_phase
    if kind != "pytorchjob":
        raise CliError("error: -m/--member-cluster is supported for pytorchjob only")
    items = member_jobs(fleet_config_path(), cluster, namespace, name)
    if output in ("yaml", "json"):
        print_object(items[0] if name is not None else as_list(items), output)
        return
    if not items:
        _no_resources(namespace)
        return
    rows = []
    for obj in items:
        meta = obj.get("metadata") or {}
        phase, _ = job_phase(obj)
        rows.append([meta.get("name", "?"), phase, age(meta.get("creationTimestamp"))])
    print_table(["NAME", "STATE", "AGE"], rows)


def register(app: typer.Typer) -> None:
    @app.command()
    @guarded
    def get(
        resource: str = typer.Argument(..., help="pytorchjob | pod | queue | propagationpolicy "
                                                 "| clusterpropagationpolicy "
                                                 "| elasticquotatree | priorityclass | cluster"),
        name: str | None = typer.Argument(None, help="Object name (all when omitted)"),
        namespace: str | None = typer.Option(None, "-n", "--namespace",
                                             help="Namespace (default: default)"),
        all_namespaces: bool = typer.Option(False, "-A", "--all-namespaces",
                                            help="List across all namespaces"),
        output: str | None = typer.Option(None, "-o", "--output", help="wide | yaml | json"),
        all_clusters: bool = typer.Option(False, "-M", "--all-clusters",
                                          help="One row per member copy, read from the member "
                                               "clusters (evicted copies still running, "
                                               "unreachable members)"),
        member_cluster: str | None = typer.Option(
            None, "-m", "--member-cluster", help="Read the object from this member cluster"),
    ) -> None:
        """Display fleet objects (PyTorchJobs, their pods and copies, queues, policies)."""
        kind = resource_kind(resource)
        fmt = check_output(output)
        if kind == "cluster":  # the members themselves: no Temporal needed
            from fleetq.cli.clusters import show_clusters

            show_clusters(name, fmt)
            return
        if member_cluster is not None:
            show_member(kind, name, member_cluster,
                        None if all_namespaces else (namespace or "default"), fmt)
            return

        if kind == "pytorchjob" and not all_clusters and _read_over_http(
                GetArgs(name, namespace, all_namespaces, fmt, all_clusters)):
            return

        async def body() -> None:
            client = await get_client()
            await show_get(client, kind, name, namespace=namespace,
                           all_namespaces=all_namespaces, output=fmt, all_clusters=all_clusters)

        run(body)
