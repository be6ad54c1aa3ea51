"""Property tests: a map read back with stray trailing characters.

confluent-kafka returns a map the Java client committed followed by whatever bytes lie after it in
memory, up to a NUL (``docs/offset-metadata.md``). Whatever follows, the decoding never marks an
offset finished that the writer did not mark finished, and it is exact for every map that can be
told apart from its own prefixes: every map our encoder chooses, every BitSet and compressed
map, so in particular whenever the stray characters start with a NUL or a non-base64 character.
"""

from __future__ import annotations

import base64
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from parallel_consumer.offsets import (
    DecodedOffsetMap,
    OffsetEncoding,
    decode_offset_map,
    encode_offset_map,
)

DECODABLE = [e for e in OffsetEncoding if e.decodable]
BASE64 = string.ascii_letters + string.digits + "+/="


@st.composite
def written_maps(draw: st.DrawFn) -> tuple[int, str]:
    """(committed offset, metadata) as an encoder writes it: a consistent partition state, with
    the committed offset incomplete and the highest succeeded offset above it, any encoding."""
    base = draw(st.one_of(st.just(0), st.integers(1, 10**6), st.integers(2**62, 2**62 + 10**6)))
    gaps = draw(st.lists(st.integers(1, 40), max_size=25))
    incompletes, offset = [base], base
    for gap in gaps:
        offset += gap
        incompletes.append(offset)
    highest = offset + draw(st.integers(1, 40))
    force = draw(st.sampled_from([None, *DECODABLE]))
    encoded = encode_offset_map(base, highest, incompletes, force=force)
    assert encoded is not None
    return base, encoded.metadata


TAILS = st.one_of(
    st.text(max_size=20),  # anything, NULs included
    st.text(alphabet=BASE64 + "\x00!\x01é", max_size=20),  # mostly base64
    # base64 of random bytes, then a NUL or a stray character or nothing: aligned quanta
    st.tuples(st.binary(max_size=15), st.sampled_from(["", "\x00", "!", "\x11", "A"])).map(
        lambda pair: base64.b64encode(pair[0]).decode() + pair[1]
    ),
)


def finished_only_where_written(decoded: DecodedOffsetMap, written: DecodedOffsetMap) -> bool:
    """True when every offset ``decoded`` counts as finished, ``written`` counts as finished too.

    Finished means in ``[base, highest_seen]`` and not incomplete; the ranges can be long, so
    compare the bounds and the incomplete sets instead of enumerating offsets.
    """
    if decoded.highest_seen < decoded.base:
        return True  # nothing finished
    within = {o for o in written.incomplete if o <= decoded.highest_seen}
    return decoded.highest_seen <= written.highest_seen and within <= set(decoded.incomplete)


def shortest_written_prefix(metadata: str) -> str:
    """Reference: the shortest prefix of ``metadata`` on a quantum boundary that an encoder
    could have written in full, found by trying every one (``metadata`` itself when none is)."""
    for quanta in range(1, len(metadata) // 4):
        prefix = metadata[: 4 * quanta]
        if "=" in prefix:
            break
        raw = base64.b64decode(prefix)
        encoding = OffsetEncoding.from_magic(raw[0])
        assert encoding is not None
        width = 2 if encoding.version == 1 else 4
        if encoding.compressed or encoding.is_bitset or (len(raw) - 1) % width:
            continue  # only plain RunLength has prefixes of a written shape (see the unit tests)
        runs = [
            int.from_bytes(raw[i : i + width], "big", signed=True)
            for i in range(1, len(raw), width)
        ]
        if runs == [0] or (
            len(runs) >= 2 and len(runs) % 2 == 0 and runs[0] >= 0 and min(runs[1:]) >= 1
        ):
            return prefix
    return metadata


@settings(max_examples=1000, deadline=None)
@given(written_maps(), TAILS)
def test_stray_characters_never_make_an_offset_finished(
    written_map: tuple[int, str], tail: str
) -> None:
    # Given a map an encoder wrote, read back followed by stray characters
    base, metadata = written_map
    written = decode_offset_map(base, metadata, exact=True)

    # When it is decoded
    decoded = decode_offset_map(base, metadata + tail)

    # Then nothing is finished that the writer did not finish, and the stray characters changed
    # nothing: the result is that of the map alone, which is exact unless a shorter prefix of
    # the map is itself a written map (plain RunLength only), and then exactly that prefix
    assert finished_only_where_written(decoded, written)
    assert decoded == decode_offset_map(base, metadata)
    assert decoded == decode_offset_map(base, shortest_written_prefix(metadata), exact=True)


@settings(max_examples=1000, deadline=None)
@given(written_maps(), TAILS)
def test_maps_told_apart_from_their_prefixes_decode_exactly(
    written_map: tuple[int, str], tail: str
) -> None:
    base, metadata = written_map
    written = decode_offset_map(base, metadata, exact=True)
    if shortest_written_prefix(metadata) != metadata:
        return  # covered above: decoded as that prefix

    assert decode_offset_map(base, metadata + tail) == written


@settings(max_examples=500, deadline=None)
@given(
    written_maps(),
    st.sampled_from(["\x00", "!", "\x01", "é", " ", "\n", "-", "_", "."]),
    st.text(max_size=10),
)
def test_maps_our_encoder_chooses_decode_exactly_after_a_nul_or_non_base64_character(
    written_map: tuple[int, str], first: str, rest: str
) -> None:
    # Given the map the encoder chooses by itself for a state (never a forced encoding)
    base, forced = written_map
    state = decode_offset_map(base, forced, exact=True)
    chosen = encode_offset_map(base, state.highest_seen, state.incomplete)
    assert chosen is not None

    # When it is read back followed by a NUL or a non-base64 character and anything after
    decoded = decode_offset_map(base, chosen.metadata + first + rest)

    # Then it decodes exactly
    assert decoded == decode_offset_map(base, chosen.metadata, exact=True)
    assert (decoded.highest_seen, decoded.incomplete) == (state.highest_seen, state.incomplete)


@settings(max_examples=500, deadline=None)
@given(written_maps(), written_maps(), st.sampled_from(["", "\x00", "!"]))
def test_a_map_followed_by_another_map_keeps_to_the_first(
    first: tuple[int, str], second: tuple[int, str], end: str
) -> None:
    # Given the likeliest stray characters of all: the remains of another map in freed memory
    base, metadata = first
    written = decode_offset_map(base, metadata, exact=True)

    decoded = decode_offset_map(base, metadata + second[1] + end)

    assert finished_only_where_written(decoded, written)
