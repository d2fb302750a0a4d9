"""Records larger than one datagram: splitting on the packer, reassembly on the unpacker.

How a large record crosses. The packer takes the record alone as a run (diode.link.runs),
compresses it as a whole and `split`s that payload into chunks. Each chunk travels in its own
datagram of kind FRAGMENT, sealed by the session like a data datagram: its own sequence number
(so its own nonce and its own place in the replay window), its own AEAD tag. The header's
routing key is the group id, so every chunk of a record reaches the same unpacker. Inside the
encrypted body, a small fragment header precedes the chunk:

    version   uint8    FRAGMENT_VERSION
    group_id  uint64   the sequence number of the group's first fragment: unique in the session,
                       as sequence numbers are never reused
    index     uint32   0 .. count-1
    count     uint32   fragments in the group, >= 1
    total     uint64   length of the whole payload; every chunk is at least one byte, so
                       count <= total
    chunk     the rest of the body, 1 .. total bytes

(network byte order, 25 bytes). No digest of the payload: every fragment is authenticated by
its own tag, and the reassembler checks that the chunk lengths add up to `total`.

What bounds memory. A `Reassembler` (one per unpacker) buffers the chunks of incomplete groups,
keyed by (session id, group id). A group announcing more than `max_record_bytes` is refused at
its first fragment. The chunks buffered by all groups never exceed `max_bytes` bytes and there
are never more than `max_groups` groups: to make room, the group that made progress least
recently is evicted first. The keys of groups that are finished (completed, expired, evicted
or refused) are remembered, at most `max_closed` of them, so a late or duplicated fragment does
not open a new group that could never complete. (Python's per-chunk overhead is not counted in
`max_bytes`; with chunks near the datagram size it is a few percent.)

What happens when a fragment is lost. The record is lost as a whole: its group never
completes, is dropped `timeout` seconds after its last new fragment, and `expire()` reports it
(with how many of its fragments arrived) so the unpacker can log and count it. The record
itself is then missing from its partition's offset chain, and the loss accounting that watches
those chains (docs/design.md §4) reports it as a missing range, as it would a lost data datagram.
"""

import struct
from collections import OrderedDict, deque
from typing import NamedTuple

from diode.errors import RejectedDatagram

FRAGMENT_VERSION = 1
FRAGMENT_HEADER = struct.Struct("!BQIIQ")  # version, group_id, index, count, total
FRAGMENT_HEADER_BYTES = FRAGMENT_HEADER.size  # 25

_UINT32_MAX = 0xFFFFFFFF
_UINT64_MAX = 0xFFFFFFFFFFFFFFFF


class FragmentRejected(RejectedDatagram, ValueError):
    """A fragment was dropped. `reason` is the metrics label: malformed_fragment,
    record_too_large, inconsistent_fragment.

    A RejectedDatagram (the fragment's datagram is dropped, and counted as any other) and a
    ValueError (it is bad input)."""


class Fragment(NamedTuple):
    group_id: int
    index: int
    count: int
    total: int
    chunk: bytes


