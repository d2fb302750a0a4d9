"""Resend tickets: every missing range the receiver reports is a ticket, from the report until
the range is filled (late records, an operator's `diode resend`) or can never be (the source
deleted it: expired).

A ticket's id is stable: a hash of the source identity (the topic id of the source partition's
incarnation), the topic, the partition and the range's first and last offsets, so that every
report of the same range, before and after a restart, names the same ticket. The hash is not
keyed: anyone can compute the id of any range. So a manifest range that is not its ticket's
(out_of_bounds) is a manifest edited without recomputing the ids, not proof of anything against
a holder of the link's key, who can recompute them, or leave them out.

The receiver's writers say everything about tickets on the missing-records topic (the event
`missing` opens one, `closed` closes it), so `diode tickets` on the low side folds that topic
(Book) and needs nothing else. Manifests of open tickets are authenticated (sign, check): an
HMAC-SHA256 under a key derived by HKDF from the link's master key with a label of its own. The
link's key is already on both hosts, so nothing new is distributed; an Ed25519 pair would let
the high side check without being able to sign, but the high side holds the link's key anyway
(it seals every datagram), so it would prove nothing more. What a check proves is that a holder
of the link's key made the manifest and that it was not changed since: the low side holds that
key, so whoever holds it there can write any manifest (docs/verification.md says what limits
one). Pure, apart from the clock's value passed in.
"""

import bisect
import hashlib
import hmac
import json
import struct
from dataclasses import dataclass
from typing import NamedTuple

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from diode.accounting import reasons
from diode.kafka.messages import RangeEvent
MANIFEST_LABEL = b"diode resend manifest v1"
STATES = ("open", *reasons.TICKET_CLOSED)


def ticket_id(topic_id: str | None, topic: str, partition: int, first: int, last: int) -> str:
    """The ticket of a missing range: 20 hex characters, the same wherever it is computed."""
    h = hashlib.blake2b(digest_size=10, person=b"diode-ticket")
    h.update(json.dumps([topic_id or "", topic, partition, first, last]).encode())
    return h.hexdigest()


@dataclass(slots=True)
class Open:
    """A ticket open in a partition's state (diode.accounting.ordering): a reported range,
    until no gap is left in it (or none the source holds). A checkpoint holds it as the list
    [first, last, opened, last_timestamp, held] (as_list, of_list)."""
    first: int
    last: int
    opened: int                  # when the range was reported (wall clock, ms)
    last_timestamp: int | None   # the source timestamp of the last record written before it
    held: int | None = None      # how many records the source holds in it (a resend's word)

    def as_list(self) -> list:
        return [self.first, self.last, self.opened, self.last_timestamp, self.held]

    @classmethod
    def of_list(cls, saved: list) -> "Open":
        return cls(*saved[:3], *(list(saved[3:5]) + [None, None])[:2])


class Closed(NamedTuple):
    """A ticket closed by a partition's state, and how (STATES[1:])."""
    first: int
    last: int
    opened: int
    how: str


