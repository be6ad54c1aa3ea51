"""The harness's log: cheap to write from many threads, and faithful when read back."""

from __future__ import annotations

import gc
import threading

from parallel_consumer.bench.contestants.base import LogRecorder


def test_log_keeps_the_order_records_were_logged_across_threads() -> None:
    recorder = LogRecorder(expected=6)
    recorder.add([(0, b"a", 0)], 0.2)
    other = threading.Thread(target=recorder.add, args=([(0, b"a", 1), (1, b"b", 0)], 0.4))
    other.start()
    other.join()
    recorder.add_one(0, b"a", 2, 0.1)
    recorder.add([(1, b"b", 1), (1, b"b", 2)], 0.0)
    assert recorder.log == [
        (0, b"a", 0, 0.2),
        (0, b"a", 1, 0.2),
        (1, b"b", 0, 0.2),
        (0, b"a", 2, 0.1),
        (1, b"b", 1, 0.0),
        (1, b"b", 2, 0.0),
    ]
    assert recorder.done.is_set()
    assert recorder.count == 6


def test_done_waits_for_every_record() -> None:
    recorder = LogRecorder(expected=3)
    recorder.add([(0, b"a", 0), (0, b"a", 1)], 0.0)
    recorder.add([], 1.0)
    assert not recorder.done.is_set()
    recorder.add_one(0, b"a", 2, 0.0)
    assert recorder.done.is_set()


def test_many_threads_lose_nothing() -> None:
    per_thread = 5_000
    recorder = LogRecorder(expected=8 * per_thread)

    def log(partition: int) -> None:
        for offset in range(per_thread):
            recorder.add_one(partition, None, offset, 0.0)

    threads = [threading.Thread(target=log, args=(p,)) for p in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log_ = recorder.log
    assert len(log_) == 8 * per_thread
    for partition in range(8):
        assert [o for p, _, o, _ in log_ if p == partition] == list(range(per_thread))


def test_logging_sets_off_no_garbage_collection() -> None:
    """The point of the columns: a tuple kept per record would count towards the collector's
    threshold, and 50,000 of them would set off some 70 collections (every thread paused)."""
    recorder = LogRecorder(expected=100_000)
    recorder.add_one(0, b"k", 0, 0.0)  # this thread's columns exist
    keys = [b"k%d" % k for k in range(100)]
    was_enabled = gc.isenabled()
    gc.enable()
    try:
        gc.collect()
        before = gc.get_stats()[0]["collections"]
        for offset in range(1, 50_001):
            recorder.add([(offset % 8, keys[offset % 100], offset)], 1e-6)
        collections = gc.get_stats()[0]["collections"] - before
    finally:
        if not was_enabled:
            gc.disable()
    assert collections < 10
