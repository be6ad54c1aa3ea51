"""Rebalances: partitions assigned, revoked and lost, in the order each part must let go of a
partition. Owned by the controller thread, which routes the poller's rebalance events here.

A revoke runs inside the poller's callback: the poller waits until the event's ``reply``
resolves, running the commands it receives meanwhile, so the final commit sent here reaches
the broker before the partitions are let go. In the transactional mode a revoke waits for the
transaction that commits its partitions (:meth:`Rebalance.advance_transaction`).
"""

from __future__ import annotations

from parallel_consumer._clock import Clock
from parallel_consumer._events import PartitionsAssigned, PartitionsLost, PartitionsRevoked
from parallel_consumer.engine.commits import Commits
from parallel_consumer.engine.delivery import Delivery
from parallel_consumer.engine.dispatch import Dispatch
from parallel_consumer.engine.ledger import Ledger
from parallel_consumer.engine.runs import RunDispatch
from parallel_consumer.hooks import Hooks
from parallel_consumer.work.item import TopicPartition

__all__ = ["Rebalance"]


class Rebalance:
    """The order of a rebalance across the parts. Holds no state of its own."""

    def __init__(
        self,
        *,
        clock: Clock,
        ledger: Ledger,
        delivery: Delivery,
        dispatch: Dispatch,
        runs: RunDispatch,
        commits: Commits,
        hooks: Hooks,
    ) -> None:
        self._clock = clock
        self._ledger = ledger
        self._delivery = delivery
        self._dispatch = dispatch
        self._runs = runs
        self._commits = commits
        self._hooks = hooks

    def assigned(self, event: PartitionsAssigned) -> None:
        for a in event.assignments:
            self.forget(a.tp)
        self._ledger.assign(event)
        self._hooks.on_rebalance("assigned", [a.tp for a in event.assignments])

    def lost(self, event: PartitionsLost) -> None:
        for tp in event.tps:
            self.forget(tp)
        self._ledger.forget_history(event.tps)
        self._delivery.lost()
        self._hooks.on_rebalance("lost", event.tps)

    def revoked(self, event: PartitionsRevoked) -> None:
        """Settle what finished, send the final commit, let the partitions go, then answer
        the poller. Transactional mode: the revoked partitions' offsets must commit in the
        transaction that holds their outputs, so the revoke waits for that transaction's
        commit (sent once every output sent so far was acknowledged)."""
        delivery = self._delivery
        if delivery.gate is not None:
            delivery.revoke_later(event)
            return
        ledger = self._ledger
        now = self._clock.monotonic()
        final = []
        for tp in event.tps:
            state = ledger.partitions.get(tp)
            if state is not None:
                # What finished of its run, chains and bundles (whose reports would come too
                # late) is settled, so that the final commit covers it; the calls of its
                # chains not started must not start any more.
                self._runs.settle_for_revoke(tp, state)
                self._dispatch.recall_chains(tp)
                self._dispatch.settle_bundled(tp)
                commit = ledger.commits.final_for(state, now)
                if commit is not None:
                    final.append(commit)
            self.forget(tp)
        if final:
            self._commits.send(final, final=True)
        event.reply.set_result(None)
        self._hooks.on_rebalance("revoked", event.tps)

    def drop_unstarted(self) -> None:
        """A close without drain: every record not started yet leaves the engine (released,
        uncommitted) for the partitions' next owner; runs out are taken back."""
        ledger = self._ledger
        ledger.dropping = True
        self._runs.stop()
        for tp in list(ledger.partitions):
            ledger.to_release += ledger.shards.remove_partition(tp)
            self._runs.drop_queued(tp)
        for batch_id in self._dispatch.runner.cancel_queued():
            batch = self._dispatch.take_back(batch_id)
            if batch is not None:
                ledger.to_release += len(batch.items)

    def release_unstarted(self) -> None:
        """A share group paused (each turn: records polled just before the pause arrive after
        it): the records waiting in their lanes or for a retry go back to the broker (released)
        for other members, rather than sit here past their acquisition lock
        (docs/share-groups.md); so do the calls the runner has not started. Those running
        finish."""
        ledger = self._ledger
        if ledger.acks is None:
            return  # (a consumer group keeps them: no lock runs out)
        for retry in ledger.retries.pop_due(float("inf")):
            ledger.release(retry)
        while (waiting := ledger.shards.take({})) is not None:
            ledger.release(waiting)
        for batch_id in self._dispatch.runner.cancel_queued():
            batch = self._dispatch.take_back(batch_id)
            for queued in batch.items if batch is not None else ():
                ledger.release(queued)

    def forget(self, tp: TopicPartition) -> None:
        """``tp`` is no longer ours: each part lets go of it, in this order."""
        ledger = self._ledger
        if tp in ledger.partitions:
            # (its chains' calls not started never start: the partition is no longer ours)
            self._dispatch.recall_chains(tp)
        state = ledger.partitions.pop(tp, None)
        if state is None:
            return
        self._runs.forget(tp)
        letters = self._delivery.letters
        if letters is not None:
            letters.forget(tp)
        ledger.forget(tp, state, [p.batch for p in self._delivery.pending])

    def advance_transaction(self, now: float) -> None:
        """Transactional mode: commit (or abort) when delivery says so, finish the revokes
        that waited for it, and let held-back outputs go once the gate is open again."""
        delivery = self._delivery
        step = delivery.transaction_step(now)
        if step is not None:
            if step.abort:
                self._commits.abort()
            elif step.commits is not None:
                self._commits.send(step.commits, final=step.final)
            ledger = self._ledger
            for event, epochs in step.revokes:
                # The commit of their partitions was sent before this answer: the poller runs
                # it inside its revoke callback, while they are still ours. (A partition
                # assigned again since, after the poller gave up waiting, is not forgotten.)
                for tp in event.tps:
                    state = ledger.partitions.get(tp)
                    if state is not None and state.epoch == epochs.get(tp):
                        self.forget(tp)
                ledger.forget_history(event.tps)
                event.reply.set_result(None)
                self._hooks.on_rebalance("revoked", event.tps)
        delivery.send_held()
