"""Outputs of ``poll_and_produce`` calls on their way to the broker, and the transaction gate.

Pure data, owned by the controller thread. A call whose handler returned outputs leaves the
in-flight table (its worker is free) but its records are not finished: they wait here, their
lanes still busy, until the broker acknowledged every output. In the transactional mode the
gate holds outputs back while a transaction commits: an output sent then would land in the
committed transaction without its input's offset.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from parallel_consumer.produce import ProducerRecord
from parallel_consumer.work.inflight import Batch

__all__ = ["Pending", "PendingOutputs", "RunOutputs", "TransactionGate"]


@dataclass(slots=True)
class Pending:
    batch: Batch
    outputs: list[ProducerRecord]
    #: The call failed some records with ``PollContext.fail``: their outcomes once the
    #: outputs are acknowledged (None: every record succeeds then).
    errors: Sequence[BaseException | None] | None = None
    #: A dead letter's write (engine/letters.py), not a handler call's outputs.
    letter: bool = False


class RunOutputs:
    """The outputs of records a run finished (``poll_and_produce``, docs/performance.md#runs):
    ``messages`` (consecutive records of the run, all succeeded) and, per output, the index
    of the message that returned it (``owners``). The records finish once every output is
    acknowledged. In KEY order the keys of ``messages`` are distinct, and each holds its lane
    (ShardMap.hold) from the run's end until then: no other record of the key runs or
    produces meanwhile, so a failed output can still be retried in order."""

    __slots__ = ("epoch", "held", "id", "messages", "outputs", "owners", "tp")

    def __init__(
        self,
        run_id: int,
        tp: tuple[str, int],
        epoch: int,
        messages: list[Any],
        outputs: list[ProducerRecord],
        owners: list[int],
        held: list[object] | None,
    ) -> None:
        self.id = run_id
        self.tp = tp
        self.epoch = epoch
        self.messages = messages
        self.outputs = outputs
        self.owners = owners
        #: The lanes it holds (KEY order), released when its outputs are settled.
        self.held = held

    def __repr__(self) -> str:
        first = self.messages[0].offset() if self.messages else None
        return (
            f"<RunOutputs {self.id} {self.tp[0]}[{self.tp[1]}]@{first}+{len(self.messages)} "
            f"outputs={len(self.outputs)}>"
        )


class PendingOutputs:
    """Calls (and runs) whose outputs are being delivered, and (transactional mode) those whose
    outputs wait for the gate to open."""

    __slots__ = ("delivering", "queued", "queued_runs", "records", "runs")

    def __init__(self) -> None:
        self.delivering: dict[int, Pending] = {}
        self.queued: list[Pending] = []
        #: Runs' outputs being delivered, by run id, and waiting for the gate.
        self.runs: dict[int, RunOutputs] = {}
        self.queued_runs: list[RunOutputs] = []
        #: Input records of all four.
        self.records = 0

    def queue(self, pending: Pending) -> None:
        self.queued.append(pending)
        self.records += len(pending.batch.items)

    def take_queued(self) -> list[Pending]:
        out, self.queued = self.queued, []
        self.records -= sum(len(p.batch.items) for p in out)
        return out

    def queue_run(self, outputs: RunOutputs) -> None:
        self.queued_runs.append(outputs)
        self.records += len(outputs.messages)

    def take_queued_runs(self) -> list[RunOutputs]:
        out, self.queued_runs = self.queued_runs, []
        self.records -= sum(len(r.messages) for r in out)
        return out

    def sending_run(self, outputs: RunOutputs) -> None:
        self.runs[outputs.id] = outputs
        self.records += len(outputs.messages)

    def run_delivered(self, run_id: int) -> RunOutputs | None:
        outputs = self.runs.pop(run_id, None)
        if outputs is not None:
            self.records -= len(outputs.messages)
        return outputs

    @property
    def in_delivery(self) -> bool:
        """Outputs were sent and not all settled yet."""
        return bool(self.delivering or self.runs)

    def sending(self, pending: Pending) -> None:
        self.delivering[pending.batch.id] = pending
        self.records += len(pending.batch.items)

    def delivered(self, batch_id: int) -> Pending | None:
        pending = self.delivering.pop(batch_id, None)
        if pending is not None:
            self.records -= len(pending.batch.items)
        return pending

    def __iter__(self) -> Iterator[Pending]:
        """The calls (not the runs)."""
        yield from self.delivering.values()
        yield from self.queued

    def __bool__(self) -> bool:
        return bool(self.delivering or self.queued or self.runs or self.queued_runs)

    def __repr__(self) -> str:
        return (
            f"<PendingOutputs delivering={len(self.delivering)} queued={len(self.queued)} "
            f"runs={len(self.runs)} queued_runs={len(self.queued_runs)}>"
        )


class TransactionGate:
    """When the open transaction may take outputs, and when it commits.

    A commit is *wanted* (the interval passed, a revoke, the close, a failed delivery); from
    then on outputs are held back. It is *sent* once every output already sent was acknowledged
    (their records are then finished and their offsets in the commit), and it is *answered*
    when the poller committed (or aborted) the transaction and began the next: the gate opens.
    """

    __slots__ = ("committing", "must_abort", "outputs", "wanted")

    def __init__(self) -> None:
        self.wanted = False
        self.committing = False
        #: The open transaction must not commit: an output was not delivered (or not even
        #: sent), or partitions with outputs in it were lost. The next "commit" aborts it.
        self.must_abort = False
        #: Outputs sent in the open transaction.
        self.outputs = 0

    @property
    def open(self) -> bool:
        return not (self.wanted or self.committing)

    def ready(self, delivering: bool) -> bool:
        """A wanted commit may be sent now."""
        return self.wanted and not self.committing and not delivering

    def abort_soon(self) -> None:
        self.must_abort = True
        self.wanted = True

    def sent(self) -> None:
        self.wanted = False
        self.must_abort = False
        self.committing = True

    def skipped(self) -> None:
        """Nothing to commit: the gate opens again."""
        self.wanted = False

    def answered(self) -> None:
        self.committing = False
        self.outputs = 0

    def __repr__(self) -> str:
        state = "committing" if self.committing else "wanted" if self.wanted else "open"
        return f"<TransactionGate {state} outputs={self.outputs}>"
