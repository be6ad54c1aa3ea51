"""Unit tests of the offset-map codec: byte layouts from the Java library and malformed input."""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
import zstandard
from bitarray import bitarray
from sortedcontainers import SortedList

from parallel_consumer.errors import ParallelConsumerError
from parallel_consumer.offsets import (
    MAX_DECODED_INCOMPLETES,
    KafkaStreamsMetadataError,
    OffsetDecodeError,
    OffsetEncoding,
    decode_offset_map,
    encode_offset_map,
    read_committed_metadata,
)
from parallel_consumer.offsets._ranges import range_encoder
from parallel_consumer.offsets.bitset import decode_bitset
from parallel_consumer.offsets.run_length import decode_run_length

DECODABLE = [e for e in OffsetEncoding if e.decodable]


def b64(payload: bytes) -> str:
    return base64.b64encode(payload).decode()


def payload(metadata: str) -> bytes:
    return base64.b64decode(metadata)


def run_lengths(length: int, incompletes: list[int], version: int = 2) -> list[int] | None:
    """The run lengths the encoder writes for a range starting at 0, unpacked again."""
    data = range_encoder(0, length, length, incompletes).run_length(version)
    if data is None:
        return None
    width = 2 if version == 1 else 4
    return [int.from_bytes(data[i : i + width], "big") for i in range(0, len(data), width)]


# --- The worked example of the reference notes (base 100, H 105, incompletes {100, 103}) ---


def test_worked_example_picks_bitset_v1() -> None:
    encoded = encode_offset_map(100, 105, [100, 103])

    assert encoded is not None
    assert encoded.metadata == "bAAGNgA="
    assert encoded.encoding is OffsetEncoding.BIT_SET
    assert encoded.size == len("bAAGNgA=")


@pytest.mark.parametrize(
    ("encoding", "hex_bytes", "metadata"),
    [
        (OffsetEncoding.BIT_SET, "6C 00 06 36 00", "bAAGNgA="),
        (OffsetEncoding.BIT_SET_V2, "6F 00 00 00 06 36 00", "bwAAAAY2AA=="),
        (OffsetEncoding.RUN_LENGTH, "6E 00 01 00 02 00 01 00 02", "bgABAAIAAQAC"),
        (
            OffsetEncoding.RUN_LENGTH_V2,
            "65 00000001 00000002 00000001 00000002",
            b64(bytes.fromhex("65 00000001 00000002 00000001 00000002")),
        ),
    ],
)
def test_worked_example_forced_matches_the_notes(
    encoding: OffsetEncoding, hex_bytes: str, metadata: str
) -> None:
    encoded = encode_offset_map(100, 105, [100, 103], force=encoding)

    assert encoded is not None
    assert payload(encoded.metadata) == bytes.fromhex(hex_bytes)
    assert encoded.metadata == metadata


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "read-back"])
@pytest.mark.parametrize("encoding", DECODABLE, ids=lambda e: e.name)
def test_worked_example_decodes_with_every_encoding(encoding: OffsetEncoding, exact: bool) -> None:
    encoded = encode_offset_map(100, 105, [100, 103], force=encoding)
    assert encoded is not None

    decoded = decode_offset_map(100, encoded.metadata, exact=exact)

    if encoding is OffsetEncoding.RUN_LENGTH_V2 and not exact:
        # Its first two runs [1, 2] end on a base64 boundary and are a map of their own: a
        # reader that allows for stray trailing characters cannot tell, and keeps to them.
        assert (decoded.incomplete, decoded.highest_seen) == ((100,), 102)
    else:
        assert decoded.incomplete == (100, 103)
        assert decoded.highest_seen == 105
    assert decoded.base == 100
    assert decoded.encoding is encoding


def test_compressed_payload_is_magic_plus_zstd_frame_of_plain_data() -> None:
    encoded = encode_offset_map(100, 105, [100, 103], force=OffsetEncoding.RUN_LENGTH_COMPRESSED)
    assert encoded is not None

    raw = payload(encoded.metadata)

    assert raw[0] == 0x4A
    assert zstandard.ZstdDecompressor().decompressobj().decompress(raw[1:]) == bytes.fromhex(
        "0001000200010002"
    )


