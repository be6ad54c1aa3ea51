"""Handlers on the application's event loop against a real broker: the FastAPI example served by
a real uvicorn on a loopback port, and ``await pc.run()`` ended by cancelling its task."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from engine_support import committed, end_offsets

from parallel_consumer import Lifecycle, Options, ParallelConsumer, PollContext
from parallel_consumer.testing import produce_records
from parallel_consumer.testing.pytest_plugin import KafkaBroker, TopicFactory

pytestmark = pytest.mark.kafka

httpx = pytest.importorskip("httpx", reason="the asgi extra: pip install -e '.[asgi]'")
uvicorn = pytest.importorskip("uvicorn", reason="the asgi extra: pip install -e '.[asgi]'")

PARTITIONS = (0, 1, 2)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_service.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("fastapi_service_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (pydantic resolves the routes' annotations through it)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


async def _until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.kafka_requires("accurate_high_watermark")
def test_the_fastapi_example_consumes_on_the_service_loop_and_commits_on_shutdown(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any]
) -> None:
    # Given 300 records over 30 keys, and the price service (an httpx transport on the
    # service's loop) failing the first post of each key's first record
    records = 300
    name = topic(len(PARTITIONS))
    produce_records(
        kafka.bootstrap_servers,
        name,
        records,
        keys=[f"k{i % 30}" for i in range(records)],
        values=[f"v{i}" for i in range(records)],
    )
    posts: Counter[bytes] = Counter()
    loops: set[int] = set()

    async def prices(request: Any) -> Any:
        loops.add(id(asyncio.get_running_loop()))
        body = request.content
        posts[body] += 1
        await asyncio.sleep(0.001)
        failing = int(body[1:]) < 30 and posts[body] == 1  # each key's first record
        return httpx.Response(503 if failing else 200)

    app = _example().create_app(consumer_config, name, transport=httpx.MockTransport(prices))

    async def main() -> None:
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning")
        )
        serving = asyncio.create_task(server.serve())
        # When uvicorn serves it on a loopback port
        await _until(lambda: server.started, 30, "uvicorn to start")
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await _until(
                lambda: len(posts) == records == sum(posts.values()) - 30,
                60,
                f"{records} records posted, 30 of them twice",
            )
            health = await client.get("/health")
        # Then the consumer answered /health, and every record was posted from this loop
        assert health.status_code == 200, health.text
        assert health.json()["healthy"] is True
        assert loops == {id(asyncio.get_running_loop())}
        # And when the server shuts down, its lifespan closes the consumer
        server.should_exit = True
        await asyncio.wait_for(serving, 30)
        assert app.state.consumer.lifecycle is Lifecycle.CLOSED

    asyncio.run(main())
    # Then every record was retried until posted, and the offsets committed to the end
    assert set(posts) == {f"v{i}".encode() for i in range(records)}
    assert sum(count == 2 for count in posts.values()) == 30
    ends = end_offsets(kafka.bootstrap_servers, name, PARTITIONS)
    assert committed(consumer_config, name, PARTITIONS) == {p: (ends[p], "") for p in PARTITIONS}


@pytest.mark.kafka_requires("accurate_high_watermark")
def test_cancelling_run_on_a_real_broker_lets_calls_finish_and_commits_them(
    kafka: KafkaBroker, topic: TopicFactory, consumer_config: dict[str, Any]
) -> None:
    # Given 2,000 records and handlers of 20 ms, 500 at once, on this loop
    records = 2000
    name = topic(len(PARTITIONS))
    produce_records(kafka.bootstrap_servers, name, records, keys=[f"k{i}" for i in range(records)])
    done: set[tuple[int, int]] = set()

    async def main() -> None:
        options = Options(max_concurrency=500, commit_interval=0.2)
        async with ParallelConsumer(consumer_config, options) as pc:
            pc.subscribe([name])

            @pc.poll
            async def handle(ctx: PollContext) -> None:
                await asyncio.sleep(0.02)
                done.add((ctx.partition, ctx.offset))

            running = asyncio.create_task(pc.run(timeout=10.0))
            await _until(lambda: len(done) >= records // 2, 60, "half the records")
            # When its task is cancelled mid-stream
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            assert pc.lifecycle is Lifecycle.CLOSED

    asyncio.run(main())
    # Then what was committed was processed, and nothing processed past it is lost: every
    # offset below each partition's committed one is in `done`
    # (a partition whose records were not fetched yet when the task was cancelled has nothing
    # to commit: the close commits what finished, which may be on the other partitions only)
    stored = committed(consumer_config, name, PARTITIONS)
    assert any(offset > 0 for offset, _ in stored.values()), stored
    for partition, (offset, _) in stored.items():
        assert {(partition, o) for o in range(offset)} <= done
