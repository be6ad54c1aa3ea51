"""ProgressWatch against a reference model of stall episodes, over random observations."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from parallel_consumer.work.progress import ProgressWatch

TP = ("t", 0)


def _observe(watch, now, lowest, committed):
    return watch.observe(TP, epoch=1, lowest=lowest, committed=committed, now=now)


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=20, allow_nan=False),
            st.sampled_from([None, 1, 2, 3]),
            st.sampled_from([None, 0, 1]),
        ),
        max_size=40,
    ),
    st.floats(min_value=0.5, max_value=30, allow_nan=False),
)
def test_reports_match_a_model_of_episodes(steps, threshold):
    # A reference model: the episode starts when the lowest or the committed offset last
    # changed; it is reported at the first observation at least `threshold` later, once.
    watch = ProgressWatch(threshold)
    now = 0.0
    model = None  # (lowest, committed, lowest_since, moved_at, reported)
    for gap, lowest, committed in steps:
        now += gap
        stall = _observe(watch, now, lowest, committed)
        if model is None:
            model = [lowest, committed, now, now, False]
            assert stall is None
            continue
        if lowest != model[0]:
            model[0], model[2], model[4] = lowest, now, False
        if committed != model[1]:
            model[1], model[3], model[4] = committed, now, False
        since = max(model[2], model[3])
        expected = lowest is not None and not model[4] and now - since >= threshold
        assert (stall is not None) == expected
        if expected:
            model[4] = True
            assert stall.offset == lowest
            assert stall.stalled_for == now - since
        assert (TP in watch.stalled()) == model[4]
        wake = watch.wake_at()
        if lowest is None or model[4]:
            assert wake is None
        else:
            assert wake == since + threshold