# --- Java's BitSetEncodingTest and RunLengthEncoderTest ---

JAVA_PATTERN = [0, 4, 6, 7, 8, 10]  # incompletes over relative offsets 0..10


def test_java_bitset_encoding_test() -> None:
    data = range_encoder(0, 11, 11, JAVA_PATTERN).bitset(1)
    assert data is not None

    bits = bitarray(endian="little")
    bits.frombytes(data[2:])
    assert set(bits.search(1)) == {1, 2, 3, 5, 9}
    assert decode_bitset(data, 1, 0, max_incompletes=100) == (10, tuple(JAVA_PATTERN))


def test_java_run_length_encoder_test() -> None:
    assert run_lengths(11, JAVA_PATTERN) == [1, 3, 1, 1, 3, 1, 1]
    data = range_encoder(0, 11, 11, JAVA_PATTERN).run_length(1)
    assert data == bytes.fromhex("0001 0003 0001 0001 0003 0001 0001")
    assert decode_run_length(data, 1, 0, max_incompletes=100) == (10, tuple(JAVA_PATTERN))


@pytest.mark.parametrize(
    ("length", "incompletes", "runs"),
    [
        (0, [], [0]),
        (5, [], [0, 5]),
        (5, [0, 1, 2, 3, 4], [5]),
        (5, [2], [0, 2, 1, 2]),
        (5, [4], [0, 4, 1]),
        (5, [0], [1, 4]),
    ],
)
def test_run_lengths_start_incomplete_and_end_with_the_tail(
    length: int, incompletes: list[int], runs: list[int]
) -> None:
    assert run_lengths(length, incompletes, 1) == runs
    assert run_lengths(length, incompletes, 2) == runs


@pytest.mark.parametrize(
    ("length", "incompletes", "runs"),
    [
        (40_000, [0, 39_999], [1, 39_998, 1]),
        (3 * 2**30, [0, 1, 2**30, 2**31 + 5], [2, 2**30 - 2, 1, 2**30 + 4, 1, 2**30 - 6]),
    ],
)
def test_runs_above_the_v1_limit_are_v2_only(
    length: int, incompletes: list[int], runs: list[int]
) -> None:
    # The second case is longer than any bitset, so it also exercises the 64-bit field path.
    assert run_lengths(length, incompletes, 1) is None
    assert run_lengths(length, incompletes, 2) == runs


# --- Overflow of the v1 layouts ---


def test_range_over_32767_drops_bitset_v1() -> None:
    # length = H - base + 1
    assert encode_offset_map(0, 32_766, [0], force=OffsetEncoding.BIT_SET) is not None
    assert encode_offset_map(0, 32_767, [0], force=OffsetEncoding.BIT_SET) is None
    assert encode_offset_map(0, 32_767, [0], force=OffsetEncoding.BIT_SET_V2) is not None


def test_run_over_32767_drops_run_length_v1() -> None:
    # incomplete 0, then a complete run of 32767 (fits) or 32768 (overflows)
    assert encode_offset_map(0, 32_767, [0], force=OffsetEncoding.RUN_LENGTH) is not None
    assert encode_offset_map(0, 32_768, [0], force=OffsetEncoding.RUN_LENGTH) is None
    assert encode_offset_map(0, 32_768, [0], force=OffsetEncoding.RUN_LENGTH_V2) is not None


def test_auto_choice_survives_v1_overflow() -> None:
    encoded = encode_offset_map(0, 100_000, [0, 50_000])

    assert encoded is not None
    assert encoded.encoding in {
        OffsetEncoding.RUN_LENGTH_V2,
        OffsetEncoding.RUN_LENGTH_V2_COMPRESSED,
        OffsetEncoding.BIT_SET_V2_COMPRESSED,
    }
    assert decode_offset_map(0, encoded.metadata).incomplete == (0, 50_000)


def test_nothing_can_encode_a_range_beyond_int32() -> None:
    assert encode_offset_map(0, 2**32, [0]) is None


# --- Java's H adjustments and the incomplete filter ---


