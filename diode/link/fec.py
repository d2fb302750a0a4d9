"""Forward error correction across datagrams: k data datagrams + m parity per block (zfec).

The link has no return channel, so the receiver can rebuild a lost datagram only from what did
arrive. A packer puts its session's sealed data datagrams into blocks of k and sends m parity
payloads per block (Reed-Solomon over GF(2^8), zfec). An unpacker that holds any k of a block's
k + m datagrams rebuilds the missing data datagrams byte for byte, then verifies them like any
others. Their tags are inside the rebuilt bytes, so FEC adds no trust.

What it repairs
    Any m losses per block, data or parity. With interleaving depth D, D blocks fill side by side
    (data datagram n of a round goes to block n mod D). The parity of a round is returned
    interleaved the same way, so in the stream the packer sends (data in add() order, each parity
    right after the call that returned it), a block's datagrams are exactly D apart. A burst of
    up to D*m consecutive lost datagrams therefore costs each block at most m, and all of it is
    repaired. Other datagrams in between (heartbeats, other sessions) only widen the spacing. A
    block that loses more than m recovers nothing (never garbage). It counts as unrecoverable when
    it expires if at least one of its parity payloads arrived; without parity the receiver cannot
    tell a loss from nothing.

What it costs
    m/k extra datagrams. Each parity payload is as long as the longest data datagram of its block
    (shorter ones are zero-padded for coding), plus parity_overhead(k) bytes for the header and
    the block's sequence numbers and lengths, plus the parity datagram's own header and tag. So
    the packer must keep data datagrams that much under the datagram size. Parity of a full round
    leaves with the round's last data datagram (depth*k of them), at the latest at flush(). The
    sender holds at most depth*k datagrams. The receiver holds a block's datagrams until its first
    parity shows they all arrived (usually within depth*k datagrams), bounded by max_blocks,
    max_bytes and timeout.

Parity payload (network byte order; carried encrypted in a datagram of kind PARITY whose header
routing key is the same block id):

    version u8 | k u8 | m u8 | index u8 | padded length u32 | block id u32     (12 bytes)
    k x (seq u64 | original length u16)                                         (10 bytes each)
    parity bytes                                                                (padded length)

k is the number of data datagrams in the block (fewer than configured after flush()), index is
0..m-1, and padded length is the longest of the k lengths. zfec needs k + m <= 256.
"""

import struct
from collections import OrderedDict
from functools import lru_cache
from typing import NamedTuple

import zfec

VERSION = 1
PARITY_HEADER = struct.Struct("!BBBBII")   # version, k, m, index, padded length, block id
ENTRY = struct.Struct("!QH")               # seq, original length of one data datagram
MAX_SYMBOLS = 256                          # zfec: k + m <= 256
MAX_K = 255
MAX_LENGTH = 0xFFFF                        # a UDP payload (65 507 bytes) fits a u16
MAX_SEQ = (1 << 64) - 1
BLOCK_MASK = 0xFFFFFFFF                    # block ids are u32 and wrap
MAX_DEPTH = 1 << 16


def parity_overhead(k: int) -> int:
    """Bytes a parity payload adds to its block's longest data datagram (header, seqs, lengths)."""
    return PARITY_HEADER.size + k * ENTRY.size


class Parity(NamedTuple):
    """One parity payload of a block: which data datagrams it covers, and the coded bytes."""
    block_id: int
    k: int                    # data datagrams in the block
    m: int                    # parity payloads of the block
    index: int                # this one's, 0..m-1
    seqs: tuple               # the k data datagrams' sequence numbers, in block order
    lengths: tuple            # their lengths before padding
    data: bytes               # max(lengths) bytes


class ParityOut(NamedTuple):
    """A parity payload to seal and send, with the block id to use as its routing key."""
    block_id: int
    payload: bytes


