"""How calls go out: the sizing rules of dispatch, as pure functions of measured call times.

Which ways of handing records to the runner an engine uses (:func:`decide_modes`, once at
start) and, turn by turn, how many records each hand-over carries: chunks of very short calls
(:func:`chunk_size_for`), runs (:func:`run_length`), chains of a lane's records
(:func:`chain_length`) and bundles of different lanes (:func:`bundle_size`). The engine's
dispatch (engine/dispatch.py, engine/runs.py) carries them out. docs/performance.md explains
each; the constants are read at call time, so a test may change them.
"""

from __future__ import annotations

from dataclasses import dataclass

from parallel_consumer.options import ProcessingOrder
from parallel_consumer.work.service import MIN_SERVICE

__all__ = [
    "Modes",
    "bundle_size",
    "chain_length",
    "chunk_size_for",
    "decide_modes",
    "run_length",
]

#: Roughly what handing one call to a worker thread and its result back costs (seconds): two
#: queue hand-overs and two thread wake-ups. Calls much shorter than this go out in chunks.
THREAD_HOP = 60e-6
#: Most calls in one chunk.
MAX_CHUNK = 64
#: Adaptive dispatch (docs/performance.md#adaptive-dispatch). It needs a runner that can take
#: over the rest of a chunk whose current call hangs (``release_stuck``).
ADAPTIVE_DISPATCH = True
#: A chunk a worker has run for longer than this is stuck (a call that hangs, or calls that
#: turned slow): its calls not started yet go to other workers, one by one, and the finished
#: ones are reported (real seconds).
STUCK_AFTER = 0.02
#: How often the controller looks for stuck chunks while any is running (real seconds).
STUCK_CHECK_EVERY = 0.01
#: Runs (docs/performance.md#runs): a partition's records go to one worker as a run, in offset
#: order, while calls are this many times shorter than a thread hop (chunk_size >= this: calls
#: of 30 µs at most, where a run is faster than per-record dispatch even with few partitions).
RUNS = True
RUN_FROM_CHUNK = 2
#: A run whose calls take this long on average, once it ran for STUCK_AFTER, is detached: its
#: calls are no longer short, and must not run one after another while workers are idle.
RUN_SLOW_CALL = THREAD_HOP
#: Chains (docs/performance.md#chains): while calls are not short enough for chunks, a worker
#: that takes a record of a KEY or PARTITION lane also takes the records waiting behind it, up
#: to CHAIN_SECONDS of calls and CHAIN_MOST records, and runs them one after another, each only
#: once the one before succeeded: no round trip through the controller between two records of
#: a lane. CHAIN_SECONDS is as long as a chunk may run before it counts as stuck: lanes share
#: the workers at that grain, and a chain's results normally come in one report. A chain's
#: records hold credit until it reports: chains out together (one per slot of the call limit)
#: hold at most half of max_buffered_records, so that the poller can still fetch.
CHAINS = True
CHAIN_SECONDS = STUCK_AFTER
CHAIN_MOST = 16
#: While chains are on, and there are at most this many lanes per call slot, the next lane to
#: run is the one with the most records waiting (ShardMap.take_longest): a burst then ends
#: when its total work allows, not when its longest lane does. (With many more lanes than
#: workers, each lane is short and the order matters little.)
LONGEST_FIRST_LANES = 8
#: While the next lane is the longest and the lanes are at most the call slots (workers and
#: backlog) plus the backlog once more, at most this many calls (or chains) wait in the
#: runner's backlog for a worker. A hand-out to the backlog picks its lane before a worker is
#: free; with a backlog of a quarter of the workers and as many lanes as slots, every lane not
#: running would sit in the backlog, in the order it was picked, and the engine would never
#: have a choice (W1 KEY-20: 20 lanes, 16 workers and 4 backlog slots ran round-robin, its
#: lanes ending up to 0.3 s apart). Two keep a worker that frees from waiting for the
#: controller.
LONGEST_FIRST_BACKLOG = 2
#: Bundles (docs/performance.md#bundles): while calls are too long for chunks and far more
#: records are ready than the workers can start (at least BUNDLE_READY times as many as a
#: bundle for every call slot), a worker gets a few calls of different lanes at once, run one
#: after another: the controller hands out and settles them with one hop each way instead of
#: one per call, which at a hundred workers and calls of milliseconds is most of its work. A
#: bundle holds at most BUNDLE_MOST calls and BUNDLE_SECONDS of them, so that it does not
#: count as stuck for being a bundle.
BUNDLES = True
BUNDLE_MOST = 4
BUNDLE_SECONDS = 0.75 * STUCK_AFTER
BUNDLE_READY = 2


