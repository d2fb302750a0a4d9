"""Digests: the content of what the sender sent, proven on the low side without the source.

Per source partition, the sender hashes each record it reads (record_hash: BLAKE2b-128 over
its key, value, headers and timestamp, in a canonical form) and, every `records` records or
`seconds` seconds, sends the digest of the range it read: first and last offset, the number of
records, and BLAKE2b-128 over their hashes in offset order (range_digest). The receiver writes
each to receiver.digest.topic; `diode verify --digest-topic` recomputes them from the
destination's records (their own headers: what the receiver appends is left out) and says, per
range, verified, altered or incomplete.

A range covers consecutive records of the sender's chain (diode.accounting.ordering): on a
compacted topic its offsets are not contiguous, which is why the count travels with it. A
rewind of the sender starts a new range from where it reads again. Pure.
"""

import hashlib
import struct
from typing import NamedTuple

DIGEST_BYTES = 16
_PERSON = b"diode-digest"


_FIXED = struct.Struct(">qiii")  # timestamp, key length, value length, header count
_HEADER = struct.Struct(">ii")    # name length, value length
_blake2b = hashlib.blake2b


def record_hash(key, value, headers, timestamp: int) -> bytes:
    """BLAKE2b-128 of a record's content: its timestamp (ms), key and value (null, length -1,
    apart from empty) and headers (name, value; in order; none and an empty list alike), laid
    out as docs/wire-format.md says (kind 6)."""
    fixed = _FIXED.pack(timestamp, -1 if key is None else len(key),
                        -1 if value is None else len(value), len(headers) if headers else 0)
    if not headers:  # (the common case: one join, one hash)
        return _blake2b(b"".join((fixed, key or b"", value or b"")),
                        digest_size=DIGEST_BYTES).digest()
    parts = [fixed, key or b"", value or b""]
    for name, v in headers:
        n = name.encode() if isinstance(name, str) else bytes(name)
        parts += [_HEADER.pack(len(n), -1 if v is None else len(v)), n, v or b""]
    return _blake2b(b"".join(parts), digest_size=DIGEST_BYTES).digest()


def new_range():
    """The hasher of a range: feed it record hashes in offset order."""
    return hashlib.blake2b(digest_size=DIGEST_BYTES, person=_PERSON)


def range_digest(hashes) -> bytes:
    h = new_range()
    h.update(b"".join(hashes))
    return h.digest()


class Digest(NamedTuple):
    topic: str
    partition: int
    incarnation: bytes
    first: int
    last: int
    count: int
    digest: bytes


class _Window:
    __slots__ = ("incarnation", "first", "last", "count", "hasher", "since")

    def __init__(self, incarnation: bytes, first: int, since: float):
        self.incarnation, self.first, self.last, self.count = incarnation, first, first - 1, 0
        self.hasher, self.since = new_range(), since


class Digester:
    """The open range of each source partition the sender reads: closed every `records`
    records or `seconds` after it began."""

    def __init__(self, records: int, seconds: float):
        self.records, self.seconds = records, seconds
        self.open: dict = {}  # (topic, partition) -> _Window

    def add(self, tp: tuple, incarnation: bytes, offsets, hashes: list, now: float) -> list:
        """Records of one partition, read in order (their offsets and record hashes): returns
        the digests closed (a range closes at exactly `records` records)."""
        closed = []
        w = self.open.get(tp)
        if w is not None and w.incarnation != incarnation:
            closed.append(self._close(tp))
            w = None
        i = 0
        while i < len(hashes):
            if w is None:
                w = self.open[tp] = _Window(incarnation, offsets[i], now)
            j = min(len(hashes), i + self.records - w.count)
            w.hasher.update(b"".join(hashes[i:j]))
            w.last, w.count = offsets[j - 1], w.count + j - i
            if w.count >= self.records:
                closed.append(self._close(tp))
                w = None
            i = j
        return closed

    def due(self, now: float) -> list:
        """The digests of ranges open `seconds` or more."""
        return [self._close(tp) for tp, w in list(self.open.items())
                if now - w.since >= self.seconds]

    def forget(self, tp: tuple | None = None) -> None:
        """Drop the open range of `tp` (None: of every partition): a rewind reads it again."""
        if tp is None:
            self.open.clear()
        else:
            self.open.pop(tp, None)

    def _close(self, tp: tuple) -> Digest:
        w = self.open.pop(tp)
        return Digest(tp[0], tp[1], w.incarnation, w.first, w.last, w.count, w.hasher.digest())


def message_hashes(msgs) -> list:
    """record_hash of each confluent_kafka Message (columns read with map(), as
    diode.link.runs.from_messages does)."""
    cls = type(msgs[0])
    return list(map(record_hash, map(cls.key, msgs), map(cls.value, msgs),
                    map(cls.headers, msgs), [t[1] for t in map(cls.timestamp, msgs)]))