def test_highest_minus_one_becomes_base() -> None:
    encoded = encode_offset_map(7, -1, [7], force=OffsetEncoding.BIT_SET)
    assert encoded is not None
    # length 1, and offset 7 is not below H (-1), so Java marks it complete
    assert payload(encoded.metadata) == bytes.fromhex("6C 0001 01 00")


def test_highest_far_below_base_gives_an_empty_range() -> None:
    encoded = encode_offset_map(7, 3, [7], force=OffsetEncoding.BIT_SET)
    assert encoded is not None
    assert payload(encoded.metadata) == bytes.fromhex("6C 0000 00")
    assert decode_offset_map(7, encoded.metadata).highest_seen == 6


def test_incompletes_at_or_above_highest_succeeded_are_not_encoded() -> None:
    encoded = encode_offset_map(10, 14, [10, 12, 14, 15, 99])
    assert encoded is not None

    decoded = decode_offset_map(10, encoded.metadata)

    assert decoded.incomplete == (10, 12)
    assert decoded.highest_seen == 14


def test_incompletes_below_base_are_ignored() -> None:
    encoded = encode_offset_map(10, 14, [3, 10, 12])
    assert encoded is not None
    assert decode_offset_map(10, encoded.metadata).incomplete == (10, 12)


# --- Any iterable of offsets: order and duplicates do not matter ---

WORKED = [100, 103]


def _generator() -> Iterator[int]:
    yield 103
    yield 100


@pytest.mark.parametrize(
    "incompletes",
    [
        pytest.param({100, 103}, id="set"),
        pytest.param(frozenset({103, 100}), id="frozenset"),
        pytest.param([103, 100], id="unsorted-list"),
        pytest.param((103, 100), id="unsorted-tuple"),
        pytest.param(deque([103, 100]), id="unsorted-deque"),
        pytest.param(SortedList([100, 103]), id="sorted-list"),
        pytest.param({100: "a", 103: "b"}.keys(), id="dict-keys"),
        pytest.param([103, 100, 103, 100], id="duplicates"),  # duplicates count once
        pytest.param(SortedList([100, 100, 103]), id="sorted-list-with-duplicates"),
        # offsets outside the range are ignored wherever they are
        pytest.param([103, 100, 200, 7], id="unsorted-with-offsets-outside"),
    ],
)
def test_any_iterable_of_offsets_encodes_like_the_sorted_list(incompletes: Any) -> None:
    # When the worked example's incomplete set is given in another container or order
    encoded = encode_offset_map(100, 105, incompletes)

    # Then the map is exactly the one of the sorted list
    assert encoded is not None
    assert encoded.metadata == "bAAGNgA="


def test_a_generator_of_offsets_encodes_like_the_sorted_list() -> None:
    encoded = encode_offset_map(100, 105, _generator())
    assert encoded is not None
    assert encoded.metadata == "bAAGNgA="


@pytest.mark.parametrize("force", [None, *DECODABLE], ids=lambda e: getattr(e, "name", "auto"))
def test_unsorted_offsets_are_never_dropped(force: OffsetEncoding | None) -> None:
    # Given an unsorted list whose out-of-order offset 3 would be lost by a binary search
    encoded = encode_offset_map(0, 10, [5, 100, 3], force=force)

    # Then both incomplete offsets of the range are in the map
    assert encoded is not None
    assert decode_offset_map(0, encoded.metadata, exact=True).incomplete == (3, 5)


@pytest.mark.parametrize("force", [None, OffsetEncoding.RUN_LENGTH, OffsetEncoding.BIT_SET])
def test_offsets_far_below_the_base_do_not_wrap_around_int64(
    force: OffsetEncoding | None,
) -> None:
    # -2**63 is below the base: it is ignored, and the subtraction of the base cannot wrap it
    encoded = encode_offset_map(1, 10, [1, 2, -(2**63)], force=force)
    assert encoded is not None
    assert decode_offset_map(1, encoded.metadata).incomplete == (1, 2)


