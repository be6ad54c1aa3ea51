"""The worked example of docs/async-handlers.md: an async handler calling a local HTTP server.

The server is the standard library's; the client is asyncio streams (no third-party HTTP
library needed). A 503 answer fails the call and the record is retried.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from parallel_consumer import Options, PollContext


class Server(ThreadingHTTPServer):
    request_queue_size = 256  # many connections arrive at once
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.failed_once: set[str] = set()
        self.answered: list[str] = []


class Handler(BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:
        server = self.server
        with server.lock:
            server.active += 1
            server.peak = max(server.peak, server.active)
        try:
            threading.Event().wait(0.05)  # 50 ms of "work" on the server
            if self.path.endswith("/7") and self.path not in server.failed_once:
                server.failed_once.add(self.path)
                self.send_response(503)
                self.end_headers()
                return
            body = self.path.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            with server.lock:
                server.answered.append(self.path)
        finally:
            with server.lock:
                server.active -= 1

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    http = Server()
    thread = threading.Thread(target=http.serve_forever, name="test-http", daemon=True)
    thread.start()
    yield http
    http.shutdown()
    http.server_close()
    thread.join(5)


# -- the example, as in docs/async-handlers.md ------------------------------------------------


async def http_get(host: str, port: int, path: str) -> tuple[int, bytes]:
    """A minimal HTTP/1.1 GET over asyncio streams: (status, body)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_an_async_handler_calls_an_http_service_concurrently(harness, cluster, wait_until, server):
    # Given 200 records, each naming a resource of a local HTTP service that takes 50 ms
    cluster.create_topic("t")
    for i in range(200):
        cluster.produce("t", b"%d" % i, key=b"customer-%d" % (i % 20))
    host, port = server.server_address[:2]

    async def handle(ctx: PollContext) -> bytes:
        status, body = await http_get(str(host), int(port), f"/orders/{ctx.value.decode()}")  # type: ignore[union-attr]
        if status != 200:
            raise RuntimeError(f"order service answered {status}")  # retried later
        return body

    # When an async handler with 100 calls in flight fetches them
    pc = harness.make(Options(ordering="key", max_concurrency=100, retry_delay=0.01))
    pc.poll(handle)
    wait_until(lambda: pc.statistics().records_succeeded == 200, timeout=30)
    pc.close()
    # Then every resource was fetched, many at once (one per key at a time), and the one that
    # failed with a 503 was retried
    assert sorted(server.answered) == sorted(f"/orders/{i}" for i in range(200))
    assert server.peak >= 10
    assert server.failed_once == {"/orders/7"}
    assert pc.statistics().records_failed == 1
