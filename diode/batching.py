"""Filling datagrams with records: pure logic of the packer, testable without sockets.

Records are added in order with a tag (who to tell once they are sent). The builder seals a
datagram when the next record would not fit, and never makes a datagram larger than the limit:
without compression the size bound of the Avro encoding is exact enough; with compression it
aims at the running compression ratio and splits a batch that came out too large.
"""

from dataclasses import dataclass, field

from diode import codec
from diode.records import Record
from diode.wire import HEADER_BYTES
from diode.crypto import TAG_BYTES


@dataclass
class Sealed:
    """One datagram and, per tag, how many of its records carried that tag."""

    datagram: bytes
    tags: dict = field(default_factory=dict)


@dataclass
class _Pending:
    records: list = field(default_factory=list)
    tags: list = field(default_factory=list)
    size: int = codec.BATCH_OVERHEAD
    topics: set = field(default_factory=set)


class DatagramBuilder:
    def __init__(self, datagram_bytes: int, seal, compressed: bool, partition_counts,
                 compress=None):
        """`seal(payload) -> datagram`; `partition_counts(topic) -> int`. With
        `compress(payload) -> body`, `seal` takes the body instead, and is called only for
        datagrams that are kept (each seal may be the one that a parity block counts on)."""
        self.limit = datagram_bytes
        self.budget = datagram_bytes - HEADER_BYTES - TAG_BYTES
        self._seal = seal
        self._compress = compress
        self._compressed = compressed
        self._partition_counts = partition_counts
        self._ratio = 1.0  # compressed / uncompressed, learnt as datagrams are sealed
        self._pending = _Pending()

    @property
    def pending(self) -> int:
        return len(self._pending.records)

    def _target(self) -> int:
        if not self._compressed:
            return self.budget
        return min(codec.MAX_BATCH_BYTES, int(self.budget / max(self._ratio, 0.02) * 0.9))

    def add(self, record: Record, tag) -> tuple[list[Sealed], list]:
        """Add a record. Returns (sealed datagrams, records too large for any datagram) — the
        latter as (record, tag) pairs."""
        size = codec.encoded_size_bound(record)
        if record.topic not in self._pending.topics:
            size += codec.TOPIC_ENTRY_OVERHEAD + len(record.topic.encode())
        sealed, oversize = [], []
        p = self._pending
        if p.records and p.size + size > self._target():
            s, o = self.flush()
            sealed += s
            oversize += o
            p = self._pending
            size = codec.encoded_size_bound(record) + codec.TOPIC_ENTRY_OVERHEAD + len(
                record.topic.encode())
        p.records.append(record)
        p.tags.append(tag)
        p.size += size
        p.topics.add(record.topic)
        return sealed, oversize

    def flush(self) -> tuple[list[Sealed], list]:
        p, self._pending = self._pending, _Pending()
        if not p.records:
            return [], []
        sealed, oversize = [], []
        self._seal_into(p.records, p.tags, sealed, oversize)
        return sealed, oversize

    def _seal_into(self, records, tags, sealed, oversize):
        counts = {t: self._partition_counts(t) for t in {r.topic for r in records}}
        payload = codec.encode_batch(records, counts)
        # A batch the receiver would refuse to decompress is never sent, however well it
        # compresses: it is split, and a single record that large is oversize.
        datagram = None
        if len(payload) <= codec.MAX_BATCH_BYTES:
            if self._compress is None:
                datagram = self._seal(payload)
                size = len(datagram)
            else:  # size first: only datagrams that are kept get sealed
                body = self._compress(payload)
                size = len(body) + HEADER_BYTES + TAG_BYTES
            if self._compressed:
                self._ratio = 0.7 * self._ratio + 0.3 * (size - HEADER_BYTES - TAG_BYTES) / max(
                    len(payload), 1)
            if size <= self.limit and datagram is None:
                datagram = self._seal(body)
        if datagram is not None and len(datagram) <= self.limit:
            tag_counts = {}
            for t in tags:
                tag_counts[t] = tag_counts.get(t, 0) + 1
            sealed.append(Sealed(datagram, tag_counts))
        elif len(records) == 1:
            oversize.append((records[0], tags[0]))
        else:
            half = len(records) // 2
            self._seal_into(records[:half], tags[:half], sealed, oversize)
            self._seal_into(records[half:], tags[half:], sealed, oversize)