class OpenTickets(list):
    """The open tickets of a partition's state (diode.accounting.ordering), sorted by first
    offset and disjoint: opened when a range is reported missing, closed (Closed) when no gap
    is left in them, when every record the source holds in them has arrived, or when what is
    left is below the source's log start."""
    __slots__ = ()

    def _index(self, first: int) -> int:
        """Where the first ticket starting at `first` or above is."""
        return bisect.bisect_left(self, first, key=lambda t: t.first)

    def open(self, first: int, last: int, now_ms: int, last_timestamp: int | None,
             most: int) -> list:
        """A reported missing range is a ticket from now on (once: a range reported again after
        a restart keeps its ticket). Returns the oldest tickets dropped to keep at most `most`
        open, closed "untracked"."""
        i = self._index(first)
        if i < len(self) and (self[i].first, self[i].last) == (first, last):
            return []
        self.insert(i, Open(first, last, now_ms, last_timestamp))
        dropped = []
        while len(self) > most:
            t = self.pop(0)
            dropped.append(Closed(t.first, t.last, t.opened, reasons.UNTRACKED))
        return dropped

    def due_by(self, deadline_ms: int, retention_ms: int) -> list:
        """The open tickets whose records retention deletes before `deadline_ms`, by their
        timestamps (a lower bound: the last record written before each): [first, last]."""
        return [[t.first, t.last] for t in self
                if t.last_timestamp is not None and t.last_timestamp + retention_ms < deadline_ms]

    def at(self, offset: int) -> Open | None:
        """The open ticket whose range holds `offset`, or None."""
        i = bisect.bisect_right(self, offset, key=lambda t: t.first) - 1
        return self[i] if i >= 0 and self[i].last >= offset else None

    def holds(self, first: int, last: int, count: int) -> None:
        """A resend read the source from `first` to `last` and found `count` records: the
        ticket of exactly that range is filled once that many of its records have arrived
        (on a compacted topic the rest never existed)."""
        i = self._index(first)
        if i < len(self) and (self[i].first, self[i].last) == (first, last):
            self[i].held = count

    def settle(self, first: int, last: int, gaps: list, log_start: int) -> list:
        """Close the open tickets overlapping [first, last] that no reported gap (`gaps`:
        sorted [first, last]) is left in, or whose records the source holds have all arrived
        (holds): "filled"; or whose gaps left are all below the source's `log_start`:
        "expired". Returned as Closed."""
        closed = []
        i = max(0, self._index(first) - 1)
        while i < len(self) and self[i].first <= last:
            t = self[i]
            if t.last < first:
                i += 1
                continue
            top = _highest_gap_in(gaps, t.first, t.last)
            if top is None or (t.held is not None and t.last - t.first + 1 -
                               _gap_records_in(gaps, t.first, t.last) >= t.held):
                closed.append(Closed(t.first, t.last, t.opened, reasons.FILLED))
                del self[i]
            elif top < log_start:
                closed.append(Closed(t.first, t.last, t.opened, reasons.EXPIRED))
                del self[i]
            else:
                i += 1
        return closed


def _gap_records_in(gaps: list, first: int, last: int) -> int:
    """How many offsets of [first, last] are still in `gaps`."""
    n, i = 0, max(0, bisect.bisect_left(gaps, [first]) - 1)
    while i < len(gaps) and gaps[i][0] <= last:
        n += max(0, min(gaps[i][1], last) - max(gaps[i][0], first) + 1)
        i += 1
    return n


def _highest_gap_in(gaps: list, first: int, last: int) -> int | None:
    """The highest offset in [first, last] still in `gaps` (None: none is)."""
    i = bisect.bisect_right(gaps, [last, float("inf")]) - 1
    if i >= 0 and gaps[i][1] >= first:
        return min(gaps[i][1], last)
    return None


class Ticket(NamedTuple):
    id: str
    topic: str
    partition: int
    topic_id: str | None
    first: int
    last: int
    reason: str
    opened_ms: int
    state: str = "open"        # STATES
    closed_ms: int | None = None
    at_risk: bool = False      # reported expired in part: the rest may go next

    @property
    def records(self) -> int:
        return self.last - self.first + 1

    def age_seconds(self, now_ms: int) -> float:
        return max(0, (self.closed_ms if self.closed_ms is not None else now_ms)
                   - self.opened_ms) / 1000

    def as_json(self, now_ms: int) -> dict:
        return {"ticket": self.id, "topic": self.topic, "partition": self.partition,
                "topicId": self.topic_id, "first": self.first, "last": self.last,
                "records": self.records, "reason": self.reason, "state": self.state,
                "openedAt": self.opened_ms, "closedAt": self.closed_ms,
                "ageSeconds": round(self.age_seconds(now_ms), 3)}


class Book:
    """Tickets as the missing-records topic's events tell them, in the order they were written
    (each source partition's events are in one partition of that topic, in order)."""

    def __init__(self):
        self.tickets: dict = {}  # id -> Ticket

    def add(self, event) -> None:
        """One event (a RangeEvent, or what RangeEvent.parse takes; anything else is passed
        over)."""
        e = RangeEvent.parse(event)
        if e is None or not e.ticket or e.kind not in ("missing", "closed"):
            return
        known = self.tickets.get(e.ticket)
        if e.kind == "missing":
            if e.reason == reasons.EXPIRED:
                if known is not None and known.state == "open":
                    self.tickets[e.ticket] = known._replace(at_risk=True)
            elif known is None:
                self.tickets[e.ticket] = Ticket(e.ticket, e.topic, e.partition, e.topic_id,
                                                e.first, e.last, e.reason, e.detected_at)
        elif known is not None and e.state in STATES[1:]:
            self.tickets[e.ticket] = known._replace(state=e.state, closed_ms=e.closed_at or 0)

    def select(self, which: str = "all") -> list:
        """Tickets by state ("open", "closed" or "all"), oldest first."""
        out = [t for t in self.tickets.values()
               if which == "all" or (t.state == "open") == (which == "open")]
        return sorted(out, key=lambda t: (t.opened_ms, t.topic, t.partition, t.first))


