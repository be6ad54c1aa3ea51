"""The commit-request rules (kafka/commit_requests.py), without a client or threads: one
asynchronous request at a time, queued commits merged, epochs, the revoke's final commit, and
requests given up on whose answer still comes."""

from __future__ import annotations

from concurrent.futures import Future

from parallel_consumer._events import Commit
from parallel_consumer.kafka.commit_requests import (
    NO_ANSWER,
    NOT_ASSIGNED,
    CommitRequests,
    Decision,
    Reply,
    Request,
)
from parallel_consumer.work.commit_tracker import CommitAnswer, OffsetCommit

T0, T1 = ("t", 0), ("t", 1)
TIMEOUT = 5.0


def _commit(*offsets: tuple[tuple[str, int], int, int], sync: bool = False) -> Commit:
    """A Commit command of (tp, epoch, offset) triples."""
    return Commit(
        tuple(OffsetCommit(tp, epoch, offset, "") for tp, epoch, offset in offsets),
        sync=sync,
        reply=Future(),
    )


def _sent(decision: Decision) -> dict[tuple[str, int], int]:
    assert decision.send is not None
    return {c.tp: c.offset for c in decision.send.offsets}


def _replies(replies: tuple[Reply, ...]) -> dict[int, list[tuple[int, str | None]]]:
    """Per command (by id): (offset, error) of each answer."""
    return {id(r.command): [(a.commit.offset, a.error) for a in r.answers] for r in replies}


def _out(requests: CommitRequests, command: Commit, epochs: dict, now: float = 0.0) -> Request:
    """Commit ``command`` with nothing on its way: it goes out asynchronously."""
    decision = requests.commit(command, epochs)
    assert decision.send is not None
    assert not decision.send.sync
    requests.on_its_way(decision.send, now)
    return decision.send


def test_a_commit_goes_out_at_once_when_nothing_is_on_its_way():
    requests = CommitRequests()
    command = _commit((T0, 1, 10), (T1, 1, 4))

    decision = requests.commit(command, {T0: 1, T1: 1})

    assert _sent(decision) == {T0: 10, T1: 4}
    assert decision.send is not None
    assert not decision.send.sync
    assert decision.replies == ()


def test_commits_behind_an_unanswered_request_wait_and_go_out_as_one_with_the_newest_offsets():
    epochs = {T0: 1, T1: 1}
    requests = CommitRequests()
    first = _out(requests, _commit((T0, 1, 10)), epochs)
    older, newer = _commit((T0, 1, 20), (T1, 1, 3)), _commit((T0, 1, 30))

    assert requests.commit(older, epochs) == Decision()
    assert requests.commit(newer, epochs) == Decision()
    assert requests.queued == 2
    assert requests.waiting
    assert requests.due(1.0, TIMEOUT, epochs) == Decision(), "still waiting for the answer"

    answered, again = requests.answered({T0: 10}, epochs)
    assert answered is first
    assert again == ()
    decision = requests.due(1.0, TIMEOUT, epochs)

    assert _sent(decision) == {T0: 30, T1: 3}
    replies = _replies(decision.send.answer(CommitAnswer(c) for c in decision.send.offsets))
    # the superseded t[0]@20 shares the answer of t[0]@30
    assert replies == {id(older): [(20, None), (3, None)], id(newer): [(30, None)]}


def test_an_offset_of_an_earlier_epoch_never_goes_out():
    requests = CommitRequests()
    command = _commit((T0, 1, 10), (T1, 2, 5))

    decision = requests.commit(command, {T0: 2, T1: 2})

    assert _sent(decision) == {T1: 5}
    replies = _replies(decision.send.answer(CommitAnswer(c) for c in decision.send.offsets))
    assert replies == {id(command): [(10, NOT_ASSIGNED), (5, None)]}


def test_a_queued_commit_whose_partitions_all_left_is_answered_at_once():
    requests = CommitRequests()
    _out(requests, _commit((T0, 1, 10)), {T0: 1, T1: 1})
    stale = _commit((T1, 1, 7))

    decision = requests.commit(stale, {T0: 1})

    assert decision.send is None
    assert _replies(decision.replies) == {id(stale): [(7, NOT_ASSIGNED)]}
    assert requests.queued == 0