@pytest.mark.parametrize(
    "incompletes",
    [[0, 2**64, 3, 5], [0, 3, -(2**63) - 1], [0, 1.5]],
    ids=["above", "below", "float"],
)
def test_offsets_that_are_not_int64_integers_are_rejected(incompletes: list[Any]) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        encode_offset_map(0, 10, incompletes)


def test_incompletes_beyond_int64_are_rejected() -> None:
    with pytest.raises(ValueError, match="64-bit"):
        encode_offset_map(2**63, 2**64 + 10, [2**64 + 1])
    with pytest.raises(ValueError, match="64-bit"):
        encode_offset_map(2**63, 2**63, [])
    with pytest.raises(ValueError, match="64-bit"):
        encode_offset_map(0, 2**64, [5])


def test_a_range_of_every_int64_offset_has_no_encoding() -> None:
    # 2**63 offsets: too long for any bitset, and its complete run too long for any RunLength.
    assert encode_offset_map(0, 2**63 - 1, []) is None
    assert encode_offset_map(0, 2**63 - 1, [5]) is None


def test_offsets_near_the_int64_limit_round_trip() -> None:
    base = 2**63 - 100
    encoded = encode_offset_map(base, 2**63 - 1, [base, 2**63 - 50, 2**63 - 2])
    assert encoded is not None
    assert decode_offset_map(base, encoded.metadata).incomplete == (base, 2**63 - 50, 2**63 - 2)


def test_offsets_near_2_to_62() -> None:
    base = 2**62
    encoded = encode_offset_map(base, base + 40_000, [base, base + 3, base + 39_999])
    assert encoded is not None
    decoded = decode_offset_map(base, encoded.metadata)
    assert decoded.incomplete == (base, base + 3, base + 39_999)
    assert decoded.highest_seen == base + 40_000


def test_forcing_a_non_decodable_encoding_is_an_error() -> None:
    with pytest.raises(ValueError, match="KAFKA_STREAMS"):
        encode_offset_map(0, 5, [0], force=OffsetEncoding.KAFKA_STREAMS)


def test_tie_break_prefers_plain_v1_bitset() -> None:
    # BitSet v1 and RunLength v1 are both 4 data bytes here (runs [1, 1]).
    encoded = encode_offset_map(0, 1, [0])
    assert encoded is not None
    assert encoded.encoding is OffsetEncoding.BIT_SET


def test_compression_is_chosen_when_it_wins_below_java_threshold() -> None:
    # 150 bytes of all-complete bits: plain BitSet is ~153 bytes, its zstd frame far smaller,
    # and RunLength needs runs [1, 1198, 1] plus an incomplete: also small. Whatever wins must
    # be no larger than every forced candidate.
    encoded = encode_offset_map(0, 1_200, [0, 600])
    assert encoded is not None
    sizes = [
        forced.size
        for e in DECODABLE
        if (forced := encode_offset_map(0, 1_200, [0, 600], force=e)) is not None
    ]
    assert encoded.size == min(sizes)


# --- Decoding: empty metadata, Java quirks, foreign and malformed input ---


def test_empty_metadata_means_no_map() -> None:
    decoded = decode_offset_map(42, "")

    assert decoded.highest_seen == 41
    assert decoded.incomplete == ()
    assert decoded.encoding is None


def test_run_length_highest_seen_starts_at_zero_for_base_zero() -> None:
    # Java's OffsetRunLength starts highestSeen at 0 (not -1) when the base is 0.
    assert decode_offset_map(0, b64(bytes.fromhex("6E 0000"))).highest_seen == 0
    assert decode_offset_map(5, b64(bytes.fromhex("6E 0000"))).highest_seen == 4


def test_run_length_with_no_runs_decodes_like_java() -> None:
    decoded = decode_offset_map(5, b64(b"\x6e"), exact=True)
    assert decoded.incomplete == ()
    assert decoded.highest_seen == 4


def test_run_length_with_no_runs_is_not_a_map_an_encoder_writes() -> None:
    with pytest.raises(OffsetDecodeError, match="RunLength"):
        decode_offset_map(5, b64(b"\x6e"))


def test_missing_base64_padding_is_accepted_like_java() -> None:
    assert decode_offset_map(100, "bAAGNgA").incomplete == (100, 103)


