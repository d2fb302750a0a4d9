"""The datagram format. Exact bytes: docs/wire-format.md.

    header (28 bytes, authenticated as AEAD associated data) || AEAD(compressed runs)

The udp_reader parses only the header's magic, version and routing key; an unpacker verifies the
tag before it trusts any other field.
"""

import io
import struct
from typing import NamedTuple

import fastavro

from diode.link import codec, runs
from diode.link.crypto import Keyring, SessionCipher
from diode.errors import RejectedDatagram
from diode.link.replay import ReplayWindow

MAGIC = b"\xd1\x0d"
VERSION = 3  # 1: per-record Avro batches; 2: runs without their source incarnation (rejected)
KIND_DATA = 1
KIND_HEARTBEAT = 2
KIND_FRAGMENT = 3
KIND_PARITY = 4
KIND_SOURCE = 5  # the source's state: each partition's log start and end, each topic's retention
KIND_DIGEST = 6  # digests of the ranges sent (diode.accounting.digests)
KIND_METADATA = 7  # the source topics' partition counts and configs, groups' committed offsets
KINDS = (KIND_DATA, KIND_HEARTBEAT, KIND_FRAGMENT, KIND_PARITY, KIND_SOURCE, KIND_DIGEST,
         KIND_METADATA)
FLAG_FEC = 1  # a data or fragment datagram covered by parity datagrams of its block
FLAG_STOPPING = 2  # a heartbeat sent as its reader stops cleanly (after its last records)

HEADER = struct.Struct("!2sBBBBBBQQI")
HEADER_BYTES = HEADER.size  # 28


class Header(NamedTuple):
    kind: int
    cipher: int
    compression: int
    key_id: int
    session_id: int
    seq: int
    routing_key: int
    flags: int = 0

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, VERSION, self.kind, self.cipher, self.compression, self.key_id,
                           self.flags, self.session_id, self.seq, self.routing_key)


def parse_header(datagram) -> Header:
    """The header of a datagram, unauthenticated. Raises RejectedDatagram."""
    if len(datagram) < HEADER_BYTES:
        raise RejectedDatagram("truncated", f"{len(datagram)} bytes")
    magic, version, kind, cipher, compression, key_id, flags, session, seq, routing = \
        HEADER.unpack_from(datagram)
    if magic != MAGIC:
        raise RejectedDatagram("bad_magic")
    if version != VERSION:
        raise RejectedDatagram("bad_version", f"version {version}, this receiver speaks {VERSION}")
    return Header(kind, cipher, compression, key_id, session, seq, routing, flags)


def routing_key(datagram) -> int:
    """What the udp_reader routes on. Raises RejectedDatagram on a datagram that is not ours."""
    return parse_header(datagram).routing_key


class Sealer:
    """Turns payloads into datagrams for one sender session (one packer process)."""

    def __init__(self, cipher: SessionCipher, compression: str, key_id: int = 0):
        self.cipher = cipher
        self.compression = compression
        self.compression_id = codec.COMPRESSION_IDS[compression]
        self.key_id = key_id
        self.seq = 0

    def seal(self, payload: bytes, kind: int = KIND_DATA, routing_key: int | None = None,
             flags: int = 0) -> bytes:
        """A datagram carrying `payload`: an encoded batch (data, compressed here), a heartbeat,
        parity, or a fragment of a batch compressed as a whole (its header names that
        compression). The routing key defaults to the sequence number."""
        body = codec.compress(self.compression, payload) if kind == KIND_DATA else payload
        return self.seal_body(body, kind, routing_key, flags)

    def seal_body(self, body: bytes, kind: int = KIND_DATA, routing_key: int | None = None,
                  flags: int = 0) -> bytes:
        """Like seal, for a body already compressed (or not to be)."""
        self.seq += 1
        compression_id = self.compression_id if kind in (KIND_DATA, KIND_FRAGMENT) else 0
        header = Header(kind, self.cipher.cipher_id, compression_id, self.key_id,
                        self.cipher.session_id, self.seq,
                        (self.seq if routing_key is None else routing_key) & 0xFFFFFFFF,
                        flags).pack()
        return header + self.cipher.seal(self.seq, header, body)


