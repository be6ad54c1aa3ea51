"""Running totals of the engine, for ``statistics()``. Owned by the controller thread."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Counters"]


@dataclass(slots=True)
class Counters:
    """Monotonic counts; the controller bumps them, ``statistics()`` copies them."""

    #: Records polled and registered for processing.
    registered: int = 0
    #: Records skipped because the restored offset map marked them finished.
    skipped: int = 0
    succeeded: int = 0
    #: Failed attempts (each failed retry counts again).
    failed: int = 0
    #: Results dropped because their partition was revoked while they ran.
    stale: int = 0
    commits_sent: int = 0
    commits_acknowledged: int = 0
    commit_failures: int = 0
    #: poll_and_produce: outputs handed to the producer, acknowledged, and not delivered.
    outputs_sent: int = 0
    outputs_acknowledged: int = 0
    outputs_failed: int = 0
    #: Times the engine found records waiting with nothing running and nothing due.
    stalls: int = 0
    #: Failure handling: dead letters acknowledged, records given up on without one (Skip or
    #: the SKIP policy), exhaustion policies applied, dead-letter writes that failed.
    dead_lettered: int = 0
    skipped_on_failure: int = 0
    retries_exhausted: int = 0
    dead_letter_failures: int = 0
    #: Handler calls abandoned past Options.processing_timeout, and late results ignored.
    deadline_exceeded: int = 0
    late_results: int = 0
    #: Stall episodes of single partitions (Options.stall_threshold).
    partition_stalls: int = 0
    #: Runs handed to the runner (docs/performance.md#runs), and runs detached while running.
    runs: int = 0
    runs_detached: int = 0
    #: Chains handed to the runner (docs/performance.md#chains).
    chains: int = 0
    #: Bundles handed to the runner (docs/performance.md#bundles).
    bundles: int = 0
