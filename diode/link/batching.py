"""Filling datagrams with runs: pure logic of the packer, testable without sockets.

Runs (diode.link.runs) are added in order with a tag (who to tell once their records are sent). A
run goes into the datagram being filled whole when it fits; otherwise the datagram is sealed and the
run starts the next, and a run larger than a datagram is cut by record. A datagram is never
larger than the limit: without compression a run's length is its exact size; with compression
the builder aims at the running compression ratio and splits a payload that came out too large.
A single record too large for any datagram comes back as oversize (the packer fragments it).
"""

from dataclasses import dataclass, field
from itertools import accumulate
from bisect import bisect_right

from diode.link import codec, runs
from diode.link.crypto import TAG_BYTES
from diode.link.wire import HEADER_BYTES


@dataclass
class Sealed:
    """One datagram and, per tag, how many of its records carried that tag."""

    datagram: bytes
    tags: dict = field(default_factory=dict)


class DatagramBuilder:
    def __init__(self, datagram_bytes: int, seal, compressed: bool, compress=None):
        """`seal(payload) -> datagram`. With `compress(payload) -> body`, `seal` takes the body
        instead, and is called only for datagrams that are kept (each seal may be the one that
        a parity block counts on)."""
        self.limit = datagram_bytes
        self.budget = datagram_bytes - HEADER_BYTES - TAG_BYTES
        self._seal = seal
        self._compress = compress
        self._compressed = compressed
        self._ratio = 1.0  # compressed / uncompressed, learnt as datagrams are sealed
        self._runs: list = []   # (encoded run, tag, records)
        self._size = 0
        self.pending = 0        # records waiting in the datagram being filled

    def _target(self) -> int:
        if not self._compressed:
            return self.budget
        return min(codec.MAX_BATCH_BYTES, int(self.budget / max(self._ratio, 0.02) * 0.9))

    def add(self, run: bytes, tag, records: int) -> tuple[list[Sealed], list]:
        """Add an encoded run of `records` records. Returns (sealed datagrams, single-record
        runs too large for any datagram, as (run, tag) pairs)."""
        sealed, oversize = [], []
        target = self._target()
        if self._size + len(run) > target:
            if self._runs and len(run) <= target:
                sealed += self._flush_into(oversize)
            elif len(run) > target:
                self._cut(run, tag, target, sealed, oversize)
                return sealed, oversize
        self._runs.append((run, tag, records))
        self._size += len(run)
        self.pending += records
        return sealed, oversize

    def _cut(self, encoded: bytes, tag, target: int, sealed: list, oversize: list) -> None:
        """A run larger than the room left: its records fill this datagram and the next ones;
        a record that alone does not fit an empty datagram is oversize."""
        run = runs.Run.decode(encoded, trusted=True)
        overhead = runs.HEADER_BYTES + len(run.topic.encode())
        ends = list(accumulate(run.record_sizes()))  # bytes of records [0, i] in the run
        i, done = 0, 0  # next record; bytes of records before it
        while i < len(run):
            room = target - self._size - overhead
            j = bisect_right(ends, done + room)  # records [i, j) fit the room left
            if j == i:
                if self._runs:  # start a new datagram and try again
                    sealed += self._flush_into(oversize)
                    continue
                # alone it may fit after all: compressed, or with a shorter tag than the budget
                # assumes; sealing it alone decides (oversize if not)
                self._runs.append((run.take([i]).encode(), tag, 1))
                self.pending += 1
                sealed += self._flush_into(oversize)
                done, i = ends[i], i + 1
                continue
            piece = run.take(range(i, j)).encode()
            self._runs.append((piece, tag, j - i))
            self._size += len(piece)
            self.pending += j - i
            done, i = ends[j - 1], j
            if i < len(run):
                sealed += self._flush_into(oversize)

    def flush(self) -> tuple[list[Sealed], list]:
        oversize = []
        sealed = self._flush_into(oversize)
        return sealed, oversize

    def _flush_into(self, oversize: list) -> list[Sealed]:
        pending, self._runs, self._size, self.pending = self._runs, [], 0, 0
        sealed = []
        if pending:
            self._seal_into(pending, sealed, oversize)
        return sealed

    def _seal_into(self, pending, sealed, oversize):
        payload = b"".join(run for run, _, _ in pending)
        # A payload the receiver would refuse to decompress is never sent, however well it
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
            for _, tag, n in pending:
                tag_counts[tag] = tag_counts.get(tag, 0) + n
            sealed.append(Sealed(datagram, tag_counts))
            return
        if len(pending) > 1:
            half = len(pending) // 2
            self._seal_into(pending[:half], sealed, oversize)
            self._seal_into(pending[half:], sealed, oversize)
            return
        encoded, tag, n = pending[0]
        if n == 1:
            oversize.append((encoded, tag))
            return
        first, second = runs.Run.decode(encoded, trusted=True).split_at(n // 2)
        self._seal_into([(first.encode(), tag, n // 2)], sealed, oversize)
        self._seal_into([(second.encode(), tag, n - n // 2)], sealed, oversize)
