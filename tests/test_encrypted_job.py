"""What a real job sends between its tasks, ranks and the driver service is unreadable
on the network: a recording TCP proxy on 127.0.0.1 sits between every task, supervisor
and rank and the driver service, and none of the job's markers (closure, result,
checkpoint, a credential) nor its secret appear in the bytes it carried. The same job
with TLS off shows them, so the capture would catch a regression. While the job runs,
a forged certificate, a stale job's certificate and a client without the secret are
refused, and the job still finishes."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import uuid
from pathlib import Path

import pytest

from sparkdist import HorovodRunner
from sparkdist.protocol import wire
from sparkdist.protocol.job_secret import TLS_ENV, JobSecret, new_secret
from sparkdist.runner.driver.launch import barrier as barrier_kind
from sparkdist.runner.driver.service import DriverService

WAIT_S = 60


class RecordingProxy:
    """Forwards every connection to `target` and keeps what crossed, per direction."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.streams: list[bytearray] = []
        self.first_connection = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = self._listener.getsockname()[:2]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, server]
            for source, sink in ((client, server), (server, client)):
                stream = bytearray()
                with self._lock:
                    self.streams.append(stream)
                pump = threading.Thread(target=self._pump, args=(source, sink, stream))
                pump.daemon = True
                pump.start()
            self.first_connection.set()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, stream: bytearray) -> None:
        try:
            while chunk := source.recv(65536):
                stream += chunk
                sink.sendall(chunk)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def captured(self) -> list[bytes]:
        with self._lock:
            return [bytes(stream) for stream in self.streams]

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()


class Capture:
    """Puts a `RecordingProxy` in front of every job's driver service: the address the
    tasks are given is the proxy's."""

    def __init__(self):
        self.proxies: list[RecordingProxy] = []
        self.secrets: list[JobSecret] = []
        self.on_first_connection = None

    def service_class(self):
        capture = self

        class ProxiedService(DriverService):
            def __init__(self, state, secret, bind_host, advertise_host):
                super().__init__(state, secret, bind_host, advertise_host)
                self.real_address = self.address
                self.proxy = RecordingProxy(self.address)
                self.address = self.proxy.address
                capture.proxies.append(self.proxy)
                capture.secrets.append(secret)
                if capture.on_first_connection is not None:
                    threading.Thread(
                        target=capture.on_first_connection, args=(self,), daemon=True
                    ).start()

            def close(self):
                super().close()
                self.proxy.close()

        return ProxiedService


def _found(markers: dict[str, bytes], streams: list[bytes]) -> set[str]:
    return {name for name, marker in markers.items() if any(marker in s for s in streams)}


def _attack(service, secret: JobSecret, outcomes: dict, release: Path) -> None:
    """Once the job talks to its service: three refused strangers, then let it finish."""
    try:
        service.proxy.first_connection.wait(WAIT_S)
        address = service.real_address
        # A client that knows the (public) certificate but not the secret.
        try:
            wire.connect(address, JobSecret(os.urandom(32), secret.pin)).close()
            outcomes["no secret"] = "accepted"
        except wire.AuthenticationError as exc:
            outcomes["no secret"] = str(exc)
        # A client of a previous job (its own secret and pin) reaching this job's service.
        try:
            wire.connect(address, new_secret().for_clients()).close()
            outcomes["stale job"] = "accepted"
        except wire.AuthenticationError as exc:
            outcomes["stale job"] = str(exc)
        # A server with a forged certificate (same name, another key) in the service's
        # stead: a member of the job refuses it before sending anything.
        forged = new_secret()
        listener = socket.create_server(("127.0.0.1", 0))
        heard: list[bytes] = []

        def impersonate():
            conn, _ = listener.accept()
            with forged.server_context().wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(WAIT_S)
                tls.sendall(os.urandom(wire.NONCE_BYTES))
                try:
                    heard.append(tls.recv(1024))
                except (OSError, ssl.SSLError):
                    heard.append(b"")

        impostor = threading.Thread(target=impersonate, daemon=True)
        impostor.start()
        try:
            wire.connect(listener.getsockname()[:2], secret.for_clients()).close()
            outcomes["forged certificate"] = "accepted"
        except wire.AuthenticationError as exc:
            outcomes["forged certificate"] = str(exc)
        impostor.join(WAIT_S)
        listener.close()
        outcomes["forged server heard"] = heard
    finally:
        release.write_text("go")


def _job(tmp_path: Path, markers: dict[str, bytes], release: Path | None):
    closure_marker = markers["closure"].decode()
    result_marker = markers["result"].decode()
    checkpoint_marker = markers["checkpoint"].decode()
    token = markers["token"].decode()
    release_path = None if release is None else str(release)

    def main():
        import os
        import threading

        from sparkdist import checkpoint

        rank = int(os.environ["RANK"])
        if rank == 0 and release_path is not None:  # let the strangers try first
            done = threading.Event()
            for _ in range(600):
                if os.path.exists(release_path) or done.wait(0.1):
                    break
        checkpoint.save({"note": checkpoint_marker, "rank": rank}, 1)
        return {
            "rank": rank,
            "closure": closure_marker,
            "result": result_marker,
            "has_token": os.environ.get("DATABRICKS_TOKEN") == token,
        }

    return main


@pytest.mark.usefixtures("sc")
def test_job_traffic_is_encrypted_and_strangers_are_refused(
    tmp_path, driver_mlflow, monkeypatch, caplog
):
    caplog.set_level(logging.INFO)
    tag = uuid.uuid4().hex
    markers = {
        name: f"{name}-marker-{tag}".encode()
        for name in ("closure", "result", "checkpoint", "token")
    }
    monkeypatch.setenv("DATABRICKS_TOKEN", markers["token"].decode())
    capture = Capture()
    # An np=2 job on a classic session is a barrier launch: its kind makes the service.
    monkeypatch.setattr(barrier_kind, "DriverService", capture.service_class())
    outcomes: dict = {}
    release = tmp_path / "release"
    capture.on_first_connection = lambda service: _attack(
        service, capture.secrets[-1], outcomes, release
    )
    driver_mlflow.start_run()

    # TLS on (the default).
    results = HorovodRunner(np=2).run_all(_job(tmp_path, markers, release))
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["result"] == markers["result"].decode() for r in results)
    # The credential reached rank 0 only.
    assert [r["has_token"] for r in results] == [True, False]
    streams = capture.proxies[-1].captured()
    assert sum(map(len, streams)) > 10_000  # the payload, results and checkpoint went by
    assert _found(markers, streams) == set()
    secret = capture.secrets[-1]
    for form in (secret.hmac_key, secret.hmac_key.hex().encode(), secret.private_key):
        assert not any(form in s for s in streams)
    # The strangers were refused while the job ran, and it finished.
    assert "wrong job secret" in outcomes["no secret"], outcomes
    assert "not this job's" in outcomes["stale job"], outcomes
    assert "not this job's" in outcomes["forged certificate"], outcomes
    assert outcomes["forged server heard"] == [b""]
    assert markers["token"].decode() not in caplog.text

    # TLS off: the same capture reads everything but the secret, which never travels.
    monkeypatch.setenv(TLS_ENV, "0")
    capture.on_first_connection = None
    results = HorovodRunner(np=2).run_all(_job(tmp_path, markers, None))
    assert [r["has_token"] for r in results] == [True, False]
    streams = capture.proxies[-1].captured()
    assert _found(markers, streams) == set(markers)
    secret = capture.secrets[-1]
    assert not secret.tls
    assert not any(secret.hmac_key in s or secret.hmac_key.hex().encode() in s for s in streams)
