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
    def __init__(self, window: int = WINDOW, max_sessions: int = MAX_SESSIONS):
        self.window = window
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, list] = OrderedDict()  # id -> [highest, bitmap]

    def check(self, session_id: int, seq: int) -> None:
        """Accept `seq` of `session_id` once; raise RejectedDatagram('replayed') otherwise."""
        state = self._sessions.get(session_id)
        if state is None:
            if len(self._sessions) >= self.max_sessions:
                self._sessions.popitem(last=False)
            self._sessions[session_id] = [seq, 1]
            return
        self._sessions.move_to_end(session_id)
        highest, bits = state
        if seq > highest:
            shift = seq - highest
            bits = ((bits << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
            state[0], state[1] = seq, bits
            return
        age = highest - seq
        if age >= self.window:
            raise RejectedDatagram("replayed", f"session {session_id:016x} seq {seq} is older "
                                   f"than the replay window")
        if bits >> age & 1:
            raise RejectedDatagram("replayed", f"session {session_id:016x} seq {seq}")
        state[1] = bits | (1 << age)