def unseal(datagram: bytes, keyring: Keyring, replay: ReplayWindow | None = None):
    """Verify the tag, check against replays, decrypt and decompress: (Header, payload).

    Raises RejectedDatagram with the reason; nothing in it is trusted before the tag verifies.
    """
    h = parse_header(datagram)
    if h.kind not in KINDS:
        raise RejectedDatagram("bad_kind", f"kind {h.kind}")
    header = bytes(datagram[:HEADER_BYTES])
    body = keyring.open(h.cipher, h.session_id, h.seq, header, bytes(datagram[HEADER_BYTES:]),
                        h.key_id)
    if replay is not None:
        replay.check(h.session_id, h.seq)
    if h.kind in (KIND_FRAGMENT, KIND_PARITY):
        return h, body  # a fragment is decompressed once its whole batch is reassembled
    return h, codec.decompress(h.compression, body)


def open_datagram(datagram: bytes, keyring: Keyring, replay: ReplayWindow | None = None):
    """A data datagram's (records, partition_counts), record by record: for tests and tools,
    never the data path (the unpacker forwards runs undecoded)."""
    h, payload = unseal(datagram, keyring, replay)
    if h.kind != KIND_DATA:
        raise RejectedDatagram("bad_kind", f"kind {h.kind} where data was expected")
    return runs.decode_records(payload)


# -- heartbeats --------------------------------------------------------------------------------


def _fields(**types) -> list:
    """Avro record fields, in order: name=type."""
    return [{"name": name, "type": t} for name, t in types.items()]


def _partitions(name: str, *fields) -> dict:
    """An Avro array of records naming a source partition (its topic, number and
    incarnation), then `fields`."""
    return {"name": "partitions", "type": {"type": "array", "items": {
        "type": "record", "name": name, "fields": [
            *_fields(topic="string", partition="int",
                     incarnation={"type": "fixed", "name": "Incarnation", "size": 16}),
            *fields]}}}


HEARTBEAT_SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "Heartbeat", "namespace": "diode",
    "fields": [
        *_fields(reader="int", time_ms="long", interval_ms="long", cluster="string"),
        _partitions("Claim", *_fields(chain_start="long", last_sent="long", end="long",
                                      retired="boolean")),
        *_fields(counters={"type": "map", "values": "long"}),
    ],
})


NAMED = "named_ms@"  # a counters entry: from this claim on (its index), when first named


