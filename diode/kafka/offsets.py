"""What the sender may commit: the longest prefix of each partition whose records were sent.

A kafka_reader hands records to packers in messages of runs (diode.link.runs); a message may hold
runs of several partitions, and its records are sent (or dead-lettered) in pieces by several
processes, in any order. Each piece is acknowledged as (message id, record count). A partition's
commit position moves past a message only when that message and every earlier message holding the
partition are fully acknowledged. Pure logic, after MirrorMaker 2's PartitionState.
"""

from collections import deque


class SentTracker:
    def __init__(self):
        self._remaining: dict[int, int] = {}       # message id -> records not yet acknowledged
        self._parts: dict[int, list] = {}          # message id -> its partitions
        self._queues: dict[tuple, deque] = {}      # (topic, partition) -> deque[(msg id, last)]
        self._commit: dict[tuple, int] = {}        # (topic, partition) -> next offset to read
        self._dirty: set = set()
        self.inflight = 0                          # records dispatched, not acknowledged

    def dispatched(self, msg_id: int, parts) -> None:
        """Message `msg_id` went out with, per partition, ((topic, partition), last offset,
        record count): one entry per partition."""
        total = 0
        self._parts[msg_id] = []
        for tp, last, count in parts:
            self._parts[msg_id].append(tp)
            self._queues.setdefault(tp, deque()).append((msg_id, last))
            total += count
        self._remaining[msg_id] = total
        self.inflight += total

    def acknowledged(self, msg_id: int, count: int) -> None:
        """`count` records of message `msg_id` were handed to the kernel (or dead-lettered).
        Acknowledgements of unknown messages (from before a rewind) are ignored."""
        remaining = self._remaining.get(msg_id)
        if remaining is None:
            return
        count = min(count, remaining)
        self._remaining[msg_id] = remaining - count
        self.inflight -= count
        if remaining - count == 0:
            for tp in list(self._parts[msg_id]):
                self._advance(tp)
            if msg_id in self._parts and not self._parts[msg_id]:  # (its partitions forgotten)
                del self._parts[msg_id], self._remaining[msg_id]

    def _advance(self, tp) -> None:
        queue = self._queues[tp]
        while queue and self._remaining.get(queue[0][0]) == 0:
            msg_id, last = queue.popleft()
            self._commit[tp] = last + 1
            self._dirty.add(tp)
            parts = self._parts[msg_id]
            parts.remove(tp)
            if not parts:
                del self._parts[msg_id], self._remaining[msg_id]

    def idle(self, tp) -> bool:
        """Nothing of partition `tp` is in flight."""
        return not self._queues.get(tp)

    def positions(self) -> dict:
        """(topic, partition) -> the next offset to read after the committed prefix."""
        return dict(self._commit)

    def take_changed(self) -> dict:
        """Commit positions that moved since the last call."""
        changed = {tp: self._commit[tp] for tp in self._dirty}
        self._dirty.clear()
        return changed

    def retry(self, tps) -> None:
        """Report these positions as changed again (their commit failed)."""
        self._dirty.update(tp for tp in tps if tp in self._commit)

    def forget(self, tp) -> list:
        """Stop tracking partition `tp` (its topic is another incarnation now, or it is read
        again from elsewhere): acknowledgements of what was in flight no longer move its
        position, and nothing more of it is committed. Returns what of it was in flight:
        [(message id, last offset)], in order (see `sent`)."""
        inflight = list(self._queues.pop(tp, ()))
        for msg_id, _ in inflight:
            parts = self._parts.get(msg_id)
            if parts is not None and tp in parts:
                parts.remove(tp)
        self._commit.pop(tp, None)
        self._dirty.discard(tp)
        return inflight

    def sent(self, msg_id: int) -> bool:
        """Whether message `msg_id`, dispatched since the last reset(), is wholly sent."""
        return self._remaining.get(msg_id, 0) == 0

    def reset(self) -> None:
        """Forget everything in flight (after a rewind); keep the committed positions."""
        self._remaining.clear()
        self._parts.clear()
        self._queues.clear()
        self.inflight = 0
