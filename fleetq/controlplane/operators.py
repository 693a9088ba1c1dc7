"""The training-operator and KWOK of a real member: their objects, files and flags.

The operator (``cmd/training-operator.v1`` of v1.9.4) always runs its webhook server and
its cert rotator, and starts its controllers only once the rotator found the Secret
``kubeflow/training-operator-webhook-cert`` and injected its CA into the
ValidatingWebhookConfiguration ``validator.training-operator.kubeflow.org``. We create
both, as its kustomize manifests would, with the PyTorchJob entry of its own webhook
manifest pointing at ``https://127.0.0.1:<port>`` (no kube-proxy here), and play the
kubelet's secret-volume part: the certificate files in the webhook server's cert dir.
KWOK runs upstream's default stages plus one of ours (:data:`FLEETQ_STAGES`): PyTorchJob
pods complete after KWOK's own ``pod-complete.stage.kwok.x-k8s.io/delay`` annotation.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "kubeflow"  # the operator's default (env MY_POD_NAMESPACE)
SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
SERVICE_DNS = f"training-operator.{NAMESPACE}.svc"
CA_NAME = "training-operator-ca"  # pkg/cert: the rotator verifies the CA for this name
PYTORCH_WEBHOOK = "validator.pytorchjob.training-operator.kubeflow.org"
#: pkg/cert's hard-coded certDir: the rotator waits until tls.crt exists there; the
#: webhook server reads ``$TMPDIR/k8s-webhook-server/serving-certs`` (per member).
ROTATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
CERT_SUBDIR = ("k8s-webhook-server", "serving-certs")
KWOK_DELAY_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"

#: Ours: upstream's pod-fast ``pod-complete`` (which completes pods owned by a Job) for
#: pods owned by a PyTorchJob that carry KWOK's delay annotation, with the delay of its
#: ``general`` stage set; without the annotation a pod runs until deleted.
FLEETQ_STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: fleetq-pytorchjob-pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'PyTorchJob'
    - key: '.metadata.annotations["pod-complete.stage.kwok.x-k8s.io/delay"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.annotations["pod-complete.stage.kwok.x-k8s.io/delay"]'
  next:
    event:
      type: Normal
      reason: Completed
      message: Container completed
    statusTemplate: |
      {{ $now := Now }}
      {{ $root := . }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        reason: PodCompleted
        status: "False"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        reason: PodCompleted
        status: "False"
        type: ContainersReady
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""


@dataclass(frozen=True)
class WebhookTls:
    """The webhook's CA (with key, as the rotator keeps it) and serving certificate."""

    ca_pem: str
    ca_key_pem: str
    cert_pem: str
    key_pem: str

    def secret_data(self) -> dict[str, str]:
        raw = {"ca.crt": self.ca_pem, "ca.key": self.ca_key_pem,
               "tls.crt": self.cert_pem, "tls.key": self.key_pem}
        return {k: base64.b64encode(v.encode()).decode() for k, v in raw.items()}


def make_webhook_tls() -> WebhookTls:
    """A CA valid for the rotator's CA name and a server certificate for the operator's
    Service DNS name (what the rotator checks) and 127.0.0.1 (where the API server calls
    it), valid 10 years (beyond the rotator's 90-day look-ahead), RSA as it makes them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def pem_key(key: rsa.RSAPrivateKey) -> str:
        return key.private_bytes(serialization.Encoding.PEM,
                                 serialization.PrivateFormat.TraditionalOpenSSL,
                                 serialization.NoEncryption()).decode()

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=3650)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "training-operator")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=False, content_commitment=False,
                                       key_encipherment=True, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .add_extension(x509.SubjectAlternativeName([x509.DNSName(CA_NAME)]), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVICE_DNS)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName(SERVICE_DNS), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return WebhookTls(ca.public_bytes(serialization.Encoding.PEM).decode(), pem_key(ca_key),
                      cert.public_bytes(serialization.Encoding.PEM).decode(), pem_key(key))


def write_cert_dir(tmpdir: Path, tls: WebhookTls) -> None:
    """The kubelet's secret-volume part: the serving files where the webhook server of an
    operator started with ``TMPDIR=tmpdir`` reads them; and, once per machine, a file at
    the rotator's hard-coded path (it only checks that ``tls.crt`` exists there)."""
    certs = tmpdir.joinpath(*CERT_SUBDIR)
    certs.mkdir(parents=True, exist_ok=True)
    (certs / "tls.crt").write_text(tls.cert_pem)
    (certs / "tls.key").write_text(tls.key_pem)
    os.chmod(certs / "tls.key", 0o600)
    with contextlib.suppress(FileExistsError):
        ROTATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(ROTATOR_CERT_DIR / "tls.crt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(tls.cert_pem)


def webhook_objects(manifest: Path, tls: WebhookTls, port: int) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) to create before the operator starts: its namespace,
    its webhook Secret and its ValidatingWebhookConfiguration (upstream's PyTorchJob
    entry, called at ``https://127.0.0.1:<port><path>``)."""
    entry: dict[str, Any] | None = None
    for doc in yaml.safe_load_all(manifest.read_text()):
        for hook in (doc or {}).get("webhooks") or []:
            if hook.get("name") == PYTORCH_WEBHOOK:
                entry = hook
    if entry is None:
        raise ValueError(f"{manifest}: no webhook {PYTORCH_WEBHOOK}")
    path = entry["clientConfig"]["service"]["path"]
    entry = {**entry, "clientConfig": {
        "url": f"https://127.0.0.1:{port}{path}",
        "caBundle": base64.b64encode(tls.ca_pem.encode()).decode()}}
    return [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": NAMESPACE}}),
        (f"/api/v1/namespaces/{NAMESPACE}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "data": tls.secret_data()}),
        ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIG}, "webhooks": [entry]}),
    ]


def operator_argv(binary: Path, kubeconfig: Path, webhook_port: int,
                  probe_port: int) -> list[str]:
    """The operator's own flags: only PyTorchJob, no gang scheduler, no leader election,
    no metrics listener, probes and webhook on ports of their own."""
    return [str(binary), f"--kubeconfig={kubeconfig}", "--enable-scheme=pytorchjob",
            "--gang-scheduler-name=", "--leader-elect=false", "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            f"--webhook-server-port={webhook_port}", "--zap-devel=false",
            "--zap-log-level=info"]


def kwok_config(stages: list[Path]) -> str:
    """KWOK's config: upstream's default stages as its module ships them, then ours."""
    docs = [p.read_text().strip() for p in stages]
    return "\n---\n".join([*docs, FLEETQ_STAGES.strip()]) + "\n"


def kwok_argv(binary: Path, kubeconfig: Path, config: Path) -> list[str]:
    """KWOK manages every Node of the member (the topology's) and their pods."""
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--config={config}",
            "--manage-all-nodes=true"]
