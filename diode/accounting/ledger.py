"""The streaming audit's memory of one source partition, as pure logic (no Spark, no Kafka).

A micro-batch hands over, per source partition, the runs of consecutive source offsets it holds
(already merged by Spark), its record count, the records that arrived after a later one, and any
heartbeat claim ("the sender sent up to offset L"). The ledger keeps the runs seen so far, merged,
so its size is the number of holes, not the number of records; it reports a hole the first time
it is seen ("missing") and again when a later batch fills any of it ("filled").

A claim from a heartbeat (receiver.heartbeat.topic: the sender's last offset sent, where its
chain started, and when the receiver got it: so a lost tail and a lost head show) is judged only
once the records it covers must have been written: when this source partition has a record
written `grace_ms` after the heartbeat came (its destination partition is read in order, so
everything written before is in), or, for a tail nothing came after, when the audit has caught
up with the topics and has known the claim for `grace_ms`. So records on their way, and an audit
catching up on history, do not raise false alarms. A lost head is judged only where the
destination partition still starts at offset 0 (past its retention, the first records are gone,
not missing).

When holes pile up past `max_runs`, the oldest are settled: they stay counted as missing, and
a later fill of them is no longer noticed (it counts as a duplicate).
"""

from dataclasses import dataclass, field

from diode.accounting.ranges import Range, holes, merge, overlap, subtract


@dataclass
class PartitionLedger:
    grace_ms: int = 60_000
    max_runs: int = 100_000
    runs: list = field(default_factory=list)
    records: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    reported: list = field(default_factory=list)  # holes reported missing, not yet filled
    claims: list = field(default_factory=list)  # [offset, received at, seen at, chain start]
    tail: int = -1  # the highest offset a heartbeat claimed, judged
    head: int | None = None  # the earliest chain start a heartbeat claimed, judged
    written: int = -1  # the latest receiver write time seen (ms, receiver.written.at.header)
    truncated: bool = False  # the destination partition did not start at offset 0
    settled: int = 0  # missing offsets in holes no longer followed (past max_runs)

    @property
    def last(self) -> int:
        return self.runs[-1][1] if self.runs else -1

    def add(self, runs: list[Range], records: int, out_of_order: int,
            written: int | None = None, destination_first: int = 0) -> None:
        """A batch's records: `runs` of distinct source offsets, `records` in all (so repeats
        within the batch are duplicates, and so are offsets seen before); `written`, the latest
        time one of them was written; `destination_first`, the lowest destination offset among
        them (above 0 in the first batch: retention or compaction removed the earliest records,
        so a head before them cannot be judged)."""
        if not self.runs and destination_first > 0:
            self.truncated = True
        if written is not None:
            self.written = max(self.written, written)
        runs = merge(runs)
        distinct = sum(b - a + 1 for a, b in runs)
        self.duplicates += records - distinct + overlap(self.runs, runs)
        self.records += records
        self.out_of_order += out_of_order
        self.runs = merge(self.runs + runs)

    def claim(self, offset: int, received_ms: int | None, now_ms: int,
              chain_start: int | None = None) -> None:
        """A heartbeat the receiver got at `received_ms` said the sender sent up to `offset`,
        in a chain that started at `chain_start`."""
        starts = [c[3] for c in self.claims if c[3] is not None] + \
            ([self.head] if self.head is not None else [])
        if offset > max(self.tail, max((c[0] for c in self.claims), default=-1)) or \
                (chain_start is not None and chain_start < min(starts, default=chain_start + 1)):
            self.claims.append([offset, received_ms, now_ms, chain_start])

    def settle(self, now_ms: int, caught_up: bool = True) -> tuple[list[Range], list[Range]]:
        """(newly missing, newly filled) ranges as of now; `caught_up`: the audit has read the
        topics to their end."""
        def due(c):
            return (c[1] is not None and self.written >= c[1] + self.grace_ms) or \
                (caught_up and now_ms - c[2] >= self.grace_ms)
        judged = [c for c in self.claims if due(c)]
        if judged:
            self.tail = max(self.tail, max(c[0] for c in judged))
            starts = [c[3] for c in judged if c[3] is not None]
            if starts:
                self.head = min(starts + ([self.head] if self.head is not None else []))
            self.claims = [c for c in self.claims if not due(c)]
        current = holes(self.runs, self.tail if self.runs else None)
        if self.runs and self.head is not None and self.head < self.runs[0][0] and \
                not self.truncated:
            current.insert(0, (self.head, self.runs[0][0] - 1))  # the chain's lost head
        filled = subtract(self.reported, current)
        missing = subtract(current, self.reported)
        self.reported = merge(subtract(self.reported, filled) + missing)
        if len(self.runs) > self.max_runs:  # settle the oldest holes: too many to follow
            drop = len(self.runs) - self.max_runs
            edge = self.runs[drop][1]
            self.runs = [(self.runs[0][0], edge)] + self.runs[drop + 1:]
            self.settled += sum(b - a + 1 for a, b in self.reported if a <= edge)
            self.reported = [r for r in self.reported if r[0] > edge]
        return missing, filled

    def open_ranges(self) -> list[Range]:
        return list(self.reported)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in (
            "runs", "records", "duplicates", "out_of_order", "reported", "claims", "tail", "head",
            "written", "truncated", "settled")}

    @classmethod
    def from_json(cls, data: dict, **settings) -> "PartitionLedger":
        ledger = cls(**settings)
        for k, v in data.items():
            setattr(ledger, k, [tuple(r) for r in v] if k in ("runs", "reported") else v)
        return ledger
