"""A consumer whose brokers are unreachable says so, with the real client and no broker at all:
``health()`` turns unhealthy within the bound, one WARNING goes through ``logging`` and
librdkafka writes nothing to stderr (it used to write over a thousand lines a minute)."""

from __future__ import annotations

import logging
import time

from parallel_consumer import ParallelConsumer
from parallel_consumer import health as health_module

#: Nothing listens on port 1: every connection is refused at once.
UNREACHABLE = "127.0.0.1:1"


def test_an_unreachable_broker_makes_health_unhealthy_with_one_warning_and_no_stderr(
    monkeypatch, caplog, capfd
):
    # (the bound scaled down from BROKERS_DOWN_UNHEALTHY_AFTER = 15 s)
    monkeypatch.setattr(health_module, "BROKERS_DOWN_UNHEALTHY_AFTER", 1.0)
    caplog.set_level(logging.DEBUG, logger="parallel_consumer")
    # Given a consumer of a broker nobody runs
    pc = ParallelConsumer({"bootstrap.servers": UNREACHABLE, "group.id": "unreachable"})
    pc.subscribe(["t"])
    pc.poll(lambda ctx: None)
    started = time.monotonic()
    try:
        # When it has tried for longer than the bound
        deadline = started + 10.0
        while pc.health().healthy and time.monotonic() < deadline:
            time.sleep(0.05)
        took = time.monotonic() - started
        # Then health() is unhealthy and says why
        report = pc.health()
        assert not report.healthy, f"still healthy after {took:.1f}s"
        assert any("every Kafka broker down" in reason for reason in report.reasons)
        time.sleep(1.0)  # (librdkafka retries meanwhile: still one warning)
    finally:
        pc.close()
    print(f"unhealthy after {took:.1f}s")
    # And exactly one WARNING (or worse) went through logging, naming the servers
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelno for r in loud] == [logging.WARNING], [r.getMessage() for r in loud]
    assert UNREACHABLE in loud[0].getMessage()
    # And librdkafka's own lines went to the DEBUG logger instead of stderr
    assert any(r.name == "parallel_consumer.librdkafka" for r in caplog.records)
    stderr = capfd.readouterr().err
    assert len(stderr.splitlines()) <= 3, stderr[:2000]
