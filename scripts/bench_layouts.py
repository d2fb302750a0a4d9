"""Per-record cost of encoding and decoding one run of records in four layouts: the measurement
behind docs/wire-format.md "Why this layout". Run: .venv/bin/python scripts/bench_layouts.py

Each layout holds the same run (one topic, one partition, n records of 100 random bytes with a
short key): offsets and timestamps, key and value lengths, and the bytes. Decoding stops where
a writer could start producing (columns as arrays, values reachable)."""

import io
import os
import struct
import time
from array import array

import fastavro
import pyarrow as pa

AVRO_ARRAYS = fastavro.parse_schema({"type": "record", "name": "RunA", "fields": [
    {"name": "topic", "type": "string"}, {"name": "partition", "type": "int"},
    {"name": "prev", "type": "long"},
    {"name": "offsets", "type": {"type": "array", "items": "long"}},
    {"name": "timestamps", "type": {"type": "array", "items": "long"}},
    {"name": "keys", "type": {"type": "array", "items": ["null", "bytes"]}},
    {"name": "values", "type": {"type": "array", "items": ["null", "bytes"]}}]})
AVRO_PACKED = fastavro.parse_schema({"type": "record", "name": "RunB", "fields": [
    {"name": "topic", "type": "string"}, {"name": "partition", "type": "int"},
    {"name": "prev", "type": "long"}, {"name": "count", "type": "int"},
    {"name": "offsets", "type": "bytes"}, {"name": "timestamps", "type": "bytes"},
    {"name": "key_lens", "type": "bytes"}, {"name": "value_lens", "type": "bytes"},
    {"name": "data", "type": "bytes"}]})
ARROW = pa.schema([("offset", pa.int64()), ("timestamp", pa.int64()), ("key", pa.binary()),
                   ("value", pa.binary())], metadata={"topic": "bench", "partition": "3"})
HEADER = struct.Struct("<HIqI")


def make(n, size=100):
    return (list(range(1000, 1000 + n)), [1_700_000_000_000 + i for i in range(n)],
            [b"k%05d" % i for i in range(n)], [os.urandom(size) for _ in range(n)])


def lens(items):
    return array("i", [-1 if x is None else len(x) for x in items]).tobytes()


def avro_arrays(offsets, stamps, keys, values):
    out = io.BytesIO()
    fastavro.schemaless_writer(out, AVRO_ARRAYS, {
        "topic": "bench", "partition": 3, "prev": 999, "offsets": offsets,
        "timestamps": stamps, "keys": keys, "values": values})
    return out.getvalue()


def avro_arrays_decode(payload):
    return fastavro.schemaless_reader(io.BytesIO(payload), AVRO_ARRAYS)["values"]


def avro_packed(offsets, stamps, keys, values):
    out = io.BytesIO()
    fastavro.schemaless_writer(out, AVRO_PACKED, {
        "topic": "bench", "partition": 3, "prev": 999, "count": len(offsets),
        "offsets": array("q", offsets).tobytes(), "timestamps": array("q", stamps).tobytes(),
        "key_lens": lens(keys), "value_lens": lens(values),
        "data": b"".join(filter(None, keys)) + b"".join(filter(None, values))})
    return out.getvalue()


def avro_packed_decode(payload):
    run = fastavro.schemaless_reader(io.BytesIO(payload), AVRO_PACKED)
    columns = []
    for name, code in (("offsets", "q"), ("key_lens", "i"), ("value_lens", "i")):
        a = array(code)
        a.frombytes(run[name])
        columns.append(a)
    return columns, run["data"]


def arrow_ipc(offsets, stamps, keys, values):
    batch = pa.record_batch([pa.array(offsets, pa.int64()), pa.array(stamps, pa.int64()),
                             pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                            schema=ARROW)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ARROW) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def arrow_ipc_decode(payload):
    return pa.ipc.open_stream(payload).read_next_batch().column(3)


def fixed_header(offsets, stamps, keys, values):
    topic = b"bench"
    return b"".join((HEADER.pack(len(topic), 3, 999, len(offsets)), topic,
                     array("q", offsets).tobytes(), array("q", stamps).tobytes(), lens(keys),
                     lens(values), b"".join(filter(None, keys)), b"".join(filter(None, values))))


def fixed_header_decode(payload):
    tlen, _, _, n = HEADER.unpack_from(payload)
    pos = HEADER.size + tlen
    columns = []
    for code, skip in (("q", 8 * n), ("i", 0), ("i", 0)):
        a = array(code)
        a.frombytes(payload[pos:pos + a.itemsize * n])
        columns.append(a)
        pos += a.itemsize * n + skip  # (timestamps after the offsets are skipped)
    return columns


LAYOUTS = (("avro-arrays", avro_arrays, avro_arrays_decode),
           ("avro-packed", avro_packed, avro_packed_decode),
           ("arrow-ipc", arrow_ipc, arrow_ipc_decode),
           ("fixed-header", fixed_header, fixed_header_decode))


def per_record_us(fn, args, n, repeats):
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    return (time.perf_counter() - start) / repeats / n * 1e6


def main():
    for n in (1, 12, 100, 500):
        run = make(n)
        repeats = max(20, 40000 // n)
        print(f"run of {n} record(s):")
        for name, encode, decode in LAYOUTS:
            payload = encode(*run)
            print(f"  {name:13s} encode {per_record_us(encode, run, n, repeats):6.2f} "
                  f"decode {per_record_us(decode, (payload,), n, repeats):6.2f} µs/record, "
                  f"{len(payload) / n:5.0f} bytes/record")


if __name__ == "__main__":
    main()