def test_streaming_zstd_frame_without_content_size_decodes() -> None:
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    frame = compressor.compress(bytes.fromhex("00063600")) + compressor.flush()
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN

    decoded = decode_offset_map(100, b64(b"\x61" + frame))

    assert decoded.incomplete == (100, 103)
    assert decoded.encoding is OffsetEncoding.BIT_SET_COMPRESSED


@pytest.mark.parametrize("magic", [0x01, 0x02])
def test_kafka_streams_metadata_has_its_own_error(magic: int) -> None:
    with pytest.raises(KafkaStreamsMetadataError) as caught:
        decode_offset_map(0, b64(bytes((magic, 0, 0, 0))))
    assert isinstance(caught.value, OffsetDecodeError)


def test_decode_error_is_a_library_error_and_a_value_error() -> None:
    assert issubclass(OffsetDecodeError, ParallelConsumerError)
    assert issubclass(OffsetDecodeError, ValueError)


BOMB = zstandard.ZstdCompressor(level=19).compress(bytes(20 * 1024 * 1024))


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ("not base64!", "base64"),
        ("bAAGNgA=x", "base64"),
        ("=bAAGNgA", "base64"),
        ("bAAG\nNgA=", "base64"),
        ("é", "base64"),
        (b64(bytes.fromhex("4C 00")), "BYTE_ARRAY"),
        (b64(bytes.fromhex("EE 00")), "BYTE_ARRAY_COMPRESSED"),
        (b64(bytes.fromhex("FF 00")), "magic"),
        (b64(bytes.fromhex("6C 00")), "truncated"),
        (b64(bytes.fromhex("6F 00 00 00")), "truncated"),
        (b64(bytes.fromhex("6C FF FF 00")), "negative"),
        (b64(bytes.fromhex("6E 00 01 00")), "truncated"),
        (b64(bytes.fromhex("65 00 00 00 01 00 00")), "truncated"),
        (b64(bytes.fromhex("6E FF FF")), "negative"),
        (b64(bytes.fromhex("6F 7F FF FF FF 36 00 00 00 00")), "limit"),
        (b64(bytes.fromhex("65 7F FF FF FF")), "limit"),
        (b64(b"\x61" + b"garbage"), "zstd"),
        (b64(b"\x61" + zstandard.ZstdCompressor().compress(b"\x00\x01\xff")[:-2]), "zstd"),
        (b64(b"\x61" + zstandard.ZstdCompressor().compress(b"\x00\x01\xff") + b"x"), "zstd"),
        (b64(b"\x61" + BOMB), "decompresses to more than"),
    ],
)
def test_malformed_metadata_raises_offset_decode_error(metadata: str, message: str) -> None:
    with pytest.raises(OffsetDecodeError, match=message):
        decode_offset_map(100, metadata, exact=True)
    if metadata != "bAAGNgA=x":  # read back, "x" is a stray character after a whole map
        with pytest.raises(OffsetDecodeError):
            decode_offset_map(100, metadata)


def test_hostile_bitset_length_is_bounded_by_the_incomplete_limit() -> None:
    just_fits = b64(b"\x6f" + MAX_DECODED_INCOMPLETES.to_bytes(4, "big"))
    assert len(decode_offset_map(0, just_fits, exact=True).incomplete) == MAX_DECODED_INCOMPLETES

    too_many = b64(b"\x6f" + (MAX_DECODED_INCOMPLETES + 1).to_bytes(4, "big"))
    with pytest.raises(OffsetDecodeError, match="limit"):
        decode_offset_map(0, too_many, exact=True)


def test_a_bitset_shorter_than_an_encoder_writes_is_refused_when_read_back() -> None:
    # Java reads the missing bits as incomplete; read back, the short buffer may be a longer map
    # cut by the reader, so it is not taken as one.
    short = b64(b"\x6f" + MAX_DECODED_INCOMPLETES.to_bytes(4, "big"))
    with pytest.raises(OffsetDecodeError, match="BitSet v2"):
        decode_offset_map(0, short)


# --- Reading back with stray trailing characters ---
# confluent-kafka returns a map the Java client committed followed by whatever bytes follow it
# in memory, up to a NUL (docs/offset-metadata.md).


