"""A FastAPI service that consumes Kafka on its own event loop (docs/async-handlers.md).

The lifespan starts the consumer with the service and closes it on shutdown (calls in flight
finish, what finished is committed); the handlers run on the service's loop, so they share its
loop-bound ``httpx.AsyncClient`` and its connection pool; ``/health`` answers from
``pc.health()``. Run it with ``uvicorn examples.fastapi_service:app`` (a broker on
``KAFKA_BOOTSTRAP``, default localhost:9092).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from parallel_consumer import (
    AsyncParallelConsumer,
    Options,
    ParallelConsumer,
    PollContext,
    ProcessingOrder,
)


def create_app(
    consumer_config: dict[str, Any],
    topic: str,
    *,
    prices_url: str = "http://prices.internal",
    transport: httpx.AsyncBaseTransport | None = None,
) -> FastAPI:
    """The service: each record of ``topic`` is posted to the price service at ``prices_url``
    (``transport`` replaces the network in tests)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with (
            httpx.AsyncClient(base_url=prices_url, transport=transport) as client,
            ParallelConsumer(
                consumer_config, Options(ordering=ProcessingOrder.KEY, max_concurrency=500)
            ) as pc,
        ):
            pc.subscribe([topic])

            @pc.poll
            async def quote(ctx: PollContext) -> None:
                # On the service's own loop: the client and its pool are shared with routes.
                response = await client.post("/quotes", content=ctx.value)
                response.raise_for_status()  # an error retries the record

            app.state.consumer = pc
            yield
        # Leaving `async with` closed the consumer: it committed what finished and left the group.

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        consumer: AsyncParallelConsumer = request.app.state.consumer
        report = consumer.health()
        return JSONResponse(
            {"healthy": report.healthy, "lifecycle": report.lifecycle.name, "why": report.reasons},
            status_code=200 if report.healthy else 503,
        )

    return app


app = create_app(
    {
        "bootstrap.servers": os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092"),
        "group.id": "pricing",
    },
    "orders",
)
