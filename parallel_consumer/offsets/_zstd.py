"""zstd framing for the compressed encodings, with hard limits for hostile input."""

from __future__ import annotations

import threading

import zstandard

from parallel_consumer.offsets.errors import OffsetDecodeError

__all__ = [
    "MAX_DECOMPRESSED_BYTES",
    "compress",
    "decompress",
    "decompress_first_frame",
    "min_frame_size",
]

#: Decompressed payloads larger than this are rejected (a 16 MiB bitset covers 134M offsets).
MAX_DECOMPRESSED_BYTES = 16 * 1024 * 1024

# Java compresses with zstd-jni's ZstdOutputStream at the default level.
_LEVEL = 3
# Java's level-3 frames use a 2 MiB window; refusing larger ones bounds the decoder's allocation.
_MAX_WINDOW = 8 * 1024 * 1024
# A zstd block decodes to at most 128 KiB and costs at least 4 bytes, so feeding the input in
# small slices bounds how far one decompress() call can overshoot the output cap (~8 MiB here).
_FEED = 256
_MAX_BLOCK = 128 * 1024
_local = threading.local()


def compress(data: bytes) -> bytes:
    """One zstd frame of ``data`` (no content-size field, like Java's streaming encoder)."""
    # A compressor is not safe to share between threads, so each thread keeps its own: reusing
    # it keeps its working memory mapped instead of faulting in fresh tables on every call.
    compressor: zstandard.ZstdCompressor | None = getattr(_local, "compressor", None)
    if compressor is None:
        compressor = zstandard.ZstdCompressor(level=_LEVEL, write_content_size=False)
        _local.compressor = compressor
    return compressor.compress(data)


def min_frame_size(data_size: int) -> int:
    """A lower bound on the size of any zstd frame that decodes to ``data_size`` bytes.

    Frame header >= 6 bytes (magic, descriptor, window or size byte) and every block >= 4 bytes
    (3-byte header + 1 RLE byte) holding at most 128 KiB; the bound used is one byte under that.
    """
    blocks = max(1, -(-data_size // _MAX_BLOCK))
    return 5 + 4 * blocks


def decompress(frame: bytes) -> bytes:
    """Decode exactly one complete zstd frame, with or without a content-size field.

    Raises :class:`OffsetDecodeError` for a corrupt, truncated or oversized frame, or trailing data.
    """
    data, used = decompress_first_frame(frame)
    if used < len(frame):
        raise OffsetDecodeError("unexpected data after the zstd frame")
    return data


def decompress_first_frame(data: bytes) -> tuple[bytes, int]:
    """Decode the zstd frame at the start of ``data``; returns it decoded and its length.

    Whatever follows the frame is left alone. Raises :class:`OffsetDecodeError` for a corrupt,
    truncated or oversized frame.
    """
    decompressor = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW)
    stream = decompressor.decompressobj()
    parts: list[bytes] = []
    total = 0
    try:
        for start in range(0, len(data), _FEED):
            piece = data[start : start + _FEED]
            part = stream.decompress(piece)
            total += len(part)
            if total > MAX_DECOMPRESSED_BYTES:
                raise OffsetDecodeError(
                    f"zstd payload decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes"
                )
            parts.append(part)
            if stream.eof:
                return b"".join(parts), start + len(piece) - len(stream.unused_data)
    except zstandard.ZstdError as exc:
        raise OffsetDecodeError(f"corrupt zstd payload: {exc}") from exc
    raise OffsetDecodeError("truncated zstd payload")
