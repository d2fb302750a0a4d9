"""Record batches as bytes: Avro encoding (fastavro) and compression.

Pure functions, so the payload format is testable without sockets. The layering follows the
Confluent connector: records -> Avro -> compressed -> encrypted (see diode.wire).
"""

import gzip
import io
import zlib

import fastavro
import lz4.frame
import zstandard

from diode.errors import RejectedDatagram
from diode.records import Record

# A decoded batch may not be larger than this, whatever the compression ratio: it bounds the
# memory a single datagram can make a receiver allocate (decompression bombs).
MAX_BATCH_BYTES = 8 * 1024 * 1024

_BYTES_OR_NULL = ["null", "bytes"]
BATCH_SCHEMA = fastavro.parse_schema({
    "type": "record",
    "name": "Batch",
    "namespace": "diode",
    "fields": [
        # Partition count of every source topic in the batch: a missing destination topic is
        # created with it.
        {"name": "partition_counts", "type": {"type": "map", "values": "int"}},
        {"name": "records", "type": {"type": "array", "items": {
            "type": "record",
            "name": "Record",
            "fields": [
                {"name": "topic", "type": "string"},
                {"name": "partition", "type": "int"},
                {"name": "offset", "type": "long"},
                {"name": "prev_offset", "type": "long"},
                {"name": "timestamp", "type": "long"},
                {"name": "timestamp_type", "type": "int"},
                {"name": "key", "type": _BYTES_OR_NULL},
                {"name": "value", "type": _BYTES_OR_NULL},
                {"name": "headers", "type": {"type": "array", "items": {
                    "type": "record",
                    "name": "Header",
                    "fields": [
                        {"name": "key", "type": "string"},
                        {"name": "value", "type": _BYTES_OR_NULL},
                    ],
                }}},
            ],
        }}},
    ],
})

# The batch's own framing: array and map block counts and terminators.
BATCH_OVERHEAD = 16
TOPIC_ENTRY_OVERHEAD = 10


def _varint(n: int) -> int:
    """Bytes of Avro's zig-zag varint encoding of n."""
    return (((n << 1) ^ (n >> 63)).bit_length() + 6) // 7 or 1


def _bytes_or_null(b) -> int:
    return 1 if b is None else 1 + _varint(len(b)) + len(b)


def encoded_size_bound(record: Record) -> int:
    """The record's Avro encoding size in bytes (exact for the record itself; the header array
    framing is counted generously), so a batch whose estimate fits is sure to fit."""
    topic = len(record.topic.encode())
    size = (_varint(topic) + topic + _varint(record.partition) + _varint(record.offset)
            + _varint(record.prev_offset) + _varint(record.timestamp)
            + _varint(record.timestamp_type)
            + _bytes_or_null(record.key) + _bytes_or_null(record.value) + 1)
    if record.headers:
        size += 10
        for name, value in record.headers:
            n = len(name.encode())
            size += _varint(n) + n + _bytes_or_null(value)
    return size


def encode_batch(records, partition_counts: dict) -> bytes:
    """Records (and the partition counts of their topics) as one Avro-encoded batch."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, BATCH_SCHEMA, {
        "partition_counts": partition_counts,
        "records": [
            {
                "topic": r.topic, "partition": r.partition, "offset": r.offset,
                "prev_offset": r.prev_offset,
                "timestamp": r.timestamp, "timestamp_type": r.timestamp_type,
                "key": r.key, "value": r.value,
                "headers": [{"key": k, "value": v} for k, v in r.headers],
            }
            for r in records
        ],
    })
    return out.getvalue()


def decode_batch(payload: bytes) -> tuple[list[Record], dict]:
    """The inverse of encode_batch. Raises RejectedDatagram('decode_failed') on bad bytes."""
    try:
        batch = fastavro.schemaless_reader(io.BytesIO(payload), BATCH_SCHEMA)
        records = [
            Record(
                r["topic"], r["partition"], r["offset"], r["timestamp"], r["timestamp_type"],
                r["key"], r["value"], tuple((h["key"], h["value"]) for h in r["headers"]),
                r["prev_offset"],
            )
            for r in batch["records"]
        ]
    except Exception as exc:  # fastavro raises many types on malformed input
        raise RejectedDatagram("decode_failed", f"{type(exc).__name__}: {exc}") from None
    return records, batch["partition_counts"]


# -- compression ---------------------------------------------------------------------------

COMPRESSION_IDS = {"none": 0, "gzip": 1, "zstd": 2, "lz4": 3}
COMPRESSION_NAMES = {v: k for k, v in COMPRESSION_IDS.items()}


def compress(kind: str, data: bytes) -> bytes:
    if kind == "none":
        return data
    if kind == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    if kind == "zstd":
        return zstandard.ZstdCompressor(level=3).compress(data)
    if kind == "lz4":
        return lz4.frame.compress(data)
    raise ValueError(f"unknown compression {kind!r}")


def decompress(kind_id: int, data: bytes, limit: int = MAX_BATCH_BYTES) -> bytes:
    """Decompress at most `limit` bytes; anything larger or malformed is rejected."""
    kind = COMPRESSION_NAMES.get(kind_id)
    try:
        if kind == "none":
            out = data
        elif kind == "gzip":
            d = zlib.decompressobj(wbits=31)
            out = d.decompress(data, limit + 1)
            if not d.eof:
                raise ValueError("truncated or over the size limit")
        elif kind == "zstd":
            # Our frames declare their size (zstandard writes it by default): check it before
            # allocating, then require the whole frame.
            size = zstandard.frame_content_size(data)
            if size < 0 or size > limit:
                raise ValueError(f"frame content size {size} unknown or over {limit}")
            out = zstandard.ZstdDecompressor().decompress(data)
        elif kind == "lz4":
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=limit + 1)
            if not d.eof:
                raise ValueError("truncated or over the size limit")
        else:
            raise RejectedDatagram("bad_compression", f"unknown compression id {kind_id}")
    except RejectedDatagram:
        raise
    except Exception as exc:
        raise RejectedDatagram("decompress_failed", f"{type(exc).__name__}: {exc}") from None
    if len(out) > limit:
        raise RejectedDatagram("decompress_failed", f"batch over {limit} bytes")
    return out
