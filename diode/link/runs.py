"""Runs: the records of one source partition as columns, the unit every stage handles.

A run holds consecutive records of one source partition's chain (diode.accounting.ordering): record
i's predecessor is record i-1, and the first record's is `prev` (-1 starts a chain; RESEND marks
records sent again by `diode resend`, outside any chain). It names the incarnation of its source
partition (diode.kafka.identity: the topic id), since offsets mean something only within one.
Its encoding is the wire format's (docs/wire-format.md): a fixed little-endian header, the topic,
then the columns

    offsets i64[n] | timestamps i64[n] | timestamp types u8[n] | key lengths i32[n]
    | value lengths i32[n] | [header counts i32[n] | header name lengths i32[h]
    | header value lengths i32[h]] (only with FLAG_HEADERS; h headers in all)
    | keys | values | [header names | header values]

with -1 for a null key or value. The kafka_reader encodes a run once from what it consumed;
the packer concatenates runs into datagrams (splitting one only where a datagram ends); the
unpacker reads run headers only, to route each run to the writer that owns its partition; the
writer decodes columns with array.frombytes and slices. No stage builds an object per record,
except the writer's produce call, which confluent-kafka requires.

Layout chosen by measurement (docs/wire-format.md "Why this layout"): one Avro record of packed
columns costs ~7 µs more per run than this header, Arrow IPC ~18 µs and ~700 bytes of schema
per run; per-record Avro arrays cost ~1 µs per record. fastavro keeps the heartbeats.
"""

import io
import struct
import sys
from array import array
from functools import lru_cache
from itertools import accumulate, chain, compress, repeat
from operator import add, is_, itemgetter, lt, sub

from diode.errors import RejectedDatagram
from diode.link.records import NO_INCARNATION, RESEND, Record

FLAG_HEADERS = 1  # the run has header columns and blocks

# length, topic length, flags, partition, partition count, count, prev, keys/values/headers bytes,
# incarnation (16 bytes: the source topic's id)
HEADER = struct.Struct("<IHBxiiiqIII16s")
HEADER_BYTES = HEADER.size  # 56
FIXED_PER_RECORD = 8 + 8 + 1 + 4 + 4  # offset, timestamp, type, key and value lengths
# Room over max.record.bytes for what frames one record, generous for both: its run's header,
# topic and a compressor's growth (the unpacker's reassembly limit), and the Kafka batch around
# it (the writer's producer message.max.bytes)
FRAMING_ALLOWANCE = 65536
_LITTLE = sys.byteorder == "little"


def _le(a: array) -> array:
    """An array in little-endian order (a no-op on little-endian machines)."""
    if not _LITTLE:
        a.byteswap()
    return a


_NULLS = array("i", [-1])


def _lens(items) -> array:
    """Each item's length, -1 for None. Null keys (Kafka's default) in one C call."""
    if items and items[0] is None and items.count(None) == len(items):
        return _NULLS * len(items)
    return array("i", [-1 if x is None else len(x) for x in items])


MAX_NAMES = 4096  # header names kept encoded and decoded (few, and repeated on every record)
_encoded: dict = {}  # header name as given (str or bytes) -> its bytes
_names: dict = {}  # header name's bytes -> str


def _cached(cache: dict, convert, keys: list) -> list:
    """Each key through `cache`, looked up in C; `convert` only for a key not seen before
    (kept while the cache holds fewer than MAX_NAMES)."""
    out = list(map(cache.get, keys))
    if None in out:
        for i in compress(range(len(out)), map(is_, out, repeat(None))):
            out[i] = converted = convert(keys[i])
            if len(cache) < MAX_NAMES:
                cache[keys[i]] = converted
    return out


def _name_bytes(name) -> bytes:
    return name.encode() if isinstance(name, str) else bytes(name)


