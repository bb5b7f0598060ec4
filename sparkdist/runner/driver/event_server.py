"""An event-driven `wire` server: every connection served by one asyncio event loop in
one thread, so that a server with hundreds of peers (the driver's service) holds no
thread per peer.

It speaks exactly what `wire.Server` speaks (asyncio's non-blocking TLS with the job's
certificate, then the same HMAC handshake and MAC'd frames through `wire.Frames`), so
unchanged `wire.connect` clients talk to it. A connection's handler is a coroutine;
`EventChannel.send` may be called from any thread: frames are sealed and written on the
loop, in the order sent, a large one in pieces so that other peers are served meanwhile (and
its MAC computed or checked on a pool thread).
Work that may block (a checkpoint written to storage) goes to `EventServer.offload`, a
small pool of threads whose size does not depend on the number of peers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from sparkdist.protocol import wire

logger = logging.getLogger(__name__)

WRITE_CHUNK = 1 << 20
"""A large frame is written this many bytes at a time, waiting for each to drain."""
OFFLOAD_BYTES = 1 << 20
"""A frame at least this large has its MAC computed or checked off the loop."""
OFFLOAD_THREADS = 4


class EventChannel:
    """One authenticated channel of an `EventServer`: `recv` on the loop, `send` from
    anywhere."""

    def __init__(self, server: EventServer, reader, writer, frames: wire.Frames, peer: str):
        self.peer = peer
        self.bytes_sent = 0
        self._server, self._reader, self._writer = server, reader, writer
        self._frames = frames
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._closed = False
        self._writing = asyncio.ensure_future(self._write_loop())

    async def recv(self) -> Any:
        """The next message (raises EOFError, OSError or `AuthenticationError`)."""
        header = await self._reader.readexactly(wire.Frames.HEADER_BYTES)
        body = await self._reader.readexactly(wire.Frames.body_size(header))
        if len(body) < OFFLOAD_BYTES:
            return self._frames.open(header, body, self.peer)
        return await self._server.offload(self._frames.open, header, body, self.peer)

    def send(self, message: Any) -> None:
        """Queue `message` for the peer (safe from any thread). Raises ConnectionError
        once the channel is closed."""
        if self._closed:
            raise ConnectionError(f"the channel to {self.peer} is closed")
        try:
            self._server.loop.call_soon_threadsafe(self._outbox.put_nowait, message)
        except RuntimeError as exc:  # the loop is closed: the server stopped
            raise ConnectionError(f"the channel to {self.peer} is closed") from exc

    def close(self) -> None:
        """Close once what was sent before is written (from the loop; after the sends
        scheduled so far)."""
        if not self._closed:
            self._closed = True
            self._server.loop.call_soon(self._outbox.put_nowait, None)

    def abort(self) -> None:
        """Drop the connection now (from the loop)."""
        self._closed = True
        self._writing.cancel()
        self._writer.transport.abort()

    async def _write_loop(self) -> None:
        try:
            while (message := await self._outbox.get()) is not None:
                body = wire.Frames.body(message)
                if len(body) < OFFLOAD_BYTES:
                    header = self._frames.header(body)
                else:  # its MAC takes a while (hashlib lets other threads run meanwhile)
                    header = await self._server.offload(self._frames.header, body)
                self._writer.write(header)
                view = memoryview(body)
                for start in range(0, len(view), WRITE_CHUNK):
                    self._writer.write(view[start : start + WRITE_CHUNK])
                    await self._writer.drain()
                await self._writer.drain()
                self.bytes_sent += len(header) + len(body)
        except (ConnectionError, OSError):
            pass
        finally:
            self._closed = True
            self._writer.close()


Handler = Callable[[EventChannel], Awaitable[None]]


class EventServer:
    """Accepts authenticated channels on one event loop thread and runs `handler` (a
    coroutine) for each; the channel is closed when it returns. Connections that fail
    the TLS or the HMAC handshake are dropped before any of their bytes are unpickled.
    """

    def __init__(
        self,
        secret: wire.JobSecret,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "sparkdist-events",
    ):
        self._secret = secret
        self._handler = handler
        self._name = name
        self._channels: set[EventChannel] = set()
        self.connections_max = 0
        """The most connections open at once (after their handshake)."""
        self.loop = asyncio.new_event_loop()
        self._pool = concurrent.futures.ThreadPoolExecutor(OFFLOAD_THREADS, f"{name}-work")
        sock = socket.create_server((host, port), backlog=1024)
        self.address: tuple[str, int] = sock.getsockname()[:2]
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        tls = secret.server_context() if secret.tls else None
        start = asyncio.start_server(
            self._serve,
            sock=sock,
            ssl=tls,
            ssl_handshake_timeout=wire.HANDSHAKE_TIMEOUT_S if tls else None,
        )
        self._listener = asyncio.run_coroutine_threadsafe(start, self.loop).result()

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._channels)

    def offload(self, work: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Run `work(*args)`, which may block, off the loop (from the loop)."""
        return self.loop.run_in_executor(self._pool, work, *args)

    async def _serve(self, reader, writer) -> None:
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            pass  # `close` cancelled it; ending quietly keeps asyncio from logging each one

    async def _serve_connection(self, reader, writer) -> None:
        peer = "{}:{}".format(*(writer.get_extra_info("peername") or ("?", 0))[:2])
        try:
            key = await asyncio.wait_for(self._handshake(reader, writer), wire.HANDSHAKE_TIMEOUT_S)
        except (OSError, EOFError, asyncio.TimeoutError, wire.AuthenticationError) as exc:
            logger.warning("%s: rejected a connection from %s: %s", self._name, peer, exc)
            writer.transport.abort()
            return
        wire.tune(writer.get_extra_info("socket"))
        channel = EventChannel(self, reader, writer, wire.Frames(key, is_client=False), peer)
        self._channels.add(channel)
        self.connections_max = max(self.connections_max, len(self._channels))
        try:
            await self._handler(channel)
        except (EOFError, ConnectionError, OSError):
            pass
        except Exception:
            logger.exception("%s: handler failed for %s", self._name, peer)
        finally:
            self._channels.discard(channel)
            channel.close()

    async def _handshake(self, reader, writer) -> bytes:
        nonce = wire.server_nonce()
        writer.write(nonce)
        answer = await reader.readexactly(wire.ANSWER_BYTES)
        proof, key = wire.server_check(self._secret.hmac_key, nonce, answer)
        writer.write(proof)
        await writer.drain()
        return key

    def close(self) -> None:
        """Stop accepting, drop every connection (their handlers end without seeing a
        loss) and stop the loop."""
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _shutdown(self) -> None:
        self._listener.close()
        for channel in list(self._channels):
            channel.abort()
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
