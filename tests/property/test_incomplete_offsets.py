"""IncompleteOffsets behaves like a sorted set under the engine's access pattern."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_consumer.work.partitions import IncompleteOffsets

# Operations: ("add", gap) appends above the last offset; ("discard", pick) removes a member or
# a random offset; ("probe", limit) checks lowest/below/sorted against the reference set.
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(min_value=1, max_value=5)),
        st.tuples(st.just("discard"), st.integers(min_value=0, max_value=10_000)),
        st.tuples(st.just("probe"), st.integers(min_value=0, max_value=10_000)),
    ),
    max_size=300,
)


@settings(max_examples=300)
@given(start=st.lists(st.integers(0, 50), unique=True), ops=operations)
def test_matches_a_sorted_set(start: list[int], ops: list[tuple[str, int]]) -> None:
    start.sort()
    subject = IncompleteOffsets(start)
    reference = set(start)
    last = start[-1] if start else -1
    for op, value in ops:
        if op == "add":
            last += value
            subject.add(last)
            reference.add(last)
        elif op == "discard":
            members = sorted(reference)
            target = members[value % len(members)] if members and value % 2 else value
            subject.discard(target)
            reference.discard(target)
        else:
            assert subject.lowest() == (min(reference) if reference else None)
            assert subject.below(value) == sorted(o for o in reference if o < value)
        assert len(subject) == len(reference)
    assert subject.sorted() == sorted(reference)


def test_order_is_rebuilt_when_a_stuck_front_leaves_many_finished_offsets() -> None:
    subject = IncompleteOffsets([0])
    for offset in range(1, 50_000):
        subject.add(offset)
        subject.discard(offset)
    assert subject.lowest() == 0
    assert len(subject._order) < 10_000  # bounded memory behind a stuck record