def header_columns(lists) -> tuple | None:
    """Each record's headers (a list of (name, value) or None) as columns: (counts, name
    lengths, value lengths, names, values); None when no record has any. Each name is encoded
    once per process, not once per record."""
    if not any(lists):
        return None
    flat = list(chain.from_iterable(filter(None, lists)))
    names = _cached(_encoded, _name_bytes, list(map(itemgetter(0), flat)))
    values = list(map(itemgetter(1), flat))
    try:
        block = b"".join(filter(None, values))
    except TypeError:  # a value given as str (tests, tools): as UTF-8
        values = [v.encode() if isinstance(v, str) else v for v in values]
        block = b"".join(filter(None, values))
    return (array("i", [0 if hs is None else len(hs) for hs in lists]),
            array("i", list(map(len, names))), _lens(values), b"".join(names), block)


def encode(topic: str, partition: int, partition_count: int, prev: int, offsets: array,
           timestamps: array, types: bytes, key_lens: array, value_lens: array, keys: bytes,
           values: bytes, headers: tuple | None = None,
           incarnation: bytes = NO_INCARNATION) -> bytes:
    """A run from its columns (arrays of native byte order; `headers` as header_columns
    makes them; the blocks bytes or views of bytes) of the source partition's `incarnation`."""
    t = topic.encode()
    n = len(offsets)
    parts = [b"", t, _le(offsets).tobytes(), _le(timestamps).tobytes(), bytes(types),
             _le(key_lens).tobytes(), _le(value_lens).tobytes()]
    header_bytes = 0
    if headers is not None:
        counts, name_lens, value_lens_h, names, hvalues = headers
        parts += [_le(array("i", counts)).tobytes(), _le(array("i", name_lens)).tobytes(),
                  _le(array("i", value_lens_h)).tobytes()]
        header_bytes = len(names) + len(hvalues)
    parts += [keys, values]
    if headers is not None:
        parts += [names, hvalues]
    length = HEADER_BYTES + sum(map(len, parts))
    parts[0] = HEADER.pack(length, len(t), FLAG_HEADERS if headers is not None else 0,
                           partition, partition_count, n, prev, len(keys), len(values),
                           header_bytes, incarnation)
    return b"".join(parts)


def from_messages(topic: str, partition: int, partition_count: int, prev: int, msgs,
                  incarnation: bytes = NO_INCARNATION) -> bytes:
    """A run from confluent_kafka Messages of one partition (in offset order) of the source
    partition's `incarnation`. Columns are read with map() over the Message class's own
    methods: no Python frame per record."""
    cls = type(msgs[0])
    stamps = list(map(cls.timestamp, msgs))
    keys = list(map(cls.key, msgs))
    values = list(map(cls.value, msgs))
    return encode(topic, partition, partition_count, prev,
                  array("q", map(cls.offset, msgs)), array("q", map(itemgetter(1), stamps)),
                  bytes(map(itemgetter(0), stamps)), _lens(keys), _lens(values),
                  b"".join(filter(None, keys)), b"".join(filter(None, values)),
                  header_columns(list(map(cls.headers, msgs))), incarnation)


def from_records(records, partition_count: int = 1, prev: int | None = None) -> bytes:
    """A run from Records of one partition (tests, the dead-letter and resend paths)."""
    r0 = records[0]
    return encode(
        r0.topic, r0.partition, partition_count, r0.prev_offset if prev is None else prev,
        array("q", [r.offset for r in records]), array("q", [r.timestamp for r in records]),
        bytes([r.timestamp_type for r in records]), _lens([r.key for r in records]),
        _lens([r.value for r in records]), b"".join(r.key or b"" for r in records),
        b"".join(r.value or b"" for r in records),
        header_columns([list(r.headers) for r in records]), r0.incarnation)


def encode_records(records, partition_counts: dict | None = None) -> bytes:
    """A payload of Records: one run per stretch of records of one partition (tests, tools)."""
    out, i = [], 0
    while i < len(records):
        j = i + 1
        resend = records[i].prev_offset == RESEND
        while j < len(records) and (records[j].topic, records[j].partition,
                                    records[j].incarnation) == \
                (records[i].topic, records[i].partition, records[i].incarnation) and \
                records[j].prev_offset == \
                (RESEND if resend else records[j - 1].offset):
            j += 1
        count = (partition_counts or {}).get(records[i].topic, records[i].partition + 1)
        out.append(from_records(records[i:j], count))
        i = j
    return b"".join(out)


