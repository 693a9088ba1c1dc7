"""A throwaway certificate authority for the emulator's API ports.

``kubectl`` (client-go) never sends a bearer token to a plain-HTTP server, so the
emulator serves HTTPS with a per-emulator CA whose certificate goes into the kubeconfig
(``certificate-authority-data``). The material is kept in the state file so a restarted
emulator stays trusted by clients that loaded the old kubeconfig. Needs the
``cryptography`` package; without it the emulator falls back to plain HTTP (the Python
client still works, kubectl then cannot authenticate).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from fleetq.emulator.kubeconfig import write_private


@dataclass(frozen=True)
class TlsMaterial:
    ca_pem: str
    cert_pem: str
    key_pem: str

    def to_dict(self) -> dict[str, str]:
        return {"ca": self.ca_pem, "cert": self.cert_pem, "key": self.key_pem}

    @staticmethod
    def from_dict(d: dict[str, str]) -> TlsMaterial:
        return TlsMaterial(d["ca"], d["cert"], d["key"])


def available() -> bool:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False
    return True


def make_material(hosts: list[str]) -> TlsMaterial:
    """A CA and a server certificate for ``hosts`` (IPs or DNS names), valid 10 years."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=3650)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetq-emulator-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in dict.fromkeys([*hosts, "127.0.0.1", "localhost"]):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetq-emulator")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return TlsMaterial(
        ca.public_bytes(pem).decode(),
        cert.public_bytes(pem).decode(),
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()).decode(),
    )


def server_context(material: TlsMaterial, directory: Path) -> ssl.SSLContext:
    cert = directory / "tls" / "server.crt"
    key = directory / "tls" / "server.key"
    write_private(cert, material.cert_pem + material.ca_pem)
    write_private(key, material.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx
