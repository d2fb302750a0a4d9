"""Replay protection: a sliding window of sequence numbers per sender session.

A datagram is checked only after its tag verified (so forged datagrams cannot move a window).
Within a session, a sequence number is accepted once; one more than `WINDOW` below the highest
seen is too old to tell and is rejected too (as IPsec's anti-replay window). Sessions are kept in
LRU order, at most MAX_SESSIONS: memory stays bounded whatever arrives.
"""

from collections import OrderedDict

from diode.errors import RejectedDatagram

WINDOW = 1 << 16          # sequence numbers of reordering tolerated (8 KiB of bits a session)
MAX_SESSIONS = 1024


class ReplayWindow:
    """Per session: the highest sequence number seen, and a ring of `window` bits (a bytearray:
    bit `seq % window`) of those accepted within the window below it. Moving the window on
    clears only the bits it passes over, so a datagram costs the same whatever the window's
    size (a shifted big integer of 65 536 bits cost a fifth of an unpacker's time)."""

    def __init__(self, window: int = WINDOW, max_sessions: int = MAX_SESSIONS):
        if window % 8:
            raise ValueError("the window is a whole number of bytes of bits")
        self.window = window
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, list] = OrderedDict()  # id -> [highest, ring]

    def check(self, session_id: int, seq: int) -> None:
        """Accept `seq` of `session_id` once; raise RejectedDatagram('replayed') otherwise."""
        state = self._sessions.get(session_id)
        w = self.window
        if state is None:
            if len(self._sessions) >= self.max_sessions:
                self._sessions.popitem(last=False)
            ring = bytearray(w // 8)
            i = seq % w
            ring[i >> 3] = 1 << (i & 7)
            self._sessions[session_id] = [seq, ring]
            return
        self._sessions.move_to_end(session_id)
        highest, ring = state
        i = seq % w
        if seq > highest:
            _clear(ring, highest + 1, seq - 1, w)
            ring[i >> 3] |= 1 << (i & 7)
            state[0] = seq
            return
        if highest - seq >= w:
            raise RejectedDatagram("replayed", f"session {session_id:016x} seq {seq} is older "
                                   f"than the replay window")
        if ring[i >> 3] >> (i & 7) & 1:
            raise RejectedDatagram("replayed", f"session {session_id:016x} seq {seq}")
        ring[i >> 3] |= 1 << (i & 7)


def _clear(ring: bytearray, first: int, last: int, window: int) -> None:
    """Clear the bits of sequence numbers first..last (the window moving on past them)."""
    n = last - first + 1
    if n <= 0:
        return
    if n >= window:
        ring[:] = bytes(len(ring))
        return
    if n <= 64:  # (the usual step: a few numbers)
        for seq in range(first, last + 1):
            i = seq % window
            ring[i >> 3] &= ~(1 << (i & 7)) & 0xFF
        return
    a = first % window
    b = a + n
    if b <= window:
        _clear_span(ring, a, b)
    else:
        _clear_span(ring, a, window)
        _clear_span(ring, 0, b - window)


def _clear_span(ring: bytearray, a: int, b: int) -> None:
    """Clear bits a..b-1 of the ring (no wrap)."""
    while a < b and a & 7:
        ring[a >> 3] &= ~(1 << (a & 7)) & 0xFF
        a += 1
    whole = (b - a) >> 3
    if whole:
        ring[a >> 3:(a >> 3) + whole] = bytes(whole)
        a += whole << 3
    while a < b:
        ring[a >> 3] &= ~(1 << (a & 7)) & 0xFF
        a += 1