def decode_records(payload) -> tuple[list, dict]:
    """The inverse of encode_records: (records, partition counts). Raises RejectedDatagram."""
    records, counts = [], {}
    for _, _, _, view in split_payload(payload):
        run = Run.decode(view)
        records += run.records()
        counts[run.topic] = run.partition_count
    return records, counts


def split_payload(buf) -> list:
    """The runs of a data payload as (topic bytes, partition, record count, memoryview),
    reading their headers only. Raises RejectedDatagram."""
    out, pos, end = [], 0, len(buf)
    view = memoryview(buf)
    if not end:
        raise RejectedDatagram("decode_failed", "empty payload")
    while pos < end:
        if pos + HEADER_BYTES > end:
            raise RejectedDatagram("decode_failed", "run header past the end of the payload")
        length, tlen, _, partition, _, count = HEADER.unpack_from(buf, pos)[:6]
        if length < HEADER_BYTES + tlen or pos + length > end:
            raise RejectedDatagram("decode_failed", f"run of {length} bytes does not fit")
        topic = bytes(view[pos + HEADER_BYTES:pos + HEADER_BYTES + tlen])
        out.append((topic, partition, count, view[pos:pos + length]))
        pos += length
    return out


MAX_TOPICS = 65536  # topic names kept decoded (_topic)
_topics: dict = {}  # a topic's UTF-8 bytes -> its name


def _topic(raw) -> str:
    """A run's topic (bytes or a view of them) as text: decoded once per process for the
    first MAX_TOPICS topics (a run's header carries it, every run: one look-up here).
    UnicodeDecodeError if it is no UTF-8."""
    try:
        name = _topics.get(raw)
    except ValueError:  # (a view of writable memory cannot be hashed)
        raw = bytes(raw)
        name = _topics.get(raw)
    if name is None:
        raw = bytes(raw)
        name = raw.decode()
        if len(_topics) < MAX_TOPICS:
            _topics[raw] = name
    return name


def _column(buf, pos: int, code: str, n: int) -> tuple[array, int]:
    a = array(code)
    end = pos + a.itemsize * n
    a.frombytes(buf[pos:end])
    if not _LITTLE:
        a.byteswap()
    return a, end


NO_ORIGIN = (0, 0.0, False)


