"""Commit requests (kafka/commit_requests.py) under any interleaving of commits, client answers
in any order, time-outs, revokes, losses and assignments.

A model client holds the asynchronous requests sent and stores them in any order (a retried
request may be stored after a newer one), answering each as it stores or fails it; requests
given up on are still stored and answered later. Properties:

- every command gets exactly one reply, one answer per offset, in its order;
- no offset of an epoch that is not current when it goes out is ever sent;
- at most one asynchronous request is unanswered at a time;
- once everything is answered and nothing waits, the offset stored for each partition held is
  at least every offset acknowledged to the engine in its current epoch: the group's offset
  never stays behind what the engine counts as acknowledged.
"""

from __future__ import annotations

from concurrent.futures import Future

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from parallel_consumer._events import Commit
from parallel_consumer.kafka.commit_requests import CommitRequests, Decision, Reply, Request
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit

TPS = (("t", 0), ("t", 1))
TIMEOUT = 5.0
tps = st.sampled_from(TPS)


class CommitRequestsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # (kept long enough that no late answer is forgotten within one run)
        self.requests = CommitRequests(given_up_kept=10_000)
        self.now = 0.0
        self.next_epoch = 1
        self.epochs: dict[tuple[str, int], int] = dict.fromkeys(TPS, 1)
        #: The epoch a partition had last, so that commits of a stale epoch can be made.
        self.last_epoch = dict(self.epochs)
        self.next_offset = dict.fromkeys(TPS, 0)
        self.commands: list[Commit] = []
        #: Asynchronous requests the client holds, stored in any order.
        self.in_client: list[Request] = []
        self.stored: dict[tuple[str, int], int] = {}
        self.acknowledged: dict[tuple[tuple[str, int], int], int] = {}

    # -- the poller's part: carry out decisions ------------------------------------------------

    def _offset(self, tp: tuple[str, int]) -> OffsetCommit:
        self.next_offset[tp] += 1
        return OffsetCommit(tp, self.last_epoch[tp], self.next_offset[tp], "")

    def _reply(self, replies: tuple[Reply, ...]) -> None:
        for reply in replies:
            offsets = reply.command.offsets
            assert [a.commit for a in reply.answers] == list(offsets)
            reply.command.reply.set_result(reply.answers)  # raises if answered twice
            for answer in reply.answers:
                if answer.error is None:
                    key = (answer.commit.tp, answer.commit.epoch)
                    self.acknowledged[key] = max(
                        self.acknowledged.get(key, -1), answer.commit.offset
                    )

    def _carry_out(self, decision: Decision) -> None:
        self._reply(decision.replies)
        request = decision.send
        if request is None:
            return
        for commit in request.offsets:
            assert self.epochs.get(commit.tp) == commit.epoch, "an offset of an old epoch sent"
        if request.sync:
            self._store(request)
            self._reply(request.answer(CommitAnswer(c) for c in request.offsets))
            return
        assert self.requests.unanswered is None, "two asynchronous requests unanswered"
        self.in_client.append(request)
        self.requests.on_its_way(request, self.now)

    def _store(self, request: Request) -> None:
        for commit in request.offsets:
            self.stored[commit.tp] = commit.offset

    def _answer(self, request: Request, error: str | None) -> None:
        offsets = {c.tp: c.offset for c in request.offsets}
        answered, _ = self.requests.answered(offsets, self.epochs)
        if answered is not None:
            self._reply(answered.answer(CommitAnswer(c, error) for c in answered.offsets))

    def _commit(self, command: Commit, revoking: frozenset[tuple[str, int]] = frozenset()) -> None:
        self.commands.append(command)
        self._carry_out(self.requests.commit(command, self.epochs, revoking))

    # -- rules ---------------------------------------------------------------------------------

    @rule(which=st.lists(tps, min_size=1, max_size=3), sync=st.booleans())
    def commit(self, which: list[tuple[str, int]], sync: bool) -> None:
        self._commit(Commit(tuple(self._offset(tp) for tp in which), sync=sync, reply=Future()))

    @precondition(lambda self: self.in_client)
    @rule(data=st.data(), stored=st.booleans())
    def client_answers_one(self, data: st.DataObject, stored: bool) -> None:
        request = self.in_client.pop(data.draw(st.integers(0, len(self.in_client) - 1)))
        if stored:
            self._store(request)
        self._answer(request, None if stored else "coordinator moved")

    @rule()
    def poller_turn(self) -> None:
        self._carry_out(self.requests.due(self.now, TIMEOUT, self.epochs))

    @rule()
    def time_passes(self) -> None:
        self.now += TIMEOUT

    @precondition(lambda self: self.epochs)
    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        tp = data.draw(st.sampled_from(sorted(self.epochs)))
        final = Commit((self._offset(tp),), sync=True, reply=Future())
        self._commit(final, revoking=frozenset({tp}))
        del self.epochs[tp]

    @precondition(lambda self: self.epochs)
    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        del self.epochs[data.draw(st.sampled_from(sorted(self.epochs)))]

    @rule(tp=tps)
    def assign(self, tp: tuple[str, int]) -> None:
        if tp not in self.epochs:
            self.next_epoch += 1
            self.epochs[tp] = self.last_epoch[tp] = self.next_epoch

    # -- properties ----------------------------------------------------------------------------

    @invariant()
    def only_queued_commits_are_unanswered(self) -> None:
        unanswered = sum(not c.reply.done() for c in self.commands)
        assert unanswered <= self.requests.queued + len(self.commands_on_their_way())

    def commands_on_their_way(self) -> set[int]:
        pending = self.requests.unanswered
        return set() if pending is None else {id(c) for c in pending.commands}

    def teardown(self) -> None:
        # Drain: the client answers everything it holds (stored, in order), the poller turns.
        for _ in range(1000):
            if self.in_client:
                request = self.in_client.pop(0)
                self._store(request)
                self._answer(request, None)
            elif self.requests.waiting:
                self._carry_out(self.requests.due(self.now, TIMEOUT, self.epochs))
            else:
                break
        assert not self.in_client
        assert not self.requests.waiting
        assert all(c.reply.done() for c in self.commands), "a command never answered"
        for tp, epoch in self.epochs.items():
            acknowledged = self.acknowledged.get((tp, epoch))
            if acknowledged is not None:
                assert self.stored.get(tp, -1) >= acknowledged, (
                    f"{tp} stored {self.stored.get(tp)} behind acknowledged {acknowledged}"
                )


TestCommitRequests = CommitRequestsModel.TestCase
