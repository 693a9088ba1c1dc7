"""Real member clusters on loopback: etcd, kube-apiserver, and for a member KWOK, the
Kubeflow training-operator, kube-scheduler and our garbage collector.

One :class:`ControlPlane` per cluster of a topology: etcd (plain HTTP, loopback), the API
server (HTTPS, throwaway CA, a static ``system:masters`` token), the build's CRDs, one Node
per topology node; for a member, KWOK plays the kubelets
(:mod:`fleetq.controlplane.operators`), the real training-operator and kube-scheduler run,
and :mod:`fleetq.controlplane.lifecycle` does kube-controller-manager's part. A hub
(``member: false``) runs etcd and the API server. :class:`RealFleet` writes the same
kubeconfig and fleet config the emulator writes. Details: docs/controlplane.md.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import shutil
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetq.controlplane import operators
from fleetq.controlplane.build import Build
from fleetq.controlplane.proxy import Proxy, ProxyLoop, set_faults
from fleetq.emulator.kube_objects import TERMINAL, finished_pod, node_object
from fleetq.emulator.kubeconfig import write_private
from fleetq.emulator.pytorchjob_operator import failed_by_fault
from fleetq.emulator.tls import TlsMaterial, make_material
from fleetq.naming import KF_JOB_NAME
from fleetq.runtime.supervisor import Child, ProcessError, free_port, spawn_child, stop_child
from fleetq.topology import ClusterSpec, Topology, node_names

HOST = "127.0.0.1"
#: What runs on a real member besides etcd and the API server, in start order.
MEMBER_PROCESSES = ("kwok", "training-operator", "kube-scheduler", "lifecycle")
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
Progress = Callable[[str], None]


class ControlPlaneError(ProcessError):
    """A control plane did not come up; the message is one line naming its log."""


@dataclass
class ControlPlane:
    """One real cluster. ``start()`` returns once nodes are Ready and CRDs are served."""

    spec: ClusterSpec
    build: Build
    workdir: Path
    tls: TlsMaterial
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    apiserver_args: tuple[str, ...] = ()
    api_port: int = 0
    etcd_port: int = 0
    children: dict[str, Child] = field(default_factory=dict)
    proxy: Proxy | None = None  # fleetq's way in, with fault injection (RealFleet)
    webhook_tls: operators.WebhookTls | None = None  # made on first start if not given

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.api_port}"

    @property
    def public_url(self) -> str:
        """Where fleetq reaches this member: its fault proxy, else the API server."""
        return f"https://{HOST}:{self.proxy.port}" if self.proxy else self.url

    @property
    def kubeconfig(self) -> Path:
        """Direct to the API server (the member's own scheduler and lifecycle use it)."""
        return self.workdir / "kubeconfig"

    def server_ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.workdir / "tls" / "server.crt"),
                            str(self.workdir / "tls" / "server.key"))
        return ctx

    # -- start / stop

    def start(self, timeout: float = 120.0, attempts: int = 3) -> None:
        """Start everything; a port taken between our probe and the child's bind (another
        process on this machine) costs a retry on fresh ports."""
        deadline = time.monotonic() + timeout
        for attempt in range(attempts):
            try:
                self._start_once(deadline)
                return
            except ControlPlaneError:
                logs = self.workdir / "logs"
                taken = any("address already in use" in f.read_text(errors="replace")
                            for f in logs.glob("*.log"))
                if not taken or attempt == attempts - 1:
                    raise
                self.api_port = self.etcd_port = 0
                for f in logs.glob("*.log"):
                    f.rename(f.with_suffix(f".log.{attempt}"))
                shutil.rmtree(self.workdir / "etcd", ignore_errors=True)

    def _start_once(self, deadline: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.api_port = self.api_port or free_port()
        self.etcd_port = self.etcd_port or free_port()
        self._write_files()
        try:
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            self.install_crds(deadline)
            self.create_nodes()
            if self.spec.member:
                self._start_kwok(deadline)
                self._start_training_operator(deadline)
                self._spawn("kube-scheduler", [
                    str(self.build.binary("kube-scheduler")),
                    f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
                    "--secure-port=0", "--v=1",
                ])
                self._spawn("lifecycle", [
                    sys.executable, "-m", "fleetq.controlplane.lifecycle",
                    "--kubeconfig", str(self.kubeconfig), "--cluster", self.name,
                ])
                self._wait_alive(MEMBER_PROCESSES)
        except BaseException:
            self.stop()
            raise

    def processes(self) -> dict[str, tuple[int, Path]]:
        """name -> (pid, log) of every process of this plane that is alive."""
        return {name: (child.proc.pid, child.log) for name, child in self.children.items()
                if child.alive()}

    def _start_kwok(self, deadline: float) -> None:
        """KWOK with upstream's default stages and ours; returns once it made every node
        of the topology Ready."""
        config = self.workdir / "kwok.yaml"
        config.write_text(operators.kwok_config(self.build.kwok_stages))
        self._spawn("kwok", operators.kwok_argv(self.build.binary("kwok"), self.kubeconfig,
                                                config))
        names = [name for name, _ in node_names(self.spec)]

        def ready() -> bool:
            status, listed = self.request("GET", "/api/v1/nodes", timeout=2.0)
            if status != 200:
                return False
            done = {n["metadata"]["name"] for n in listed.get("items") or []
                    if any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in (n.get("status") or {}).get("conditions") or [])}
            return all(n in done for n in names)

        self._wait("kwok", ready, deadline)

    def _start_training_operator(self, deadline: float) -> None:
        """Its namespace, webhook Secret and configuration, then the operator; returns
        once its readiness probe (certificates in place, webhook server up) answers."""
        self.webhook_tls = self.webhook_tls or operators.make_webhook_tls()
        webhook_port, probe_port = free_port(), free_port()
        for path, obj in operators.webhook_objects(self.build.webhook_manifest,
                                                   self.webhook_tls, webhook_port):
            name = obj["metadata"]["name"]
            code, _ = self.request("GET", f"{path}/{name}")
            if code == 200:
                self._must("DELETE", f"{path}/{name}")  # a restart: fresh ports
            self._must("POST", path, obj)
        tmpdir = self.workdir / "training-operator"
        operators.write_cert_dir(tmpdir, self.webhook_tls)
        argv = operators.operator_argv(self.build.binary("training-operator"),
                                       self.kubeconfig, webhook_port, probe_port)
        child = spawn_child("training-operator", argv, self.workdir / "logs",
                            env={"TMPDIR": str(tmpdir), "MY_POD_NAMESPACE": operators.NAMESPACE,
                                 "KUBECONFIG": str(self.kubeconfig)},
                            death_signal=signal.SIGKILL)
        self.children["training-operator"] = child

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://{HOST}:{probe_port}/readyz",
                                            timeout=2) as resp:
                    return int(resp.status) == 200
            except (OSError, ValueError):
                return False

        self._wait("training-operator", ready, deadline)

    def stop(self, grace: float = 10.0) -> None:
        for name in ("lifecycle", "kube-scheduler", "training-operator", "kwok",
                     "kube-apiserver", "etcd"):
            child = self.children.pop(name, None)
            if child is not None:
                stop_child(child, grace)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> Child:
        # Killed outright if we die: an API server whose etcd went at the same moment
        # can hang in its graceful shutdown.
        child = spawn_child(name, argv, self.workdir / "logs", death_signal=signal.SIGKILL)
        self.children[name] = child
        return child

    def _wait(self, name: str, ready: Callable[[], bool], deadline: float) -> None:
        self.children[name].wait_ready(ready, deadline, what=f"{self.name}: {name}",
                                       error=ControlPlaneError)

    def _wait_alive(self, names: tuple[str, ...]) -> None:
        for name in names:
            child = self.children[name]
            if not child.alive():
                raise ControlPlaneError(f"{self.name}: {name} exited: {child.tail(3)} "
                                        f"(log: {child.log})")

    def _write_files(self) -> None:
        tls = self.workdir / "tls"
        write_private(tls / "server.crt", self.tls.cert_pem + self.tls.ca_pem)
        write_private(tls / "server.key", self.tls.key_pem)
        write_private(tls / "sa.key", _service_account_key())
        write_private(self.workdir / "tokens.csv",
                      f'{self.token},fleetq-admin,fleetq-admin,"system:masters"\n')
        write_private(self.kubeconfig, yaml.safe_dump(
            kubeconfig_doc([self]), sort_keys=False))

    def _start_etcd(self, deadline: float) -> None:
        peer = free_port()
        client = f"http://{HOST}:{self.etcd_port}"
        self._spawn("etcd", [
            str(self.build.binary("etcd")), "--name", self.name,
            "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", f"http://{HOST}:{peer}",
            "--initial-advertise-peer-urls", f"http://{HOST}:{peer}",
            "--initial-cluster", f"{self.name}=http://{HOST}:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ])

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as resp:
                    return bool(json.loads(resp.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        self._wait("etcd", healthy, deadline)

    def _start_apiserver(self, deadline: float) -> None:
        tls = self.workdir / "tls"
        self._spawn("kube-apiserver", [
            str(self.build.binary("kube-apiserver")),
            f"--etcd-servers=http://{HOST}:{self.etcd_port}",
            f"--bind-address={HOST}", f"--advertise-address={HOST}",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={tls / 'server.crt'}",
            f"--tls-private-key-file={tls / 'server.key'}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={tls / 'sa.key'}",
            f"--service-account-signing-key-file={tls / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            # No kube-controller-manager here: nothing creates the default service
            # account, so pods would be refused by the ServiceAccount admission plugin.
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            "--v=0",
            *self.apiserver_args,
        ])

        def ready() -> bool:
            status, _ = self.request("GET", "/readyz", timeout=2.0)
            return status == 200

        self._wait("kube-apiserver", ready, deadline)

    # -- API helpers (plain urllib: the runner needs no client library)

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.tls.ca_pem)
        return ctx

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10.0,
                content_type: str = "application/json") -> tuple[int, Any]:
        """One request; ``(status, decoded body)``, status 0 when nothing answered."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ssl_context()) as r:
                raw = r.read()
                status = int(r.status)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            status = exc.code
        except (OSError, ValueError):
            return 0, None
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def _must(self, method: str, path: str, body: Any = None,
              content_type: str = "application/json") -> Any:
        status, obj = self.request(method, path, body, content_type=content_type)
        if status >= 300 or status == 0:
            msg = obj.get("message") if isinstance(obj, dict) else obj
            raise ControlPlaneError(f"{self.name}: {method} {path}: HTTP {status}: {msg}")
        return obj

    def compact(self) -> int:
        """Compact etcd at its current revision (what the API server does every 5
        minutes): a watch from an older resourceVersion then gets 410 Gone."""
        base = f"http://{HOST}:{self.etcd_port}/v3/kv"
        key = base64.b64encode(b"/").decode()
        head = _post_json(f"{base}/range", {"key": key, "count_only": True})
        revision = int(head["header"]["revision"])
        _post_json(f"{base}/compaction", {"revision": revision, "physical": True})
        return revision

    def install_crds(self, deadline: float) -> None:
        """Create every CRD of the build and wait until each resource is served."""
        served: list[str] = []
        for path in self.build.crds:
            crd = yaml.safe_load(path.read_text())
            status, obj = self.request("POST", CRD_API, crd)
            if status not in (201, 409):
                raise ControlPlaneError(f"{self.name}: CRD {path.name}: HTTP {status}: "
                                        f"{obj.get('message') if isinstance(obj, dict) else obj}")
            group = crd["spec"]["group"]
            version = next(v["name"] for v in crd["spec"]["versions"] if v.get("served"))
            served.append(f"/apis/{group}/{version}/{crd['spec']['names']['plural']}")
        for resource in served:
            while self.request("GET", resource + "?limit=1")[0] != 200:
                if time.monotonic() > deadline:
                    raise ControlPlaneError(f"{self.name}: {resource} not served in time")
                time.sleep(0.1)

    def create_nodes(self) -> None:
        """One Node per topology node, then its status (Ready, capacity) via /status."""
        for index, (name, group) in enumerate(node_names(self.spec)):
            node = node_object(name, group, self.name, index)
            node["metadata"]["labels"]["type"] = "kwok"
            node["metadata"].setdefault("annotations", {})["kwok.x-k8s.io/node"] = "fake"
            status = node.pop("status")
            # KWOK's node-initialize stage makes the node Ready (conditions, nodeInfo)
            # and keeps the capacity and addresses written here
            if self.spec.member:
                status.pop("conditions", None)
                status.pop("nodeInfo", None)
            code, obj = self.request("POST", "/api/v1/nodes", node)
            if code not in (201, 409):
                raise ControlPlaneError(f"{self.name}: node {name}: HTTP {code}: {obj}")
            self._must("PATCH", f"/api/v1/nodes/{name}/status", {"status": status},
                       content_type="application/merge-patch+json")
            # The TaintNodesByCondition admission plugin gave the new node the not-ready
            # taint; with no node lifecycle controller here, lift it ourselves.
            self._must("PATCH", f"/api/v1/nodes/{name}",
                       {"spec": {"taints": node["spec"].get("taints")}},
                       content_type="application/merge-patch+json")


def _post_json(url: str, body: Any) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _service_account_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption()).decode()


def kubeconfig_doc(planes: list[ControlPlane], direct: bool = True) -> dict[str, Any]:
    """One context per control plane (context name = cluster name); ``direct=False``
    points at each plane's fault proxy where it has one."""
    members = [p for p in planes if p.spec.member] or planes
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": p.name, "cluster": {
            "server": p.url if direct else p.public_url,
            "certificate-authority-data": base64.b64encode(p.tls.ca_pem.encode()).decode(),
        }} for p in planes],
        "users": [{"name": f"{p.name}-admin", "user": {"token": p.token}} for p in planes],
        "contexts": [{"name": p.name, "context": {
            "cluster": p.name, "user": f"{p.name}-admin", "namespace": "default"}}
            for p in planes],
        "current-context": members[0].name,
    }


