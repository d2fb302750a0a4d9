"""Which claims a reader's heartbeat carries: what changed, and a bounded slice of the rest.

A claim is a heartbeat's word on one partition of the current chains, or on an incarnation
retired (diode.kafka.lineage): [topic, partition, incarnation, chain start, last offset sent,
last offset the source held, retired]. The receiver (diode.accounting.ordering) acts on each claim
it hears and on nothing else: a partition a heartbeat does not name is not taken as gone, so a
heartbeat need not name them all. With sender.heartbeat.claims.max set (`most`), each one carries
every claim that changed since it was last carried (records sent, a chain started, an incarnation
retired) and at most `most` of the unchanged, in turn: every claim is carried at least every
K = ceil(claims / most) heartbeats. A lost heartbeat delays what it carried by up to K heartbeats
(a lost tail of an idle partition, what a restarted receiver learns of a chain that went on while
it was down). The stopping heartbeats carry them all (a clean stop).

A claim also says when its chain was first named: the sender time (ms) of the first heartbeat
handed on that carried a claim of that chain (`named`), the same for the current and the
retired claim of one chain. The receiver takes a chain for one it saw start when it heard the
reader before that time (diode.accounting.ordering, "Where a chain starts"). Taken from the
heartbeat that happens to carry the claim now, a receiver started while the rotation went round
would take a chain named K heartbeats after it first heard the reader for one it saw start, and
report what was sent of it before it started as missing. Those times are kept for the chains
the current claims speak of, and no others, in this process: a reader started again names
its chains from its first heartbeat (they start again; a retired claim it remembers is named
anew, so a receiver started before the restart that had not heard that claim yet, its turn not
come, takes that chain for one it saw start). They cross in the heartbeat's counters
(diode.link.wire: a receiver that does not know them passes them on as counters); a receiver
hearing a sender that does not send them takes each heartbeat's own time, as before.

What holds on the receiver (diode.accounting.ordering): a chain is accounted from its start when
this receiver heard the reader before the chain was first named, whichever heartbeat carries its
claim; a tail is reported once a heartbeat claiming it has waited, at the latest K heartbeats
after one lost; records sent while a receiver was down are reported "receiver-down" once their
claim comes round; a retired incarnation is claimed at once, then in turn.
"""

import math


def _key(claim) -> tuple:
    """What a claim is about: a partition's incarnation, current or retired."""
    return claim[0], claim[1], claim[2], claim[6]


def _chain(claim) -> tuple:
    """Which chain a claim speaks of: a partition's incarnation and where the chain started
    (its current and its retired claim speak of the same)."""
    return claim[0], claim[1], claim[2], claim[3]


class ClaimSlices:
    def __init__(self, most: int):
        self.most = most          # unchanged claims a heartbeat carries (0: all of them)
        self.carried: dict = {}   # key -> the claim (a tuple) as a heartbeat last carried it
        self.order: list = []     # the keys, in the turn the unchanged are carried in
        self.in_order: set = set()
        self.turn = 0             # where the next slice of `order` starts
        self.next_turn = 0        # ... once the heartbeat chosen last is handed on
        self.changed = 0          # how many of the last choice had changed
        self.named: dict = {}     # chain -> sender time (ms) of the first heartbeat naming it

    def choose(self, claims: list, whole: bool = False) -> list:
        """Of the current `claims`, those the next heartbeat carries (all of them when `whole`
        or with no bound), as lists. Nothing counts as carried until `carried_now`. (With no
        bound only whether any changed is kept: `changed` is then 0 or 1.)"""
        if not self.most:
            claims = list(map(tuple, claims))
            self.changed, self.carried = int(claims != self.carried.get(None)), {None: claims}
            if self.changed:
                self._forget(claims)
            return list(map(list, claims))
        current = {_key(c): tuple(c) for c in claims}
        left = current.keys() != self.in_order and self._reorder(current)
        changed = [k for k, c in current.items() if self.carried.get(k) != c]
        self.changed = len(changed)
        if left or any(k in self.carried and self.carried[k][3] != current[k][3]
                       for k in changed):
            self._forget(current.values())
        self.next_turn = self.turn
        if whole or len(current) - len(changed) <= self.most:
            return list(map(list, current.values()))
        chosen, taken, seen, n = set(changed), 0, 0, len(self.order)
        while taken < self.most and seen < n:
            k = self.order[(self.turn + seen) % n]
            seen += 1
            if k not in chosen:
                chosen.add(k)
                taken += 1
        self.next_turn = (self.turn + seen) % n
        return [list(current[k]) for k in self.order if k in chosen]

    def _reorder(self, current: dict) -> bool:
        """The keys are `current`'s now: the gone leave the turn (the next slice starts where
        it would have), the new (claimed now, having changed) join it last, just before where
        the next slice starts. Whether any left."""
        before = [k for k in self.order[:self.turn] if k in current]
        after = [k for k in self.order[self.turn:] if k in current]
        new = [k for k in current if k not in self.in_order]
        left = len(before) + len(after) < len(self.order)
        self.order = before + new + after
        self.in_order = set(self.order)
        self.carried = {k: c for k, c in self.carried.items() if k in current}
        self.turn = self.next_turn = (len(before) + len(new)) % max(1, len(self.order))
        return left

    def _forget(self, claims) -> None:
        """Chains no claim speaks of any longer (a partition gone, a chain started again) are
        no longer named: their times are dropped."""
        live = set(map(_chain, claims))
        if not live.issuperset(self.named):
            self.named = {k: t for k, t in self.named.items() if k in live}

    def named_at(self, claims: list, now_ms: int) -> list:
        """For each of `claims` (the last chosen, for a heartbeat sent at `now_ms`, sender time),
        when its chain was first named: the sender time of the first heartbeat handed on that
        carried it, or `now_ms` for a chain this one names first."""
        named = self.named
        return [named.get(_chain(c), now_ms) for c in claims]

    def carried_now(self, claims: list, now_ms: int) -> None:
        """A heartbeat carrying `claims` (the last chosen), sent at `now_ms`, was handed on."""
        named = self.named
        for c in claims:
            named.setdefault(_chain(c), now_ms)
        if not self.most:
            return
        self.turn = self.next_turn
        for c in claims:
            self.carried[_key(c)] = tuple(c)

    def every(self) -> int:
        """K: within how many heartbeats every claim is carried, at the most."""
        if not self.most:
            return 1
        return max(1, math.ceil(len(self.order) / self.most))