def test_the_revoke_final_commit_goes_out_alone_while_a_request_is_on_its_way():
    epochs = {T0: 1, T1: 1}
    requests = CommitRequests()
    _out(requests, _commit((T1, 1, 10)), epochs)
    kept = _commit((T1, 1, 20))
    requests.commit(kept, epochs)
    final = _commit((T0, 1, 5), sync=True)

    decision = requests.commit(final, epochs, revoking=frozenset({T0}))

    assert _sent(decision) == {T0: 5}
    assert decision.send is not None
    assert decision.send.sync
    assert requests.queued == 1, "the kept partition's commit stays behind the request"


def test_a_synchronous_commit_of_partitions_kept_waits_like_any_other():
    epochs = {T0: 1}
    requests = CommitRequests()
    _out(requests, _commit((T0, 1, 10)), epochs)

    assert requests.commit(_commit((T0, 1, 12), sync=True), epochs) == Decision()
    assert requests.queued == 1


def test_a_request_without_answer_is_given_up_on_and_what_waited_goes_out():
    epochs = {T0: 1}
    requests = CommitRequests()
    first_command = _commit((T0, 1, 10))
    first = _out(requests, first_command, epochs, now=100.0)
    requests.commit(_commit((T0, 1, 20)), epochs)

    assert requests.due(100.0 + TIMEOUT - 0.1, TIMEOUT, epochs) == Decision()
    decision = requests.due(100.0 + TIMEOUT, TIMEOUT, epochs)

    assert decision.gave_up is first
    assert _replies(decision.replies) == {id(first_command): [(10, NO_ANSWER)]}
    assert _sent(decision) == {T0: 20}
    assert requests.unanswered is None


def test_the_late_answer_of_a_request_given_up_on_sends_the_newest_offset_again():
    epochs = {T0: 1}
    requests = CommitRequests()
    _out(requests, _commit((T0, 1, 10)), epochs)
    requests.commit(_commit((T0, 1, 20)), epochs)
    second = requests.due(TIMEOUT, TIMEOUT, epochs).send
    assert second is not None
    requests.on_its_way(second, TIMEOUT)
    answered, _ = requests.answered({T0: 20}, epochs)
    assert answered is second

    # the client stored the request given up on only now, after t[0]@20
    answered, again = requests.answered({T0: 10}, epochs)

    assert answered is None
    assert [(c.tp, c.offset) for c in again] == [(T0, 20)]
    assert _sent(requests.due(TIMEOUT, TIMEOUT, epochs)) == {T0: 20}


def test_a_late_answer_sends_nothing_again_for_a_partition_of_a_later_epoch():
    requests = CommitRequests()
    _out(requests, _commit((T0, 1, 10)), {T0: 1})
    requests.commit(_commit((T0, 1, 20)), {T0: 1})
    second = requests.due(TIMEOUT, TIMEOUT, {T0: 1}).send
    assert second is not None
    requests.on_its_way(second, TIMEOUT)
    requests.answered({T0: 20}, {T0: 1})

    _, again = requests.answered({T0: 10}, {T0: 2})

    assert again == ()
    assert not requests.waiting


def test_the_echo_of_a_synchronous_commit_changes_nothing():
    epochs = {T0: 1}
    requests = CommitRequests()
    request = _out(requests, _commit((T0, 1, 10)), epochs)

    assert requests.answered({T0: 3}, epochs) == (None, ())
    assert requests.unanswered is request


def test_closing_answers_the_request_on_its_way_and_every_queued_commit_as_failed():
    epochs = {T0: 1, T1: 1}
    requests = CommitRequests()
    first = _commit((T0, 1, 10))
    _out(requests, first, epochs)
    queued = _commit((T0, 1, 20), (T1, 1, 2))
    requests.commit(queued, epochs)

    replies = requests.close("closing")

    assert _replies(replies) == {
        id(first): [(10, "closing")],
        id(queued): [(20, "closing"), (2, "closing")],
    }
    assert not requests.waiting