class Run:
    """A decoded run: columns as arrays, the byte blocks as slices of the received buffer."""

    __slots__ = ("topic", "partition", "partition_count", "prev", "offsets", "timestamps",
                 "types", "key_lens", "value_lens", "keys", "values", "headers", "incarnation",
                 "_key_pos", "_value_pos", "_header_pos", "_own", "origin")

    def __init__(self, topic, partition, partition_count, prev, offsets, timestamps, types,
                 key_lens, value_lens, keys, values, headers=None, incarnation=NO_INCARNATION):
        self.topic = topic
        self.partition = partition
        self.partition_count = partition_count
        self.prev = prev
        self.offsets = offsets
        self.timestamps = timestamps
        self.types = types
        self.key_lens = key_lens
        self.value_lens = value_lens
        self.keys = keys
        self.values = values
        self.headers = headers  # (counts, name lengths, value lengths, names, values) or None
        self.incarnation = incarnation  # 16 bytes: the source partition's (its topic id)
        self._key_pos = self._value_pos = self._header_pos = self._own = None
        # Where the receiver got it (set by the kafka_writer): (journal position, reader clock
        # when it was read, whether it came again from the journal); parts of it keep it.
        self.origin = NO_ORIGIN

    @classmethod
    def decode(cls, buf, max_records: int = 1 << 20, trusted: bool = False) -> "Run":
        """Raises RejectedDatagram('decode_failed') on anything inconsistent: a run comes
        from an authenticated sender, but a bug there must not become a crash here; the
        records' headers are decoded too, to be checked. `trusted`: a run this process's own
        side made (the packer cutting a reader's run) is not checked record by record."""
        try:
            length, tlen, flags, partition, pcount, n, prev, kb, vb, hb, inc = \
                HEADER.unpack_from(buf)
            if length != len(buf) or n <= 0 or n > max_records or partition < 0 or \
                    pcount < 1 or prev < RESEND or flags & ~FLAG_HEADERS:
                raise ValueError("inconsistent run header")
            pos = HEADER_BYTES + tlen
            topic = _topic(buf[HEADER_BYTES:pos])
            # the fixed columns read in place (no call per column: a run of one record, as
            # runs are when records are spread thin over many partitions, is mostly this)
            offsets, timestamps, key_lens, value_lens = (array("q"), array("q"), array("i"),
                                                         array("i"))
            end = pos + 8 * n
            offsets.frombytes(buf[pos:end])
            pos, end = end, end + 8 * n
            timestamps.frombytes(buf[pos:end])
            pos, end = end, end + n
            types = bytes(buf[pos:end])
            pos, end = end, end + 4 * n
            key_lens.frombytes(buf[pos:end])
            pos, end = end, end + 4 * n
            value_lens.frombytes(buf[pos:end])
            pos = end
            if not _LITTLE:
                for a in (offsets, timestamps, key_lens, value_lens):
                    a.byteswap()
            headers = None
            if flags & FLAG_HEADERS:
                counts, pos = _column(buf, pos, "i", n)
                if min(counts) < 0 or sum(counts) > max_records * 64:
                    raise ValueError("header counts out of range")
                h = sum(counts)
                name_lens, pos = _column(buf, pos, "i", h)
                hvalue_lens, pos = _column(buf, pos, "i", h)
            elif hb:
                raise ValueError("headers block without header columns")
            if pos + kb + vb + hb != length:
                raise ValueError("blocks do not add up to the run's length")
            if min(key_lens) < -1 or sum(key_lens) + key_lens.count(-1) != kb or \
                    min(value_lens) < -1 or sum(value_lens) + value_lens.count(-1) != vb:
                raise ValueError("lengths do not match their block")
            if not trusted and (offsets[0] <= prev or n > 1 and not _increasing(offsets)):
                raise ValueError("offsets do not increase")
            keys = buf[pos:pos + kb]
            values = buf[pos + kb:pos + kb + vb]
            if flags & FLAG_HEADERS:
                nb = sum(name_lens)
                if h and (min(name_lens) < 0 or min(hvalue_lens) < -1 or
                          nb + sum(hvalue_lens) + hvalue_lens.count(-1) != hb):
                    raise ValueError("header lengths do not match their block")
                start = pos + kb + vb
                headers = (counts, name_lens, hvalue_lens, buf[start:start + nb],
                           buf[start + nb:length])
            run = cls(topic, partition, pcount, prev, offsets, timestamps, types, key_lens,
                      value_lens, keys, values, headers, inc)
            if headers is not None and not trusted:
                run.header_lists()  # a malformed header name is this run's rejection
        except RejectedDatagram:
            raise
        except Exception as exc:  # struct.error, UnicodeDecodeError, ValueError, IndexError
            raise RejectedDatagram("decode_failed", f"run: {exc}") from None
        return run

    def __len__(self):
        return len(self.offsets)

    @property
    def first(self) -> int:
        return self.offsets[0]

    @property
    def last(self) -> int:
        return self.offsets[-1]

    @property
    def resend(self) -> bool:
        return self.prev == RESEND

    def key_list(self) -> list:
        return _slices(self.keys, self.key_lens)

    def value_list(self) -> list:
        return _slices(self.values, self.value_lens)

    def header_lists(self) -> list | None:
        """Each record's own headers as a sequence of (name, value), or None when the run has
        none. Column by column: no parsing per record (each name decoded once per process)."""
        if self.headers is None:
            return None
        if self._own is None:
            counts, name_lens, value_lens, names, values = self.headers
            flat = list(zip(_cached(_names, bytes.decode, _slices(names, name_lens)),
                            _slices(values, value_lens)))
            each = counts[0]
            if each and counts.count(each) == len(counts):  # as many on every record: in C
                self._own = list(zip(*[iter(flat)] * each))
            else:
                at = _positions(counts)
                self._own = [flat[a:b] for a, b in zip(at, at[1:])]
        return self._own

    def take(self, indices) -> "Run":
        """A run of some of this run's records (ascending indices; one slice when they are
        consecutive). Its prev is the record before the first one taken (a resend stays one)."""
        indices = list(indices)
        i0 = indices[0]
        prev = self.prev if i0 == 0 or self.resend else self.offsets[i0 - 1]
        if indices[-1] - i0 + 1 == len(indices):
            part = self._slice(i0, indices[-1] + 1, prev)
            part.origin = self.origin
            return part
        keys, values, own = self.key_list(), self.value_list(), self.header_lists()
        part = Run(self.topic, self.partition, self.partition_count, prev,
                   array("q", [self.offsets[i] for i in indices]),
                   array("q", [self.timestamps[i] for i in indices]),
                   bytes(self.types[i] for i in indices),
                   array("i", [self.key_lens[i] for i in indices]),
                   array("i", [self.value_lens[i] for i in indices]),
                   b"".join(keys[i] or b"" for i in indices),
                   b"".join(values[i] or b"" for i in indices),
                   header_columns([own[i] for i in indices]) if own is not None else None,
                   self.incarnation)
        part.origin = self.origin
        return part

    def _slice(self, a: int, b: int, prev: int) -> "Run":
        if self._key_pos is None:
            self._key_pos = _positions(self.key_lens)
            self._value_pos = _positions(self.value_lens)
        kp, vp = self._key_pos, self._value_pos
        headers = None
        if self.headers is not None:
            counts, name_lens, value_lens, names, values = self.headers
            if self._header_pos is None:  # (a run is cut many times: once per datagram)
                self._header_pos = (_positions(counts), _positions(name_lens),
                                    _positions(value_lens))
            at, np_, vp_ = self._header_pos
            h0, h1 = at[a], at[b]
            headers = (counts[a:b], name_lens[h0:h1], value_lens[h0:h1],
                       names[np_[h0]:np_[h1]], values[vp_[h0]:vp_[h1]])
        return Run(self.topic, self.partition, self.partition_count, prev,
                   self.offsets[a:b], self.timestamps[a:b], self.types[a:b],
                   self.key_lens[a:b], self.value_lens[a:b],
                   self.keys[kp[a]:kp[b]], self.values[vp[a]:vp[b]], headers, self.incarnation)

    @classmethod
    def join(cls, runs: list) -> "Run":
        """One run of consecutive runs of one chain (each one's prev the last offset of the one
        before, all with header columns or none): its columns end to end, in C, not record by
        record. The writer produces a partition's runs joined: at a 1472-byte datagram a run
        is about 8 records of 100 B, and its cost per run would otherwise come every 8."""
        first, last = runs[0], runs[-1]
        offsets, timestamps, key_lens, value_lens = (array("q"), array("q"), array("i"),
                                                     array("i"))
        for r in runs:
            offsets.extend(r.offsets)
            timestamps.extend(r.timestamps)
            key_lens.extend(r.key_lens)
            value_lens.extend(r.value_lens)
        headers = None
        if first.headers is not None:
            counts, name_lens, hvalue_lens = array("i"), array("i"), array("i")
            for r in runs:
                counts.extend(r.headers[0])
                name_lens.extend(r.headers[1])
                hvalue_lens.extend(r.headers[2])
            headers = (counts, name_lens, hvalue_lens, b"".join(r.headers[3] for r in runs),
                       b"".join(r.headers[4] for r in runs))
        run = cls(first.topic, first.partition, last.partition_count, first.prev, offsets,
                  timestamps, b"".join(r.types for r in runs), key_lens, value_lens,
                  b"".join(r.keys for r in runs), b"".join(r.values for r in runs), headers,
                  first.incarnation)
        run.origin = first.origin
        if headers is not None and all(r._own is not None for r in runs):
            run._own = list(chain.from_iterable(r._own for r in runs))  # (decoded: not again)
        return run

    def split_at(self, i: int) -> tuple["Run", "Run"]:
        """(records before i, records from i): the second's prev is the first's last."""
        return self.take(range(i)), self.take(range(i, len(self)))

    def encode(self) -> bytes:
        """The run's bytes (its blocks may be views of a received buffer: copied once)."""
        return encode(self.topic, self.partition, self.partition_count, self.prev,
                      array("q", self.offsets), array("q", self.timestamps), self.types,
                      array("i", self.key_lens), array("i", self.value_lens), self.keys,
                      self.values, self.headers, self.incarnation)

    def record_sizes(self) -> list:
        """Each record's share of the encoding, in bytes (column by column, nulls or not)."""
        sizes = map(add, map(add, _bytes(self.key_lens), _bytes(self.value_lens)),
                    repeat(FIXED_PER_RECORD))
        if self.headers is None:
            return list(sizes)
        counts, name_lens, value_lens, _, _ = self.headers
        # per header: its two lengths and its bytes; per record: its count
        ends = [0, *accumulate(map(add, map(add, name_lens, _bytes(value_lens)), repeat(8)))]
        at = list(map(ends.__getitem__, _positions(counts)))  # header bytes before each record
        return list(map(add, map(add, sizes, map(sub, at[1:], at)), repeat(4)))

    def records(self) -> list:
        """The run as Records (tests and rare paths only: this is per-record work)."""
        headers = self.header_lists() or [()] * len(self)
        prevs = [self.prev, *self.offsets[:-1]] if not self.resend else [RESEND] * len(self)
        return [Record(self.topic, self.partition, o, t, ty, k, v, tuple(h), p, self.incarnation)
                for o, t, ty, k, v, h, p in zip(self.offsets, self.timestamps, self.types,
                                                self.key_list(), self.value_list(), headers,
                                                prevs)]


