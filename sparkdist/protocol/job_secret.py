"""A job's secret: the HMAC key that proves membership, and the per-job TLS identity
that hides what the job's channels carry.

The driver makes one `JobSecret` per job (`new_secret`): 32 random bytes for the HMAC
handshake, and an ephemeral EC P-256 key with a self-signed certificate. Every sparkdist
server of the job (driver service, task agents, gang, relay, tune service) presents that
certificate; every client pins its SHA-256 fingerprint and refuses any other before it
sends a byte of its own. The whole object travels inside the Spark task, as the secret
always did; processes that only connect (supervisors, ranks, mpirun's rsh agent, tune
workers) get `for_clients()`, which holds no private key, through their environment
(`to_text`), never on a command line.

TLS is on by default. `SPARKDIST_TLS=0` in the driver's environment turns it off for
the jobs that process starts afterwards (the channels keep their HMAC authentication);
it exists to measure what encryption costs.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import os
import ssl
import tempfile
from dataclasses import dataclass, field, replace

from sparkdist import job_environment

TLS_ENV = job_environment.TLS
"""Set to 0 (or off/false/no) on the driver to start jobs without TLS."""
_OFF = ("0", "off", "false", "no")


@dataclass(frozen=True)
class JobSecret:
    """What a job's processes need to open (or serve) its channels.

    Only the fingerprint is shown by `repr`; the key material never is.
    """

    hmac_key: bytes = field(repr=False)
    pin: bytes | None = None
    """SHA-256 of the job's certificate (DER); None when the job runs without TLS."""
    certificate: bytes | None = field(default=None, repr=False)
    """PEM; held by the processes that serve channels (driver, Spark tasks)."""
    private_key: bytes | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.pin is not None

    @property
    def can_serve(self) -> bool:
        return not self.tls or self.private_key is not None

    def for_clients(self) -> JobSecret:
        """The same secret without the private key: enough to connect, not to serve."""
        return replace(self, certificate=None, private_key=None)

    def to_text(self) -> str:
        """The client form, for a child process's environment."""
        text = self.hmac_key.hex()
        return f"{text}:{self.pin.hex()}" if self.pin is not None else text

    @classmethod
    def from_text(cls, text: str) -> JobSecret:
        key, _, pin = text.partition(":")
        return cls(bytes.fromhex(key), bytes.fromhex(pin) if pin else None)

    def run_tag(self, job_id: str, payload: bytes) -> bytes:
        """A warm world's run payload signed with that run's own key: an HMAC key made
        from this (the world's) key and the run's job id, so no run key ever travels,
        and a payload signed for another run does not verify as this one's."""
        run_key = hmac.new(self.hmac_key, b"sparkdist-run:" + job_id.encode(), hashlib.sha256)
        return hmac.new(run_key.digest(), payload, hashlib.sha256).digest()

    def verify_run(self, job_id: str, payload: bytes, tag: bytes) -> bool:
        """Whether `tag` is `run_tag(job_id, payload)` (compared in constant time)."""
        return hmac.compare_digest(self.run_tag(job_id, payload), tag)

    def server_context(self) -> ssl.SSLContext:
        if self.certificate is None or self.private_key is None:
            raise ValueError("this copy of the job secret has no private key: it cannot serve")
        return _server_context(self.certificate, self.private_key)


def tls_enabled(env: dict[str, str] | None = None) -> bool:
    """Whether new jobs get TLS (see `TLS_ENV`)."""
    value = (os.environ if env is None else env).get(TLS_ENV, "1")
    return value.strip().lower() not in _OFF


def new_secret(tls: bool | None = None) -> JobSecret:
    """A fresh per-job secret; with TLS (the default, see `TLS_ENV`) a fresh key pair."""
    hmac_key = os.urandom(32)
    if not (tls_enabled() if tls is None else tls):
        return JobSecret(hmac_key)
    certificate, private_key = _self_signed()
    der = ssl.PEM_cert_to_DER_cert(certificate.decode("ascii"))
    return JobSecret(hmac_key, hashlib.sha256(der).digest(), certificate, private_key)


def _self_signed() -> tuple[bytes, bytes]:
    """An EC P-256 key and a certificate for it (PEM); names do not matter, the pin does."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sparkdist job")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .sign(key, hashes.SHA256())
    )
    return (
        certificate.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


@functools.lru_cache(maxsize=8)
def _server_context(certificate: bytes, private_key: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # No session tickets: after the handshake each side only reads what it reads and
    # writes what it writes, so one thread may send while another receives.
    context.num_tickets = 0
    _load_chain(context, certificate + private_key)
    return context


def _load_chain(context: ssl.SSLContext, pem: bytes) -> None:
    """`ssl` loads keys only from a path: give it one that never reaches a disk."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("sparkdist-job-key", os.MFD_CLOEXEC)
        try:
            os.write(fd, pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="sparkdist-key-") as directory:  # mode 0700
        path = os.path.join(directory, "key.pem")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(pem)
        context.load_cert_chain(path)


@functools.lru_cache(maxsize=1)
def client_context() -> ssl.SSLContext:
    """Encrypts without checking names or CAs: the peer is checked by its pin instead
    (`wire.connect`), before the client sends anything."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