def encode_heartbeat(beat: dict) -> bytes:
    """A heartbeat as Avro (fastavro, schemaless): see decode_heartbeat for its fields."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, HEARTBEAT_SCHEMA, {
        "reader": beat["reader"], "time_ms": beat["time_ms"],
        "interval_ms": int(beat["interval_ms"]),
        "counters": {**beat.get("counters", {}), **_named_entries(beat.get("named_ms"))},
        "cluster": beat.get("cluster", ""),
        "partitions": [{"topic": t, "partition": p, "incarnation": inc, "chain_start": s,
                        "last_sent": last, "end": end, "retired": retired}
                       for t, p, inc, s, last, end, retired in beat["partitions"]]})
    return out.getvalue()


def decode_heartbeat(payload: bytes) -> dict:
    """A heartbeat: {"reader", "time_ms", "interval_ms", "cluster", "partitions": [(topic,
    partition, incarnation, chain_start, last_sent, end, retired), ...], "counters": {...}},
    and "named_ms" (when each claim's chain was first named, sender time, in the order of
    "partitions") where the sender said it. Raises RejectedDatagram."""
    beat = _read(payload, HEARTBEAT_SCHEMA, "heartbeat")
    beat["partitions"] = [(c["topic"], c["partition"], c["incarnation"], c["chain_start"],
                           c["last_sent"], c["end"], c["retired"]) for c in beat["partitions"]]
    beat["interval_ms"] = float(beat["interval_ms"])
    named = _named(beat["counters"], len(beat["partitions"]))
    if named is not None:
        beat["named_ms"] = named
    return beat


def _named_entries(named) -> dict:
    """When each claim's chain was first named (`named`, in the claims' order), as counters
    entries, which a receiver that does not know them passes on as counters: NAMED + i for
    each claim i whose time is not the one before it (the first included)."""
    entries, last = {}, None
    for i, ms in enumerate(named or ()):
        if ms != last:
            entries[f"{NAMED}{i}"] = last = ms
    return entries


def _named(counters: dict, claims: int) -> list | None:
    """The NAMED entries taken out of `counters`: a time per claim (None: there are none, a
    sender older than them). Raises RejectedDatagram on entries that do not say one per
    claim."""
    keys = [k for k in counters if k.startswith(NAMED)]
    if not keys:
        return None
    try:
        starts = sorted((int(k[len(NAMED):]), counters.pop(k)) for k in keys)
    except ValueError:
        raise RejectedDatagram("decode_failed", "heartbeat: a claim's named time") from None
    if starts[0][0] != 0 or starts[-1][0] >= claims:
        raise RejectedDatagram("decode_failed", "heartbeat: the claims' named times")
    named = []
    for (i, ms), (j, _) in zip(starts, starts[1:] + [(claims, None)]):
        named += [ms] * (j - i)
    return named


# -- the source's state ------------------------------------------------------------------------

SOURCE_SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "SourceState", "namespace": "diode",
    "fields": [
        *_fields(reader="int", time_ms="long", cluster="string"),
        _partitions("PartitionState", *_fields(log_start="long", end="long")),
        *_fields(topics={"type": "array", "items": {
            "type": "record", "name": "TopicState", "fields": _fields(
                topic="string", retention_ms="long", retention_bytes="long",
                cleanup_policy="string")}}),
    ],
})
UNKNOWN = -2  # a retention the source's broker did not say (Tansu gives only what was set)


def encode_source(state: dict) -> bytes:
    """The source's state as Avro (fastavro, schemaless): see decode_source for its fields."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, SOURCE_SCHEMA, {
        "reader": state["reader"], "time_ms": state["time_ms"], "cluster": state["cluster"],
        "partitions": [{"topic": t, "partition": p, "incarnation": inc, "log_start": start,
                        "end": end} for t, p, inc, start, end in state["partitions"]],
        "topics": [{"topic": t, "retention_ms": ms, "retention_bytes": nbytes,
                    "cleanup_policy": policy} for t, ms, nbytes, policy in state["topics"]]})
    return out.getvalue()


def decode_source(payload: bytes) -> dict:
    """The source's state as a reader last read it: {"reader", "time_ms", "cluster",
    "partitions": [(topic, partition, incarnation, log start, end), ...] (the end: the next
    offset to be written), "topics": [(topic, retention.ms, retention.bytes, cleanup.policy),
    ...] (UNKNOWN or "" where the broker did not say)}. Raises RejectedDatagram."""
    state = _read(payload, SOURCE_SCHEMA, "source state")
    state["partitions"] = [(c["topic"], c["partition"], c["incarnation"], c["log_start"],
                            c["end"]) for c in state["partitions"]]
    state["topics"] = [(c["topic"], c["retention_ms"], c["retention_bytes"],
                        c["cleanup_policy"]) for c in state["topics"]]
    return state


# -- digests ---------------------------------------------------------------------------------

DIGEST_SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "Digests", "namespace": "diode",
    "fields": [
        *_fields(reader="int", time_ms="long", cluster="string", resend="boolean"),
        _partitions("RangeDigest", *_fields(first="long", last="long", count="long",
                                            digest={"type": "fixed", "name": "Digest",
                                                    "size": 16})),
    ],
})