@pytest.mark.parametrize(
    "tail", ["\x00", "!", "\x00garbage", "\x01AAAA", "=", "==", "é", "\n", "AAAA", "ABAHc=", "x"]
)
def test_a_padded_map_with_stray_characters_decodes_exactly(tail: str) -> None:
    # "bAAGNgA=" ends with padding: nothing after its last quantum can belong to it
    decoded = decode_offset_map(100, "bAAGNgA=" + tail)

    assert (decoded.incomplete, decoded.highest_seen) == ((100, 103), 105)


@pytest.mark.parametrize("tail", ["\x00", "!", "\x00AAAA", "=", "=AAA", "é!", "\r\n"])
def test_an_unpadded_map_cut_by_a_non_base64_character_decodes_exactly(tail: str) -> None:
    # BitSet v1 over 100..115 with 100, 103 and 110 incomplete: 6 payload bytes, no padding
    encoded = encode_offset_map(100, 115, [100, 103, 110], force=OffsetEncoding.BIT_SET)
    assert encoded is not None
    assert "=" not in encoded.metadata

    decoded = decode_offset_map(100, encoded.metadata + tail)

    assert (decoded.incomplete, decoded.highest_seen) == ((100, 103, 110), 115)


@pytest.mark.parametrize(
    "encoding",
    [e for e in DECODABLE if e.compressed or e.is_bitset],
    ids=lambda e: e.name,
)
@pytest.mark.parametrize("tail", ["", "AAAA", "QUFBQUFB", "////", "AAAAAAAAAAAAAAAA", "AB", "Zm8="])
def test_self_delimiting_maps_decode_exactly_even_with_base64_tails(
    encoding: OffsetEncoding, tail: str
) -> None:
    # A BitSet's length field fixes its size and a zstd frame ends where it ends, so even stray
    # characters that are themselves base64 cannot be mistaken for part of the map
    encoded = encode_offset_map(1_000, 1_090, [1_000, 1_001, 1_050], force=encoding)
    assert encoded is not None

    decoded = decode_offset_map(1_000, encoded.metadata + tail)

    assert decoded == decode_offset_map(1_000, encoded.metadata, exact=True)


def test_a_run_length_map_followed_by_more_runs_keeps_to_the_runs_it_is_sure_of() -> None:
    # Given a written RunLength v1 map of 4 runs (9 payload bytes, 12 characters, no padding)
    short = encode_offset_map(0, 20, [0, 1, 2, 10], force=OffsetEncoding.RUN_LENGTH)
    assert short is not None
    assert payload(short.metadata) == bytes.fromhex("6E 0003 0007 0001 000A")
    # ... read back followed by characters that happen to encode two more runs, [5, 9]
    longer = short.metadata + b64(bytes.fromhex("0005 0009"))

    # Then nothing past the short map counts as finished: exactly the short map is decoded,
    # although the longer string is itself a map an encoder could write
    assert decode_offset_map(0, longer) == decode_offset_map(0, short.metadata, exact=True)
    assert decode_offset_map(0, longer, exact=True).highest_seen == 34


def test_our_encoder_never_chooses_a_run_length_map_that_reads_back_conservatively() -> None:
    # Given the engine's restart test case: offsets 3, 17, 42 and 500 unfinished up to 599.
    # Plain RunLength v1 would be the smallest (8 runs, 17 bytes), but its first 4 runs are
    # a map of their own; the compressed form is self-delimiting.
    incompletes = [3, 17, 42, 500]
    plain = encode_offset_map(3, 599, incompletes, force=OffsetEncoding.RUN_LENGTH)
    assert plain is not None
    assert decode_offset_map(3, plain.metadata).incomplete == (3, 17)  # conservative

    chosen = encode_offset_map(3, 599, incompletes)

    assert chosen is not None
    assert chosen.encoding is OffsetEncoding.RUN_LENGTH_COMPRESSED
    assert chosen.size > plain.size
    decoded = decode_offset_map(3, chosen.metadata + "!")
    assert (decoded.incomplete, decoded.highest_seen) == (tuple(incompletes), 599)