def _bytes(lens):
    """The bytes each item takes in its block (a sequence): its length, 0 for a null (-1). In
    C: a run of null keys (Kafka's default) or one with a few tombstones takes no Python loop."""
    nulls = lens.count(-1)
    if not nulls:
        return lens
    if nulls == len(lens):
        return bytes(nulls)
    return list(map(add, lens, map((-1).__eq__, lens)))  # (-1 + True is 0)


def _positions(lens) -> list:
    """Start of each item in its block, plus the end: [0, l0, l0+l1, ...] (-1 counts 0)."""
    return [0, *accumulate(_bytes(lens))]


def _slices(block, lens) -> list:
    """The items of a block, None where the length is -1. Every item null (keys, by Kafka's
    default) or none: in C. Some null (tombstones among values): a comprehension, which
    CPython runs faster than marking the nulls column by column would (measured)."""
    n, nulls = len(lens), lens.count(-1)
    if nulls == n:
        return [None] * n
    read = io.BytesIO(block).read
    if not nulls:
        return list(map(read, lens))
    return [None if x < 0 else read(x) for x in lens]


@lru_cache(maxsize=64)
def _lanes(n: int) -> tuple[int, int]:
    """(1, 1, ..., 1) and (0, 1, ..., n-1) as integers of n 64-bit lanes in native order."""
    return (int.from_bytes(array("q", [1]) * n, sys.byteorder),
            int.from_bytes(array("q", range(n)), sys.byteorder))


MAX_LANES = 4096  # runs of up to this many records have their offsets checked at once


def _increasing(offsets: array) -> bool:
    """Whether offsets rise strictly. Consecutive ones (every topic but a compacted or
    transactional one) in one comparison: the column read as one integer of 64-bit lanes is
    first * (1, ..., 1) + (0, 1, ..., n-1), and no lane carries into the next while every
    offset lies in [0, 2^63). Others record by record, in C."""
    n, first = len(offsets), offsets[0]
    if n <= MAX_LANES and first >= 0 and offsets[-1] - first == n - 1:
        ones, ramp = _lanes(n)
        if (first * ones + ramp).to_bytes(8 * n, sys.byteorder) == offsets.tobytes():
            return True
    return all(map(lt, offsets, offsets[1:]))
