"""Options are validated once, with errors that name the setting."""

from __future__ import annotations

from datetime import timedelta

import pytest

from parallel_consumer import CommitMode, ConfigurationError, Options, ProcessingOrder, Retry


def test_defaults_match_the_documented_values():
    options = Options()
    assert options.ordering is ProcessingOrder.KEY
    assert options.max_concurrency == 16
    assert options.batch_size == 1
    assert options.commit_mode is CommitMode.PERIODIC_CONSUMER_ASYNC
    assert options.commit_interval == 5.0
    assert options.retry_delay == 1.0
    assert options.max_metadata_bytes == 4096
    assert options.spill_offset_maps is True
    assert options.offset_map_topic is None
    assert options.buffer_limit == 10_000


def test_durations_accept_seconds_or_timedelta_and_enums_accept_names():
    options = Options(
        commit_interval=timedelta(milliseconds=250), retry_delay=2, ordering="unordered"
    )
    assert options.commit_interval == 0.25
    assert options.retry_delay == 2.0
    assert options.ordering is ProcessingOrder.UNORDERED


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"ordering": "sideways"}, "ordering"),
        ({"commit_mode": "sometimes"}, "commit_mode"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency": True}, "max_concurrency"),
        ({"batch_size": -1}, "batch_size"),
        ({"commit_interval": 0}, "commit_interval"),
        ({"retry_delay": -1}, "retry_delay"),
        ({"retry_delay": float("nan")}, "retry_delay"),
        ({"retry_delay": "1s"}, "retry_delay"),
        ({"retry_delay_provider": 3}, "retry_delay_provider"),
        ({"max_buffered_records": 10, "max_concurrency": 16}, "max_buffered_records"),
        ({"max_metadata_bytes": 0}, "max_metadata_bytes"),
        ({"invalid_metadata_policy": "shrug"}, "invalid_metadata_policy"),
        ({"spill_offset_maps": "yes"}, "spill_offset_maps"),
        ({"offset_map_topic": "my topic"}, "offset_map_topic"),
        ({"offset_map_topic": ""}, "offset_map_topic"),
        ({"offset_map_topic": "x" * 250}, "offset_map_topic"),
    ],
)
def test_invalid_values_name_the_setting(kwargs, name):
    with pytest.raises(ConfigurationError, match=name):
        Options(**kwargs)


def test_options_are_frozen_and_keyword_only():
    options = Options()
    with pytest.raises(AttributeError):
        options.max_concurrency = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        Options(ProcessingOrder.KEY)  # type: ignore[misc]


def test_retry_signal_rejects_negative_delay():
    with pytest.raises(ValueError, match="delay"):
        Retry(delay=-1)
    assert Retry(delay=timedelta(seconds=2)).delay == 2.0