# -- manifests --------------------------------------------------------------------------------

def manifest_key(master: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=MANIFEST_LABEL).derive(master)


def _body(manifest: dict) -> bytes:
    """What the MAC covers: the manifest without its `auth`, canonically."""
    rest = {k: v for k, v in manifest.items() if k != "auth"}
    return json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()


def _mac(manifest: dict, master: bytes, key_id: int) -> str:
    """HMAC-SHA256 of the manifest's body and key id under the manifest key of `master`."""
    return hmac.new(manifest_key(master), struct.pack("!I", key_id) + _body(manifest),
                    hashlib.sha256).hexdigest()


def sign(manifest: dict, master: bytes, key_id: int) -> dict:
    """The manifest with its `auth`: HMAC-SHA256 under the manifest key of the link's master
    key `key_id`."""
    return {**manifest, "auth": {"alg": "HMAC-SHA256", "keyId": key_id,
                                 "mac": _mac(manifest, master, key_id)}}


def check(manifest: dict, keys: dict) -> str | None:
    """Why the manifest is not authentic under one of `keys` (key id -> master key), or None
    when it is: made by a holder of one of those keys, and not changed since."""
    auth = manifest.get("auth")
    if not isinstance(auth, dict) or auth.get("alg") != "HMAC-SHA256":
        return "it is not signed (no HMAC-SHA256 auth): write it with `diode tickets " \
               "--manifest` or `diode verify --manifest --topology`"
    key_id, mac = auth.get("keyId"), auth.get("mac")
    master = keys.get(key_id) if isinstance(key_id, int) else None
    if master is None:
        return f"it is signed with link key id {key_id!r}, which this topology does not hold"
    if not isinstance(mac, str) or not hmac.compare_digest(_mac(manifest, master, key_id), mac):
        return "its MAC does not match: it was altered, or signed with another link's key"
    return None


def out_of_bounds(manifest: dict) -> list[str]:
    """The ranges of a manifest's entries that name tickets which are not exactly the range of
    the ticket they came from, one line each: an entry that names tickets names one per range,
    and a ticket's id names exactly one range. (An entry of `diode verify` names none.)"""
    problems = []
    for entry in manifest.get("missing", []):
        ids = entry.get("tickets")
        if ids is None:
            continue
        where = f"{entry['topic']}[{entry['partition']}]"
        ranges = entry.get("ranges", [])
        if len(ids) != len(ranges):
            problems.append(f"{where}: {len(ranges)} range(s) but {len(ids)} ticket(s); each "
                            "range must name the ticket it came from")
        for (first, last), tid in zip(ranges, ids):
            if tid != ticket_id(entry.get("topicId"), entry["topic"], entry["partition"],
                                first, last):
                problems.append(f"{where} {first}..{last} is not the range of its ticket {tid} "
                                "(wider than the range reported missing, or another)")
    return problems


def manifest_of(tickets: list, now_ms: int, topology: str) -> dict:
    """The resend manifest of these tickets, per incarnation of a source partition (unsigned)."""
    entries: dict = {}
    for t in sorted(tickets, key=lambda t: (t.topic, t.partition, t.topic_id or "", t.first)):
        e = entries.setdefault((t.topic, t.partition, t.topic_id), {
            "topic": t.topic, "partition": t.partition,
            **({"topicId": t.topic_id} if t.topic_id else {}), "ranges": [], "tickets": []})
        e["ranges"].append([t.first, t.last])
        e["tickets"].append(t.id)
    return {"version": 2, "created": now_ms, "topology": topology,
            "missing": list(entries.values())}