def encode_digests(batch: dict) -> bytes:
    """Digests of ranges sent as Avro (fastavro, schemaless): see decode_digests."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, DIGEST_SCHEMA, {
        "reader": batch["reader"], "time_ms": batch["time_ms"], "cluster": batch["cluster"],
        "resend": bool(batch.get("resend")),
        "partitions": [{"topic": t, "partition": p, "incarnation": inc, "first": first,
                        "last": last, "count": count, "digest": digest}
                       for t, p, inc, first, last, count, digest in batch["partitions"]]})
    return out.getvalue()


def decode_digests(payload: bytes) -> dict:
    """{"reader", "time_ms", "cluster", "resend", "partitions": [(topic, partition,
    incarnation, first, last, count, digest), ...]}: each the digest (16 bytes) of `count`
    records the sender read from first to last (with `resend`: a range of `diode resend`, read
    whole: the source holds exactly those records in it). Raises RejectedDatagram."""
    batch = _read(payload, DIGEST_SCHEMA, "digests")
    batch["partitions"] = [(c["topic"], c["partition"], c["incarnation"], c["first"],
                            c["last"], c["count"], c["digest"]) for c in batch["partitions"]]
    return batch


# -- metadata ----------------------------------------------------------------------------------

INCARNATION = {"type": "fixed", "name": "Incarnation", "size": 16}
METADATA_SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "Metadata", "namespace": "diode",
    "fields": [
        *_fields(reader="int", time_ms="long", cluster="string", whole="boolean"),
        *_fields(topics={"type": "array", "items": {
            "type": "record", "name": "TopicMetadata", "fields": _fields(
                topic="string", incarnation=INCARNATION, partitions="int",
                configs={"type": "map", "values": "string"})}}),
        *_fields(groups={"type": "array", "items": {
            "type": "record", "name": "GroupOffset", "fields": _fields(
                group="string", topic="string", partition="int", incarnation="Incarnation",
                offset="long")}}),
    ],
})


def encode_metadata(meta: dict) -> bytes:
    """Metadata as Avro (fastavro, schemaless): see decode_metadata for its fields."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, METADATA_SCHEMA, {
        "reader": meta["reader"], "time_ms": meta["time_ms"], "cluster": meta["cluster"],
        "whole": bool(meta.get("whole")),
        "topics": [{"topic": t, "incarnation": inc, "partitions": n, "configs": configs}
                   for t, inc, n, configs in meta["topics"]],
        "groups": [{"group": g, "topic": t, "partition": p, "incarnation": inc,
                    "offset": offset} for g, t, p, inc, offset in meta["groups"]]})
    return out.getvalue()


def decode_metadata(payload: bytes) -> dict:
    """{"reader", "time_ms", "cluster", "whole", "topics": [(topic, incarnation, partition
    count, {config: value}), ...], "groups": [(group, topic, partition, incarnation, committed
    offset), ...]}: `whole` when this look's metadata is all sent (every
    sender.metadata.interval.ms), not only what changed. Raises RejectedDatagram."""
    meta = _read(payload, METADATA_SCHEMA, "metadata")
    meta["topics"] = [(c["topic"], c["incarnation"], c["partitions"], c["configs"])
                      for c in meta["topics"]]
    meta["groups"] = [(c["group"], c["topic"], c["partition"], c["incarnation"], c["offset"])
                      for c in meta["groups"]]
    return meta


def _read(payload: bytes, schema, what: str) -> dict:
    """One Avro record of `schema` that is the whole payload, or RejectedDatagram."""
    try:
        reader = io.BytesIO(payload)
        record = fastavro.schemaless_reader(reader, schema)
        if reader.tell() != len(payload):
            raise ValueError("trailing bytes")
    except Exception as exc:  # fastavro raises many types on malformed input
        raise RejectedDatagram("decode_failed", f"{what}: {type(exc).__name__}") from None
    return record