@dataclass
class RealFleet:
    """Control planes for every cluster of ``topology``, with one kubeconfig for all."""

    topology: Topology
    build: Build
    out_dir: Path
    apiserver_args: tuple[str, ...] = ()
    fault_proxy: bool = True
    planes: list[ControlPlane] = field(default_factory=list)
    _proxies: ProxyLoop | None = None

    @property
    def kubeconfig_path(self) -> Path:
        return self.out_dir / "kubeconfig"

    @property
    def fleet_config_path(self) -> Path:
        return self.out_dir / "fleet.yaml"

    def plane(self, name: str) -> ControlPlane:
        for p in self.planes:
            if p.name == name:
                return p
        raise KeyError(name)

    def start(self, progress: Progress | None = None, timeout: float = 180.0) -> RealFleet:
        say = progress or (lambda _msg: None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tls = make_material([HOST, "localhost"])
        try:
            for spec in self.topology.clusters:
                plane = ControlPlane(spec, self.build, self.out_dir / spec.name, tls,
                                     apiserver_args=self.apiserver_args)
                self.planes.append(plane)
                say(f"starting {spec.name}: etcd, kube-apiserver"
                    + (", " + ", ".join(MEMBER_PROCESSES) if spec.member else ""))
                # one after another, from this thread: a child gets its parent-death
                # signal when the *thread* that started it ends
                plane.start(timeout)
            if self.fault_proxy:
                self._proxies = ProxyLoop()
                for plane in self.planes:
                    plane.proxy = self._proxies.add(plane.url, plane.server_ssl_context(),
                                                    plane.ssl_context())
        except BaseException:
            self.stop()
            raise
        write_private(self.kubeconfig_path, yaml.safe_dump(
            kubeconfig_doc(self.planes, direct=False), sort_keys=False))
        write_private(self.fleet_config_path, yaml.safe_dump(self.fleet_config_doc(),
                                                             sort_keys=False))
        return self

    def processes(self) -> dict[str, dict[str, dict[str, Any]]]:
        """cluster -> process name -> {pid, log}: what runs on each plane."""
        return {p.name: {name: {"pid": pid, "log": str(log)}
                         for name, (pid, log) in p.processes().items()}
                for p in self.planes}

    def fleet_config_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kubeconfig": str(self.kubeconfig_path.resolve())}
        hubs = [p for p in self.planes if not p.spec.member]
        if hubs:
            doc["source"] = {"context": hubs[0].name}
        # No Koordinator scheduler runs here: Reservations would never become Available.
        doc["clusters"] = [
            {"name": p.name, "context": p.name, "labels": dict(p.spec.labels),
             "reservation": False}
            for p in self.planes if p.spec.member
        ]
        return doc

    def stop(self) -> None:
        if self._proxies is not None:
            with contextlib.suppress(Exception):
                self._proxies.close()
            self._proxies = None
        for plane in reversed(self.planes):
            with contextlib.suppress(Exception):
                self.set_reachable(plane.name, True)
                plane.stop()
        self.planes.clear()

    def serve_control(self) -> str:
        """Start the fault control endpoint (:mod:`fleetq.controlplane.control`); its URL."""
        from fleetq.controlplane.control import control_app

        if self._proxies is None:
            raise ControlPlaneError("the control endpoint needs the fault proxies")
        return self._proxies.serve(control_app(self))

    # -- faults (the EmulatedFleet's vocabulary)

    def set_reachable(self, cluster: str, reachable: bool) -> None:
        """Freeze (SIGSTOP) or thaw the member's API server: connections are accepted by
        the kernel and never answered, as with a hung or partitioned server."""
        child = self.plane(cluster).children.get("kube-apiserver")
        if child is not None and child.alive():
            child.proc.send_signal(signal.SIGCONT if reachable else signal.SIGSTOP)

    def inject_errors(self, cluster: str, status: int = 500, rate: float = 1.0,
                      retry_after: float | None = None) -> None:
        proxy = self._proxy(cluster)
        set_faults(proxy, error_status=status, error_rate=rate, retry_after=retry_after)

    def set_latency(self, cluster: str, seconds: float) -> None:
        set_faults(self._proxy(cluster), latency=seconds)

    def clear_faults(self, cluster: str) -> None:
        self.set_reachable(cluster, True)
        if self.plane(cluster).proxy is not None:
            self._proxy(cluster).faults.clear()

    def cordon(self, cluster: str, node: str, on: bool = True) -> bool:
        code, _ = self.plane(cluster).request(
            "PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": on or None}},
            content_type="application/merge-patch+json")
        return code == 200

    def fail_job(self, cluster: str, namespace: str, name: str) -> bool:
        """The job runs out of restarts: its Failed condition as the training-operator
        writes it at its backoff limit (through ``/status``), then its pods fail as
        kubelet reports it. (Failing only the pods would make the real operator
        restart every replica whose restartPolicy is not Never.)"""
        plane = self.plane(cluster)
        path = f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}"
        for _ in range(10):  # 409: the operator wrote its status meanwhile
            code, job = plane.request("GET", path)
            if code != 200:
                return False
            code, obj = plane.request("PATCH", f"{path}/status", {
                "metadata": {"resourceVersion": job["metadata"]["resourceVersion"]},
                "status": failed_by_fault(job)}, content_type="application/merge-patch+json")
            if code == 200:
                break
            if code != 409:
                raise ControlPlaneError(f"{cluster}: fail-job {namespace}/{name}: HTTP {code}: "
                                        f"{obj.get('message') if isinstance(obj, dict) else obj}")
        _, pods = plane.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector="
                   f"{KF_JOB_NAME}%3D{name}")
        for pod in (pods or {}).get("items") or []:
            if (pod.get("status") or {}).get("phase") in TERMINAL:
                continue
            status = finished_pod(pod, "Failed", "Error")["status"]
            plane._must("PATCH", f"/api/v1/namespaces/{namespace}/pods/"
                                 f"{pod['metadata']['name']}/status", {"status": status},
                        content_type="application/merge-patch+json")
        return True

    def _proxy(self, cluster: str) -> Proxy:
        proxy = self.plane(cluster).proxy
        if proxy is None:
            raise ControlPlaneError(f"{cluster}: started without a fault proxy")
        return proxy

    def __enter__(self) -> RealFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def process_report(info: dict[str, Any], job: str | None = None,
                   tail: int = 2) -> list[str]:
    """Lines for a user: every real member's upstream processes (pid, log) and, with
    ``job``, the last lines of the training-operator's and KWOK's logs naming it."""
    lines: list[str] = []
    for cluster, procs in sorted((info.get("processes") or {}).items()):
        for name, proc in procs.items():
            lines.append(f"{cluster:<12} {name:<18} pid {proc['pid']:<8} {proc['log']}")
    if job:
        for cluster, procs in sorted((info.get("processes") or {}).items()):
            for name in ("training-operator", "kwok"):
                if name not in procs:
                    continue
                with contextlib.suppress(OSError):
                    text = Path(procs[name]["log"]).read_text(errors="replace")
                    hits = [ln.strip() for ln in text.splitlines() if job in ln]
                    lines += [f"{cluster} {name}: {ln[:200]}" for ln in hits[-tail:]]
    return lines