def split(payload: bytes, group_id: int, chunk_bytes: int) -> list[bytes]:
    """The bodies of the fragments carrying `payload` (fragment header + chunk), in order.

    `chunk_bytes` is how much payload fits in one datagram once the wire header, the AEAD tag
    and FRAGMENT_HEADER_BYTES are taken off; every chunk but the last is that long.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be at least 1, got {chunk_bytes} (is the datagram "
                         f"size smaller than its headers?)")
    if not payload:
        raise ValueError("an empty payload cannot be fragmented")
    if not 0 <= group_id <= _UINT64_MAX:
        raise ValueError(f"group id {group_id} does not fit in 64 bits")
    total = len(payload)
    count = -(-total // chunk_bytes)
    if count > _UINT32_MAX:
        raise ValueError(f"{total} bytes in chunks of {chunk_bytes} would make {count} "
                         f"fragments, more than a fragment header can count")
    view = memoryview(payload)
    return [
        FRAGMENT_HEADER.pack(FRAGMENT_VERSION, group_id, i, count, total)
        + view[i * chunk_bytes:(i + 1) * chunk_bytes]
        for i in range(count)
    ]


def _malformed(detail: str) -> FragmentRejected:
    return FragmentRejected("malformed_fragment", detail)


def _check(f: Fragment) -> None:
    """Raise FragmentRejected('malformed_fragment') unless the fields can describe a fragment
    that `split` could have made."""
    if 0 < f.count <= f.total and f.index < f.count and 0 < len(f.chunk) <= f.total:
        return  # (the usual case: no message built)
    where = f"fragment {f.index} of group {f.group_id}"
    if f.count == 0:
        raise _malformed(f"{where}: count is 0")
    if f.index >= f.count:
        raise _malformed(f"{where}: index is not below the count {f.count}")
    if f.total == 0:
        raise _malformed(f"{where}: total payload length is 0")
    if f.count > f.total:
        raise _malformed(f"{where}: {f.count} fragments cannot carry only {f.total} bytes")
    if not f.chunk:
        raise _malformed(f"{where}: empty chunk")
    raise _malformed(f"{where}: chunk of {len(f.chunk)} bytes is longer than the "
                     f"{f.total}-byte payload")


def parse(body) -> Fragment:
    """The fragment in a decrypted FRAGMENT datagram body (bytes, bytearray or memoryview; the
    chunk is copied, so it does not keep the datagram's buffer alive).

    Raises FragmentRejected('malformed_fragment'), a ValueError, on anything `split` could not
    have produced."""
    if len(body) < FRAGMENT_HEADER_BYTES:
        raise _malformed(f"{len(body)} bytes, shorter than the {FRAGMENT_HEADER_BYTES}-byte "
                         f"fragment header")
    version, group_id, index, count, total = FRAGMENT_HEADER.unpack_from(body)
    if version != FRAGMENT_VERSION:
        raise _malformed(f"fragment version {version}, this receiver speaks {FRAGMENT_VERSION}")
    fragment = Fragment(group_id, index, count, total, bytes(body[FRAGMENT_HEADER_BYTES:]))
    _check(fragment)
    return fragment


class _Group:
    __slots__ = ("chunks", "count", "last", "size", "total")

    def __init__(self, count: int, total: int, now: float):
        self.count = count
        self.total = total
        self.chunks: dict[int, bytes] = {}
        self.size = 0      # bytes buffered
        self.last = now    # when the group last received a new chunk


class Reassembler:
    """Puts fragment groups back together; one per unpacker, pure (the caller passes the time).

    Every fragment is either stored, ignored (a repeat of a stored index, or a fragment of a
    group already finished) or refused with FragmentRejected. A refused group is dropped whole:
    a group with one inconsistent piece cannot be trusted to rebuild its record.

    `timeout` is an idle time: a group is dropped when no new fragment of it arrived for that
    long, so a large record crossing a slow, paced link is kept while it is still arriving.
    """

    def __init__(self, max_record_bytes: int, max_bytes: int = 256 * 1024 * 1024,
                 timeout: float = 10.0, max_groups: int = 4096, *, max_closed: int = 16384):
        if max_record_bytes < 1:
            raise ValueError(f"max_record_bytes must be at least 1, got {max_record_bytes}")
        if max_bytes < max_record_bytes:
            raise ValueError(f"max_bytes ({max_bytes}) must hold at least one record of "
                             f"max_record_bytes ({max_record_bytes})")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_groups < 1 or max_closed < 0:
            raise ValueError(f"max_groups ({max_groups}) must be at least 1 and max_closed "
                             f"({max_closed}) not negative")
        self.max_record_bytes = max_record_bytes
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.max_groups = max_groups
        self.max_closed = max_closed
        # (session, group) -> _Group, least recent progress first: expiry and eviction both
        # take from the front.
        self._groups: OrderedDict[tuple[int, int], _Group] = OrderedDict()
        # Keys of finished groups, oldest first: their late fragments are ignored.
        self._closed: OrderedDict[tuple[int, int], None] = OrderedDict()
        # Groups evicted since the last expire(), reported by it (the latest ones only, should
        # the caller not call expire() for a long time; the `evicted` count stays exact).
        self._evicted: deque = deque(maxlen=max(max_groups, max_closed))
        self.buffered_bytes = 0
        self.completed = 0   # payloads returned
        self.expired = 0     # groups dropped by the timeout
        self.evicted = 0     # groups dropped to stay within max_bytes / max_groups
        self.rejected = 0    # fragments refused with FragmentRejected
        self.ignored = 0     # duplicates and late fragments of finished groups

    @property
    def groups(self) -> int:
        """Incomplete groups buffered."""
        return len(self._groups)

    def holds(self, session_id: int, group_id: int) -> bool:
        """Whether fragments of this group are buffered (the group is not complete yet)."""
        return (session_id, group_id) in self._groups

    def add(self, session_id: int, fragment: Fragment, now: float) -> bytes | None:
        """Store a fragment of `session_id`'s group. Returns the whole payload when this
        fragment completes its group (once), otherwise None.

        Raises FragmentRejected: 'record_too_large' when the group announces more than
        max_record_bytes, 'inconsistent_fragment' when the fragment contradicts its group (other
        count or total, or chunk lengths that cannot add up to the total), 'malformed_fragment'
        when its fields are impossible. Nothing of a refused group stays buffered."""
        key = (session_id, fragment.group_id)
        try:
            _check(fragment)
        except FragmentRejected:
            self.rejected += 1
            raise
        if key in self._closed:
            self.ignored += 1
            return None
        group = self._groups.get(key)
        if group is None:
            if fragment.total > self.max_record_bytes:
                self._close(key)
                self.rejected += 1
                raise FragmentRejected(
                    "record_too_large",
                    f"session {session_id:016x} group {fragment.group_id}: {fragment.total} "
                    f"bytes, over the {self.max_record_bytes}-byte limit of a record")
            count, total, have, size = fragment.count, fragment.total, 0, 0
        elif fragment.index in group.chunks:
            self.ignored += 1
            return None
        else:
            count, total, have, size = group.count, group.total, len(group.chunks), group.size
        chunk = fragment.chunk
        missing_after = count - have - 1  # fragments still to come, each at least one byte
        problem = None
        if (fragment.count, fragment.total) != (count, total):
            problem = (f"fragment {fragment.index} says {fragment.count} fragments of "
                       f"{fragment.total} bytes, earlier ones said {count} of {total}")
        elif size + len(chunk) + missing_after > total:
            problem = (f"fragment {fragment.index} of {len(chunk)} bytes: the chunks cannot "
                       f"add up to {total} bytes")
        elif missing_after == 0 and size + len(chunk) != total:
            problem = (f"all {count} fragments arrived but carry {size + len(chunk)} bytes, "
                       f"not {total}")
        if problem is not None:
            self._drop(key)
            self._close(key)
            self.rejected += 1
            raise FragmentRejected(
                "inconsistent_fragment",
                f"session {session_id:016x} group {fragment.group_id}: {problem}; the group "
                f"is dropped")
        if missing_after == 0:
            if group is None:  # a group of one fragment
                payload = bytes(chunk)
            else:
                group.chunks[fragment.index] = chunk
                payload = b"".join(group.chunks[i] for i in range(count))
                self._drop(key)
            self._close(key)
            self.completed += 1
            return payload
        if group is None:
            while len(self._groups) >= self.max_groups:
                self._evict_oldest()
            group = self._groups[key] = _Group(count, total, now)
        # Room first (never evicting this group: it moves to the back, and its own bytes stay
        # within its total, which is within max_bytes), then store.
        self._groups.move_to_end(key)
        while self.buffered_bytes + len(chunk) > self.max_bytes:
            self._evict_oldest()
        group.chunks[fragment.index] = chunk
        group.size += len(chunk)
        group.last = now
        self.buffered_bytes += len(chunk)
        return None

    def expire(self, now: float) -> list[tuple[int, int, int, int]]:
        """Drop the groups that received no new fragment for more than `timeout` seconds.

        Returns (session_id, group_id, received_chunks, count) for every group dropped
        incomplete since the last call: those timed out now, then those evicted earlier to stay
        within bounds (counted apart in `expired` and `evicted`). Each is a lost record."""
        dropped = list(self._evicted)
        self._evicted.clear()
        while self._groups:
            key, group = next(iter(self._groups.items()))
            if now - group.last <= self.timeout:
                break
            self._drop(key)
            self._close(key)
            self.expired += 1
            dropped.append((key[0], key[1], len(group.chunks), group.count))
        return dropped

    def _evict_oldest(self) -> None:
        key, group = next(iter(self._groups.items()))
        self._drop(key)
        self._close(key)
        self.evicted += 1
        self._evicted.append((key[0], key[1], len(group.chunks), group.count))

    def _drop(self, key) -> None:
        group = self._groups.pop(key, None)
        if group is not None:
            self.buffered_bytes -= group.size

    def _close(self, key) -> None:
        if self.max_closed == 0:
            return
        self._closed[key] = None
        self._closed.move_to_end(key)
        while len(self._closed) > self.max_closed:
            self._closed.popitem(last=False)