@dataclass(frozen=True, slots=True)
class Modes:
    """The ways of handing out calls an engine uses, decided once at start."""

    #: Adaptive dispatch: chunks of very short calls.
    chunks: bool
    #: Runs of a partition's records (work/runs.py).
    runs: bool
    #: poll_and_produce runs: a run's records finish once their outputs are acknowledged.
    produce_runs: bool
    #: Chains, and their most records.
    chains: bool
    chain_most: int
    #: Bundles, and their most calls.
    bundles: bool
    bundle_most: int


def decide_modes(
    *,
    can_chunk: bool,
    can_run: bool,
    can_chain: bool,
    ordering: ProcessingOrder,
    batch_size: int,
    buffer_limit: int,
    slots: int,
    deadlines: bool,
    per_call_hooks: bool,
    produces: bool,
    transactional: bool,
    on_produced: bool,
) -> Modes:
    """Which of chunks, runs, chains and bundles the engine uses with a runner that can run
    chunks, runs and chains (``can_*``, from its RunnerFeatures) and has ``slots`` call slots
    (workers and backlog)."""
    # Adaptive dispatch needs a runner that runs chunks; with deadlines every call goes
    # alone (a deadline measures the call, not a wait behind other calls of a chunk).
    chunks = ADAPTIVE_DISPATCH and not deadlines and can_chunk
    # Runs carry no per-call bookkeeping: no per-call hooks. With batch_size > 1 a run calls
    # the handler with batches of its records (work/runs.py); not in PARTITION order, where a
    # batch holds one record, nor with poll_and_produce. With
    # poll_and_produce a run's records finish once their outputs are acknowledged
    # (RunOutputs); not in PARTITION order, where a partition's next record may only run
    # once the outputs of the one before are (a failed output retries its record), nor
    # with on_produced, which sees each output with its call.
    produce_runs = produces and not on_produced and ordering is not ProcessingOrder.PARTITION
    runs = (
        RUNS
        and chunks
        and can_run
        and (produce_runs or (not produces and not transactional))
        and (batch_size == 1 or (ordering is not ProcessingOrder.PARTITION and not produces))
        and not per_call_hooks
    )
    # Chains hand a lane's next records to the worker of the one before; outputs must be
    # acknowledged before a lane's next record runs (a failed output retries its record),
    # so not with poll_and_produce, nor in batches.
    chain_most = min(CHAIN_MOST, buffer_limit // (2 * slots))
    chains = (
        CHAINS
        and chunks
        and can_chain
        and ordering is not ProcessingOrder.UNORDERED
        and batch_size == 1
        and not produces
        and not transactional
        and chain_most > 1
    )
    # Bundles: calls of different lanes behind one another on one worker, as chunks are.
    # They hold credit until they report, as chains do.
    bundle_most = min(BUNDLE_MOST, buffer_limit // (2 * slots))
    bundles = BUNDLES and chunks and bundle_most > 1
    return Modes(chunks, runs, produce_runs, chains, chain_most, bundles, bundle_most)


def chunk_size_for(service: float) -> int:
    """Calls per chunk for calls of ``service`` seconds: one hop for many calls much shorter
    than a thread hop, one by one for longer ones."""
    return max(1, min(MAX_CHUNK, int(THREAD_HOP / max(service, MIN_SERVICE))))


def run_length(service: float | None) -> int:
    """Most records of one run: a quarter of STUCK_AFTER of calls, at least MAX_CHUNK."""
    return max(MAX_CHUNK, int(STUCK_AFTER / 4 / (service or THREAD_HOP)))


def chain_length(service: float | None, chain_most: int) -> int:
    """Records per chain for calls of ``service`` seconds (1: no chain)."""
    if not service:
        return 1
    return max(1, min(chain_most, int(CHAIN_SECONDS / service)))


def bundle_size(
    service: float | None, *, bundle_most: int, ready: int, ready_factor: int, limit: int
) -> int:
    """Calls per bundle in a dispatch pass: 1 (no bundles) unless two or more calls fit in
    BUNDLE_SECONDS and the ``ready`` calls are at least ``ready_factor`` times what full
    bundles for every one of ``limit`` call slots hold. A worker then seldom waits idle while
    its next call sits in another worker's bundle; the last records of a burst go out one by
    one."""
    if not service or service < THREAD_HOP or limit <= 0:
        return 1  # (calls short enough for chunks, or not measured yet)
    most = min(bundle_most, int(BUNDLE_SECONDS / service))
    if most < 2:
        return 1
    return max(1, min(most, ready // (ready_factor * limit)))
