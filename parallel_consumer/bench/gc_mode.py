"""The garbage collector's settings for a run: Python's own, or the tuning that
docs/async-handlers.md ("Thousands in flight") recommends for consumers with many calls in
flight.

CPython's cyclic collector runs a young collection every 700 net allocations of container
objects (its default up to 3.13). A consumer with thousands of calls in flight allocates a few
dozen such objects per record (tasks, coroutines, futures, contexts), and a call that lives
longer than a few young collections is promoted to the oldest generation, whose collections
walk every object in the process. ``tuned`` freezes what start-up made (it is never garbage)
and raises the young threshold to :data:`TUNED_YOUNG_THRESHOLD`, so most calls end before
their first collection.

The setting is the process's: it applies to every contestant that runs in this process (``pc``,
``pc-otel``, ``serial``, ``raw``, ``asyncio``, ``pyrallel``, ``share``); not to ``java-pc``, a JVM
of its own, nor to the process runner's workers, which start as fresh interpreters.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["GC_MODES", "TUNED_YOUNG_THRESHOLD", "gc_mode"]

#: ``default``: the interpreter's settings, as a program that never touches ``gc`` runs.
#: ``tuned``: ``gc.freeze()`` after start-up, young threshold :data:`TUNED_YOUNG_THRESHOLD`.
GC_MODES = ("default", "tuned")
TUNED_YOUNG_THRESHOLD = 10_000


@contextmanager
def gc_mode(mode: str) -> Iterator[dict[str, Any]]:
    """Apply ``mode`` for the block; yields what was applied (for the results file). The
    thresholds come back afterwards as they were. What the block froze is unfrozen again,
    unless the caller had frozen objects already: ``gc`` cannot unfreeze some objects and not
    others, and the caller's must stay frozen."""
    if mode not in GC_MODES:
        raise ValueError(f"unknown GC mode {mode!r}; known: {', '.join(GC_MODES)}")
    before = gc.get_threshold()
    unfreeze = False
    try:
        if mode == "tuned":
            gc.collect()  # (what is garbage now should not be frozen with the rest)
            unfreeze = gc.get_freeze_count() == 0
            gc.freeze()
            gc.set_threshold(TUNED_YOUNG_THRESHOLD, *before[1:])
        yield {
            "mode": mode,
            "enabled": gc.isenabled(),
            "thresholds": list(gc.get_threshold()),
            "frozen_objects": gc.get_freeze_count(),
        }
    finally:
        gc.set_threshold(*before)
        if unfreeze:
            gc.unfreeze()