def _check(p: Parity) -> None:
    """Raise ValueError unless `p` is a parity payload a correct sender could have produced."""
    if not 1 <= p.k <= MAX_K:
        raise ValueError(f"parity of block {p.block_id}: k={p.k}, must be 1..{MAX_K}")
    if not 1 <= p.m <= MAX_SYMBOLS - p.k:
        raise ValueError(f"parity of block {p.block_id}: m={p.m} with k={p.k}, "
                         f"must be 1..{MAX_SYMBOLS - p.k} (k + m <= {MAX_SYMBOLS})")
    if not 0 <= p.index < p.m:
        raise ValueError(f"parity of block {p.block_id}: index {p.index} is not below m={p.m}")
    if not 0 <= p.block_id <= BLOCK_MASK:
        raise ValueError(f"parity block id {p.block_id} does not fit 32 bits")
    if len(p.seqs) != p.k or len(p.lengths) != p.k:
        raise ValueError(f"parity of block {p.block_id}: k={p.k} but {len(p.seqs)} sequence "
                         f"numbers and {len(p.lengths)} lengths")
    previous = -1
    for seq in p.seqs:
        if not previous < seq <= MAX_SEQ:
            raise ValueError(f"parity of block {p.block_id}: sequence numbers {p.seqs} are not "
                             f"strictly increasing 64-bit numbers")
        previous = seq
    padded = max(p.lengths)
    if min(p.lengths) < 0 or padded > MAX_LENGTH:
        raise ValueError(f"parity of block {p.block_id}: datagram lengths {p.lengths} out of "
                         f"range 0..{MAX_LENGTH}")
    if len(p.data) != padded:
        raise ValueError(f"parity of block {p.block_id}: {len(p.data)} parity bytes, but the "
                         f"longest datagram of the block is {padded}")


def _pack(block_id, m, index, seqs, lengths, data) -> bytes:
    table = b"".join(ENTRY.pack(s, n) for s, n in zip(seqs, lengths))
    return PARITY_HEADER.pack(VERSION, len(seqs), m, index, len(data), block_id) + table + data


def encode_parity(parity: Parity) -> bytes:
    """The payload bytes of `parity`. Raises ValueError on what decode_parity would reject."""
    _check(parity)
    return _pack(parity.block_id, parity.m, parity.index, parity.seqs, parity.lengths,
                 bytes(parity.data))


def decode_parity(payload) -> Parity:
    """A parity payload (bytes-like, already authenticated). Raises ValueError if malformed."""
    view = memoryview(payload)
    if len(view) < PARITY_HEADER.size:
        raise ValueError(f"truncated parity payload: {len(view)} bytes, the header alone is "
                         f"{PARITY_HEADER.size}")
    version, k, m, index, padded, block_id = PARITY_HEADER.unpack_from(view)
    if version != VERSION:
        raise ValueError(f"parity payload version {version}, this receiver speaks {VERSION}")
    if k == 0 or m == 0 or k + m > MAX_SYMBOLS:
        raise ValueError(f"parity of block {block_id}: k={k}, m={m}; both must be at least 1, "
                         f"k + m <= {MAX_SYMBOLS}")
    expected = parity_overhead(k) + padded
    if len(view) != expected:
        raise ValueError(f"parity of block {block_id}: {len(view)} bytes, but k={k} and padded "
                         f"length {padded} make {expected}")
    entries = [ENTRY.unpack_from(view, PARITY_HEADER.size + i * ENTRY.size) for i in range(k)]
    parity = Parity(block_id, k, m, index, tuple(e[0] for e in entries),
                    tuple(e[1] for e in entries), bytes(view[parity_overhead(k):]))
    _check(parity)
    return parity


@lru_cache(maxsize=64)
def _encoder(k: int, n: int):
    return zfec.Encoder(k, n)


@lru_cache(maxsize=64)
def _decoder(k: int, n: int):
    return zfec.Decoder(k, n)


