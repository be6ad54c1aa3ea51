"""The offset map: which records above the committed offset already succeeded.

Pure functions over plain data (no threads, no Kafka): encode and decode the commit metadata
byte-for-byte like the Java Parallel Consumer, and plan each partition's commit. See
``docs/offset-metadata.md``.
"""

from parallel_consumer.offsets._zstd import MAX_DECOMPRESSED_BYTES
from parallel_consumer.offsets.codec import (
    LARGE_ENCODED_SIZE_THRESHOLD_BYTES,
    MAX_DECODED_INCOMPLETES,
    DecodedOffsetMap,
    EncodedOffsetMap,
    decode_offset_map,
    encode_offset_map,
    read_committed_metadata,
)
from parallel_consumer.offsets.commit_plan import (
    DEFAULT_MAX_METADATA_BYTES,
    CommitPlan,
    MetadataStatus,
    plan_commit,
)
from parallel_consumer.offsets.encoding import OffsetEncoding
from parallel_consumer.offsets.errors import KafkaStreamsMetadataError, OffsetDecodeError

__all__ = [
    "DEFAULT_MAX_METADATA_BYTES",
    "LARGE_ENCODED_SIZE_THRESHOLD_BYTES",
    "MAX_DECODED_INCOMPLETES",
    "MAX_DECOMPRESSED_BYTES",
    "CommitPlan",
    "DecodedOffsetMap",
    "EncodedOffsetMap",
    "KafkaStreamsMetadataError",
    "MetadataStatus",
    "OffsetDecodeError",
    "OffsetEncoding",
    "decode_offset_map",
    "encode_offset_map",
    "plan_commit",
    "read_committed_metadata",
]