def test_a_short_plain_run_length_map_is_still_chosen_when_it_reads_back_exactly() -> None:
    # [1, 2, 1, 2] v1: the 1-run prefix [1] is no written map, so the 9 bytes are unambiguous
    encoded = encode_offset_map(100, 105, [100, 103], force=OffsetEncoding.RUN_LENGTH)
    assert encoded is not None

    assert decode_offset_map(100, encoded.metadata + "AAAA").incomplete == (100, 103)


# --- Exact metadata as confluent-kafka committed it: the map and one NUL ---


def test_exact_metadata_drops_the_one_nul_confluent_kafka_stores_after_a_map() -> None:
    # confluent-kafka commits every metadata string followed by its C terminator; read with its
    # exact length (parallel_consumer/kafka/committed_reader.py), the stored bytes end with that NUL
    assert decode_offset_map(100, "bAAGNgA=\x00", exact=True) == decode_offset_map(
        100, "bAAGNgA=", exact=True
    )
    # ... and an empty string is stored as a lone NUL: no map
    assert decode_offset_map(100, "\x00", exact=True) == decode_offset_map(100, "", exact=True)


@pytest.mark.parametrize("metadata", ["bAAGNgA=\x00\x00", "bAAGNgA=\x00AAAA", "\x00bAAGNgA="])
def test_exact_metadata_with_more_than_one_trailing_nul_is_refused(metadata: str) -> None:
    with pytest.raises(OffsetDecodeError):
        decode_offset_map(100, metadata, exact=True)


def test_exact_metadata_decodes_a_run_length_map_whole_where_read_back_must_cut_it() -> None:
    # Given a plain RunLength map whose first 4 runs are a map of their own (Java writes such)
    written = encode_offset_map(3, 599, [3, 17, 42, 500], force=OffsetEncoding.RUN_LENGTH)
    assert written is not None

    # Then read back (stray bytes possible) only the 4-run prefix can be trusted, while the
    # exact bytes, with or without confluent-kafka's NUL, give the whole map
    assert decode_offset_map(3, written.metadata).incomplete == (3, 17)
    for exact in (written.metadata, written.metadata + "\x00"):
        decoded = decode_offset_map(3, exact, exact=True)
        assert (decoded.incomplete, decoded.highest_seen) == ((3, 17, 42, 500), 599)


@pytest.mark.parametrize("metadata", ["!", "\x00bAAGNgA=", " bAAGNgA=", "=bAAGNgA", "é"])
def test_metadata_that_does_not_start_with_a_map_is_refused(metadata: str) -> None:
    with pytest.raises(OffsetDecodeError):
        decode_offset_map(100, metadata)


def test_map_ending_beyond_int64_is_rejected() -> None:
    with pytest.raises(OffsetDecodeError, match="largest Kafka offset"):
        decode_offset_map(2**63 - 2, b64(bytes.fromhex("6C 0010 FFFF 00")))


def test_negative_committed_offset_is_rejected() -> None:
    with pytest.raises(OffsetDecodeError):
        decode_offset_map(-1, "bAAGNgA=")


class _CommittedPartition:
    """Stands in for a confluent-kafka TopicPartition whose metadata bytes are not all UTF-8."""

    def __init__(self, raw: bytes | None) -> None:
        self._raw = raw

    @property
    def metadata(self) -> str | None:
        return None if self._raw is None else self._raw.decode("utf-8")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        (b"bAAGNgA=", "bAAGNgA="),
        (b"bAAGNgA=!", "bAAGNgA=!"),
        (b"bAAGNgA=\xe3\x7f", "bAAGNgA="),  # seen in the hand-over test: not UTF-8
        (b"bAAGNgA=A\xffB", "bAAGNgA=A"),
    ],
)
def test_committed_metadata_is_read_even_when_stray_bytes_are_not_utf8(
    raw: bytes | None, expected: str | None
) -> None:
    metadata = read_committed_metadata(_CommittedPartition(raw))

    assert metadata == expected
    if metadata is not None:
        assert decode_offset_map(100, metadata).incomplete == (100, 103)