class BlockEncoder:
    """The sender side, one per session: groups data datagrams into interleaved blocks.

    A round is depth*k data datagrams: datagram n of the round goes to block base + n mod depth.
    When the round is full (or at flush()), every block of it is coded, and the parity payloads
    come back index-major, in the order the blocks received their last datagram. That keeps a
    block's datagrams exactly depth apart in the sent stream, parity included. Returning each
    block's parity as soon as it is complete would put its m parity payloads next to its last
    data datagram, and a burst of m + 1 would take the block out whatever the depth.

    m == 0 turns FEC off: every datagram gets its own block id (it still spreads the load over
    the unpackers), and nothing is kept.
    """

    def __init__(self, k: int, m: int, depth: int = 1, first_block: int = 0):
        if not 1 <= k <= MAX_K:
            raise ValueError(f"fec k={k}: must be 1..{MAX_K} data datagrams per block")
        if not 0 <= m <= MAX_SYMBOLS - k:
            raise ValueError(f"fec m={m} with k={k}: must be 0..{MAX_SYMBOLS - k} "
                             f"(zfec codes at most {MAX_SYMBOLS} datagrams per block)")
        if not 1 <= depth <= MAX_DEPTH:
            raise ValueError(f"fec depth={depth}: must be 1..{MAX_DEPTH} blocks")
        self.k, self.m, self.depth = k, m, depth
        self._base = first_block & BLOCK_MASK     # id of the round's first block
        self._n = 0                               # data datagrams added in this round
        self._blocks: list[list] = [[] for _ in range(depth)] if m else []
        self._last_seq = -1

    @property
    def enabled(self) -> bool:
        return self.m > 0

    @property
    def held(self) -> int:
        """Data datagrams held for blocks still open (at most depth*k)."""
        return sum(len(b) for b in self._blocks)

    def assign(self) -> int:
        """The block id of the next data datagram, for its header's routing key."""
        if not self.m:
            return self._base
        return (self._base + self._n % self.depth) & BLOCK_MASK

    def add(self, block_id: int, seq: int, datagram: bytes) -> list[ParityOut]:
        """Record a sealed data datagram. Returns parity to send right after it (often none)."""
        expected = self.assign()
        if block_id != expected:
            raise ValueError(f"data datagram seq {seq} was sealed for block {block_id}, but the "
                             f"next datagram belongs to block {expected}: call assign() just "
                             f"before sealing, once per datagram")
        if not self._last_seq < seq <= MAX_SEQ:
            raise ValueError(f"data datagram seq {seq} after seq {self._last_seq}: sequence "
                             f"numbers of a session must increase strictly")
        if len(datagram) > MAX_LENGTH:
            raise ValueError(f"data datagram seq {seq} is {len(datagram)} bytes, FEC codes at "
                             f"most {MAX_LENGTH}")
        self._last_seq = seq
        if not self.m:
            self._base = (self._base + 1) & BLOCK_MASK
            return []
        self._blocks[self._n % self.depth].append((seq, bytes(datagram)))
        self._n += 1
        if self._n < self.depth * self.k:
            return []
        return self._close_round()

    def flush(self) -> list[ParityOut]:
        """Parity of every partly filled block (coded with the datagrams it has); closes them."""
        if not self.m or not self._n:
            return []
        return self._close_round()

    def _close_round(self) -> list[ParityOut]:
        order = ((self._n + j) % self.depth for j in range(self.depth))   # by last datagram
        coded = [((self._base + j) & BLOCK_MASK, self._encode((self._base + j) & BLOCK_MASK,
                                                              self._blocks[j]))
                 for j in order if self._blocks[j]]
        self._blocks = [[] for _ in range(self.depth)]
        self._base = (self._base + self.depth) & BLOCK_MASK
        self._n = 0
        return [ParityOut(block_id, payloads[index])
                for index in range(self.m) for block_id, payloads in coded]

    def _encode(self, block_id: int, entries: list) -> list[bytes]:
        k = len(entries)
        seqs = [seq for seq, _ in entries]
        lengths = [len(d) for _, d in entries]
        padded = max(lengths)
        blocks = tuple(d.ljust(padded, b"\0") for _, d in entries)
        parity = _encoder(k, k + self.m).encode(blocks, tuple(range(k, k + self.m)))
        return [_pack(block_id, self.m, i, seqs, lengths, bytes(p)) for i, p in enumerate(parity)]


class _Block:
    """What a receiver holds of one block until it is complete, recovered or given up."""
    __slots__ = ("bytes", "created", "data", "index", "meta", "parity")

    def __init__(self, created: float):
        self.created = created
        self.data: dict[int, bytes] = {}     # seq -> data datagram
        self.parity: dict[int, bytes] = {}   # parity index -> parity bytes
        self.meta: Parity | None = None      # the first parity payload, without its bytes
        self.index: dict[int, int] = {}      # seq -> position in the block, once meta is known
        self.bytes = 0


class BlockDecoder:
    """The receiver side, one per unpacker: rebuilds lost data datagrams from parity.

    State per (session id, block id). Data datagrams are buffered until the block's first parity
    payload says which ones the block has. If they all arrived, the block is forgotten. If enough
    data and parity arrived, the missing ones are rebuilt and returned once. Otherwise the block
    waits for more until it is `timeout` seconds old. A block that is done leaves a small marker
    (also bounded and timed out) so that late datagrams of it neither re-open it nor cost memory.

    Memory is bounded whatever arrives: at most max_blocks blocks and max_bytes buffered bytes
    (oldest blocks evicted first), at most MAX_K data datagrams a block before its parity says how
    many it has, and 4*max_blocks done markers.

    Counters: recovered (data datagrams rebuilt), blocks_recovered, blocks_unrecoverable
    (dropped, by timeout or eviction, with data missing that parity could not fill: only known
    when some parity arrived), evicted (blocks dropped early to stay within the limits; those
    with known missing data also count as unrecoverable).
    """

    def __init__(self, max_blocks: int = 1024, max_bytes: int = 64 * 1024 * 1024,
                 timeout: float = 2.0):
        if max_blocks < 1 or max_bytes < 1 or timeout < 0:
            raise ValueError(f"fec decoder limits: max_blocks={max_blocks} and max_bytes="
                             f"{max_bytes} must be positive, timeout={timeout} not negative")
        self.max_blocks, self.max_bytes, self.timeout = max_blocks, max_bytes, timeout
        self.max_done = 4 * max_blocks
        self._blocks: OrderedDict[tuple, _Block] = OrderedDict()   # oldest first
        self._done: OrderedDict[tuple, float] = OrderedDict()      # key -> when it was done
        self._bytes = 0
        self.recovered = 0
        self.blocks_recovered = 0
        self.blocks_unrecoverable = 0
        self.evicted = 0

    @property
    def open_blocks(self) -> int:
        return len(self._blocks)

    @property
    def buffered_bytes(self) -> int:
        """Data and parity bytes held (per-block bookkeeping is bounded by max_blocks)."""
        return self._bytes

    def holds(self, session_id: int, block_id: int) -> bool:
        """Whether datagrams of this block are buffered for a recovery still possible."""
        return (session_id, block_id) in self._blocks

    def data(self, session_id: int, block_id: int, seq: int, datagram: bytes,
             now: float) -> list[bytes]:
        """An authenticated data datagram arrived. Usually returns []. If this datagram makes
        its block decodable (its parity came first), returns the other data datagrams rebuilt."""
        key = (session_id, block_id)
        if key in self._done:
            return []
        size = len(datagram)
        block = self._blocks.get(key)
        if block is None:
            if size > self.max_bytes:
                return []
            block = self._open(key, now)
        if seq in block.data:
            return []
        if block.meta is not None:
            i = block.index.get(seq)
            if i is None or size != block.meta.lengths[i]:
                return []                # not a datagram of this block as its parity describes
        elif len(block.data) >= MAX_K:
            return []
        if not self._make_room(size, key, now):
            return []
        block.data[seq] = bytes(datagram)
        block.bytes += size
        self._bytes += size
        return self._settle(key, block, now) if block.meta is not None else []

    def parity(self, session_id: int, parity: Parity, now: float) -> list[bytes]:
        """An authenticated parity payload arrived. Returns the data datagrams of its block it
        made recoverable (exact original bytes, each at most once), else []."""
        _check(parity)
        key = (session_id, parity.block_id)
        if key in self._done:
            return []
        size = len(parity.data)
        block = self._blocks.get(key)
        if block is None:
            if size > self.max_bytes:
                return []
            block = self._open(key, now)
        if block.meta is None:
            self._describe(block, parity)
        elif (parity.k, parity.m, parity.seqs, parity.lengths) != \
                (block.meta.k, block.meta.m, block.meta.seqs, block.meta.lengths):
            return []                    # contradicts the block's first parity: not usable
        if parity.index in block.parity:
            return []
        if not self._make_room(size, key, now):
            return []
        block.parity[parity.index] = bytes(parity.data)
        block.bytes += size
        self._bytes += size
        return self._settle(key, block, now)

    def expire(self, now: float) -> int:
        """Drop blocks more than `timeout` seconds old (and old done markers). Returns how many
        blocks were dropped."""
        dropped = 0
        while self._blocks:
            key, block = next(iter(self._blocks.items()))
            if now - block.created <= self.timeout:
                break
            self._drop(key, block, now)
            dropped += 1
        while self._done and now - next(iter(self._done.values())) > self.timeout:
            self._done.popitem(last=False)
        return dropped

    def _describe(self, block: _Block, parity: Parity) -> None:
        """The first parity of a block says which datagrams belong to it: keep only those."""
        block.meta = parity._replace(index=0, data=b"")
        block.index = {seq: i for i, seq in enumerate(parity.seqs)}
        for seq, d in list(block.data.items()):
            i = block.index.get(seq)
            if i is None or len(d) != parity.lengths[i]:
                del block.data[seq]
                block.bytes -= len(d)
                self._bytes -= len(d)

    def _settle(self, key: tuple, block: _Block, now: float) -> list[bytes]:
        """Forget the block if it is whole, rebuild what it misses if it can."""
        meta = block.meta
        if len(block.data) == meta.k:
            self._finish(key, block, now)
            return []
        if len(block.data) + len(block.parity) < meta.k:
            return []
        padded = max(meta.lengths)
        nums, pieces = [], []
        for seq, d in block.data.items():
            nums.append(block.index[seq])
            pieces.append(d.ljust(padded, b"\0"))
        for index, p in block.parity.items():
            if len(nums) == meta.k:
                break
            nums.append(meta.k + index)
            pieces.append(p)
        present = set(nums)
        primaries = _decoder(meta.k, meta.k + meta.m).decode(tuple(pieces), tuple(nums))
        rebuilt = [bytes(primaries[i][:meta.lengths[i]]) for i in range(meta.k)
                   if i not in present]
        self.recovered += len(rebuilt)
        self.blocks_recovered += 1
        self._finish(key, block, now)
        return rebuilt

    def _finish(self, key: tuple, block: _Block, now: float) -> None:
        del self._blocks[key]
        self._bytes -= block.bytes
        self._done[key] = now
        self._done.move_to_end(key)
        while len(self._done) > self.max_done:
            self._done.popitem(last=False)

    def _drop(self, key: tuple, block: _Block, now: float) -> None:
        if block.meta is not None:       # known and still open: data missing, parity too short
            self.blocks_unrecoverable += 1
        self._finish(key, block, now)

    def _open(self, key: tuple, now: float) -> _Block:
        while len(self._blocks) >= self.max_blocks:
            self._evict(next(iter(self._blocks)), now)
        block = self._blocks[key] = _Block(now)
        return block

    def _make_room(self, size: int, keep: tuple, now: float) -> bool:
        """Evict the oldest other blocks until `size` more bytes fit; False if they never do."""
        while self._bytes + size > self.max_bytes:
            victim = next((k for k in self._blocks if k != keep), None)
            if victim is None:
                return False
            self._evict(victim, now)
        return True

    def _evict(self, key: tuple, now: float) -> None:
        self.evicted += 1
        self._drop(key, self._blocks[key], now)
