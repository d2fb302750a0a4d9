"""Consumer positions across the diode: the committed offsets of the source cluster's consumer
groups, translated into destination offsets and committed there for the same groups, so that a
consumer moved to the low side resumes where it stopped on the high side.

- `read_group_offsets` (sender, source cluster): the committed offsets of the groups whose id
  matches `sender.groups`, for the topics the diode replicates.
- `translate` (receiver, destination cluster): a committed source offset C of one source
  partition becomes the destination offset of the first record, of the same incarnation of that
  partition, whose source offset is C or more. When there is none yet, it becomes the offset
  just after the last record of that incarnation whose source offset is below C.
- `apply` (receiver, destination cluster): commits translated offsets for the group, only
  forward, and only while the group has no active members there; a checkpoint
  (diode.kafka.messages.group_checkpoint_record) is written to the checkpoints topic instead
  when it has.

Why "the first record at or after C": a committed offset C means "every record before C is
processed, C is the next to read". Source offsets are not contiguous (compaction, transaction
markers), and records lost on the link never reach the destination, so the record at C may not
be there; the first one that is, at or after C, is the next the consumer has not processed. It
resumes without skipping a record (the partition's records before it on the destination are
all below C: processed on the high side) and reprocesses nothing it had committed, but for
records resent later (`diode resend` fills a range lost on the link after the records that
followed it, so one below C may come after the position). Records before C that were lost on
the link are not waited for. MirrorMaker 2's checkpoints translate the same way
from its offset syncs (pairs of upstream and downstream offsets it writes as it replicates);
here the provenance headers the receiver writes on every record (sourceTopic, sourcePartition,
sourceOffset, sourceTopicId) are the offset syncs, one per record, so the translation is exact
rather than rounded down to the last sync.

Finding that record without reading the partition whole: within one incarnation the
kafka_writer writes a source partition in source order to the same partition number, so
sourceOffset grows with the destination offset, and a binary search over destination offsets
finds it (about 20 small fetches for a million records; a fetch reads a few records from a
probe point, skipping those that say nothing about the order). Records that say nothing are
skipped: those of another source partition spread into this one, those without provenance
headers (written by someone else), and resent ones (header diodeTicket: a `diode resend` fills
a gap later, after higher offsets). Records of another incarnation of the topic (recreated on
the source) are ordered as blocks: the incarnations seen at the partition's end after the last
record of the wanted one are newer (their records come after it), every other is older (before
it). The partition's end is read to the true end (Tansu's ListOffsets "latest" is short,
diode.kafka.recovery).
"""

import logging
from dataclasses import dataclass, field
from typing import Callable

from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaError, \
    KafkaException, TopicPartition

from diode.kafka import identity
from diode.kafka.messages import Provenance
from diode.kafka.recovery import _Reader

log = logging.getLogger("diode.kafka.groups")

MAX_GROUPS = 1000   # most groups read_group_offsets reads in one call (sorted by id)
OFFSETS_AT_ONCE = 50  # list_consumer_group_offsets requests in flight at once (one group each)
PROBE = 16          # records a probe of the search reads first; doubled while none is useful

OLDER, NEWER = float("-inf"), float("inf")  # the order key of another incarnation's record

# Why apply() left an offset uncommitted
ACTIVE = "the group has active members on the destination"
NOT_AHEAD = "not ahead of the group's commit on the destination"
# Errors of a commit refused because the group has members after all (one joined meanwhile)
_MEMBERS_ERRORS = (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                   KafkaError.REBALANCE_IN_PROGRESS)
_IDLE_STATES = (ConsumerGroupState.EMPTY, ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN)


# -- sender: the source cluster's committed offsets -----------------------------------------------

def read_group_offsets(admin, patterns, wanted: Callable[[str], bool],
                       timeout: float = 30.0) -> dict[str, dict[tuple[str, int], int]]:
    """group id -> {(topic, partition): committed offset} of every consumer group on the cluster
    of `admin` (an AdminClient) whose id fullmatches one of `patterns` (compiled regexes), with
    the offsets (>= 0) of the topics for which `wanted(topic)` is true; groups without any are
    left out. At most MAX_GROUPS groups, the first by id (a warning names how many more
    matched). A group deleted meanwhile is left out; other cluster errors raise KafkaException
    (the caller tries again later)."""
    listed = admin.list_consumer_groups(request_timeout=timeout).result(timeout + 5)
    if listed.errors:
        # (a broker that could not list its groups: the others' are not the whole answer)
        # (a KafkaError, which is not a KafkaException: raised as one, so that the caller's
        # `except KafkaException` tries again later rather than its thread dying)
        raise KafkaException(listed.errors[0])
    ids = sorted(g.group_id for g in listed.valid
                 if any(p.fullmatch(g.group_id) for p in patterns))
    if len(ids) > MAX_GROUPS:
        log.warning("%d consumer groups match sender.groups; the first %d by id are read, "
                    "%s and after are not: narrow the patterns", len(ids), MAX_GROUPS,
                    ids[MAX_GROUPS])
        ids = ids[:MAX_GROUPS]
    out: dict[str, dict[tuple[str, int], int]] = {}
    for i in range(0, len(ids), OFFSETS_AT_ONCE):
        futures = {gid: admin.list_consumer_group_offsets(
                       [ConsumerGroupTopicPartitions(gid)], request_timeout=timeout)[gid]
                   for gid in ids[i:i + OFFSETS_AT_ONCE]}
        for gid, future in futures.items():
            try:
                got = future.result(timeout + 5)
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                    continue  # deleted since it was listed
                raise
            offsets = {(tp.topic, tp.partition): tp.offset for tp in got.topic_partitions
                       if tp.error is None and tp.offset >= 0 and wanted(tp.topic)}
            if offsets:
                out[gid] = offsets
    return out


# -- receiver: translation ------------------------------------------------------------------------

class Translated(dict):
    """translate()'s answer: source offset -> destination offset, or None when it cannot be
    translated, and then `why` (None when every offset is translated). `ahead`: the source
    offsets past every record of the partition's current incarnation on the destination
    (translated to the position after its last): records at or after them may still be on
    their way, and with them records below them that were in flight."""

    why: str | None = None
    ahead: frozenset = frozenset()


def translate(settings: dict, destination_topic: str, destination_partition: int,
              incarnation: bytes, offsets, timeout: float = 30.0) -> Translated:
    """Committed source offsets of one source partition (the partition of the same number,
    whose records the kafka_writer writes to `destination_partition`), of its incarnation
    `incarnation` (16 bytes, diode.kafka.identity), translated into destination offsets:
    source offset C -> the destination offset of the first record of that incarnation and
    partition (not resent) whose sourceOffset is C or more; when there is none, the offset
    just after the last one whose sourceOffset is below C. None, saying why, when there is
    nothing to translate by: the topic does not exist, it has no partition of that number (the
    writer spreads the source partition over the others by key: no single position holds its
    records), or the partition holds no record of that incarnation and partition yet.

    `settings`: the destination's librdkafka settings (receiver.kafka). Binary search with a
    reader of its own (assigned, never in a group), a few small fetches per offset. DiodeError
    when the cluster cannot be reached, or stops answering, within `timeout` seconds."""
    wanted = sorted(set(offsets))
    out = Translated.fromkeys(wanted)
    if not wanted:
        return out
    dp = destination_partition
    with _Reader(settings, timeout) as r:
        count = r.partition_count(destination_topic)
        if not count:
            out.why = f"{destination_topic} does not exist on the destination"
            return out
        if count <= dp:
            out.why = (f"{destination_topic} has {count} partition(s): source partition {dp} is "
                       "spread over them by key, no position there holds its records")
            return out
        low, high = r.watermark(destination_topic, dp)

        def read(start: int, stop: int | None) -> list[tuple[int, bytes, int, int]]:
            found = []

            def take(msgs):
                for m in msgs:
                    if m.offset() >= start:  # (a chunk start gone: reset to the earliest)
                        if (p := provenance(m.offset(), m.headers())) is not None:
                            found.append(p)
            r.read_one(destination_topic, dp, (start, stop), take)
            return found

        found = translate_from(read, low, high, incarnation, dp, wanted)
        out.update(found)
        out.ahead = found.ahead
    if None in out.values():
        out.why = (f"{destination_topic}[{dp}] holds no record of source partition {dp} of "
                   f"incarnation {identity.text(incarnation)} to translate by")
    return out


def translate_from(read: Callable[[int, int | None], list], low: int, high: int,
                   incarnation: bytes, partition: int, offsets) -> dict[int, int | None]:
    """translate()'s answer for a partition whose records from `low` read(start, stop) gives as
    provenance tuples (stop None: to the true end), `high` its reported end: the end's records
    read first, then a search per offset, the offsets sharing the probes they have in common.

    Another incarnation's records are taken for older or newer by the end's records
    (newer_incarnations). That is wrong only for an incarnation between the wanted one and the
    one at the end (the source topic recreated twice since the offsets were read): its records
    are taken for older although they come after the wanted ones, which can only end the
    search short of them, so an offset may come out None (not translated), never wrong."""
    tail_start = max(low, high - PROBE)
    tail = read(tail_start, None)
    newer = newer_incarnations(tail, incarnation)

    def keyed(found):
        return [k for p in found if (k := order_key(p, incarnation, partition, newer))
                is not None]

    cache: dict[tuple[int, int], list] = {}

    def fetch(start: int, stop: int) -> list[tuple[int, float]]:
        if (start, stop) not in cache:
            cache[start, stop] = keyed(read(start, stop))
        return cache[start, stop]

    tail_keys = keyed(tail)
    out = Translated((c, search(c, low, tail_start, tail_keys, fetch))
                     for c in sorted(set(offsets)))
    # (the newest record of the wanted incarnation, when it is the partition's current one)
    top = max((key for _, key in tail_keys if key not in (OLDER, NEWER)), default=None)
    if top is not None and not newer:
        out.ahead = frozenset(c for c, at in out.items() if at is not None and c > top)
    return out


def provenance(offset: int, headers) -> tuple[int, bytes, int, int] | None:
    """(destination offset, incarnation, source partition, source offset) of a destination
    record with provenance headers; None for one without them (written by someone else) and
    for a resent one (diodeTicket: written out of order). A record naming no incarnation
    (written by a diode before incarnations) has incarnation b""."""
    p = Provenance.parse(headers)
    if p is None or p.ticket is not None:
        return None
    return offset, p.incarnation or b"", p.partition, p.offset


def newer_incarnations(tail: list, incarnation: bytes) -> set[bytes]:
    """The incarnations that come after `incarnation` in a partition, from its last records
    (`tail`, provenance tuples in offset order): those seen after the last record of it, all
    those seen when it is not there."""
    last = max((i for i, p in enumerate(tail) if p[1] == incarnation), default=-1)
    return {p[1] for p in tail[last + 1:]} - {incarnation}


def order_key(p: tuple, incarnation: bytes, partition: int,
              newer: set[bytes]) -> tuple[int, float] | None:
    """(destination offset, key) of a provenance tuple for the search: its source offset when
    it is of the wanted incarnation and partition, OLDER or NEWER for another incarnation's
    (`newer`: the incarnations newer than the wanted one), None (says
    nothing) for another source partition of the same incarnation."""
    offset, inc, source_partition, source_offset = p
    if inc == incarnation:
        return (offset, source_offset) if source_partition == partition else None
    return offset, NEWER if inc in newer else OLDER


def search(c: int, low: int, tail_start: int, tail: list,
           fetch: Callable[[int, int], list]) -> int | None:
    """The translation of source offset `c` (translate's rule) in a partition whose records
    from `low` are keyed by order_key: `tail` the keyed records from `tail_start` to the end
    (read already), fetch(start, stop) those of [start, stop), in offset order. Keys grow with
    the offset; records that say nothing are not among them.

    Binary search for the two keyed records around `c`: `above`, the first whose key is `c` or
    more, and `below`, the last before it, over [lo, hi): every keyed record before lo is below
    `c` (`below` the last of them) and none of [hi, above) is keyed. A probe reads PROBE
    records from the middle, then twice as many after them while none is keyed, up to hi."""
    i = next((i for i, (_, key) in enumerate(tail) if key >= c), len(tail))
    above = tail[i] if i < len(tail) else None
    below = tail[i - 1] if i else None
    lo, hi = low, tail_start if below is None else low
    while lo < hi:
        mid = (lo + hi) // 2
        start, size, keyed = mid, PROBE, []
        while start < hi and not keyed:
            stop = min(hi, start + size)
            keyed = fetch(start, stop)
            start, size = stop, size * 2
        if not keyed:
            hi = mid  # nothing keyed in [mid, hi)
            continue
        i = next((i for i, (_, key) in enumerate(keyed) if key >= c), len(keyed))
        if i < len(keyed):
            above = keyed[i]
            if i:  # both sides in one read: they are next to each other
                below = keyed[i - 1]
                break
            hi = mid
        else:
            below, lo = keyed[-1], start
    if above is not None and above[1] not in (OLDER, NEWER):
        return above[0]
    if below is not None and below[1] not in (OLDER, NEWER):
        return below[0] + 1
    return None


# -- receiver: committing ---------------------------------------------------------------------

@dataclass
class Applied:
    """What apply() did for one group: `committed` (destination topic, partition) -> offset
    committed now; `left` (destination topic, partition) -> (translated offset, why not: ACTIVE
    or NOT_AHEAD, the group's current commit there or None); `active`: the group has active
    members on the destination, so nothing was committed (write checkpoints instead)."""

    committed: dict = field(default_factory=dict)
    left: dict = field(default_factory=dict)
    active: bool = False


def apply(admin, group: str, offsets: dict[tuple[str, int], int],
          timeout: float = 30.0) -> Applied:
    """Commit translated `offsets` ((destination topic, partition) -> offset) for consumer group
    `group` on the destination cluster of `admin` (an AdminClient), when the group has no active
    members there (none, and a state of EMPTY, DEAD or UNKNOWN: a group that does not exist is
    DEAD on Kafka, EMPTY on Tansu), and only those ahead of what the group has committed there
    (a consumer on the low side is never moved back); offsets None (not translated) are left
    out. What was committed and what was left, and why, in the Applied; KafkaException on
    cluster errors (the caller tries again later)."""
    result = Applied()
    offsets = {tp: o for tp, o in offsets.items() if o is not None and o >= 0}
    if not offsets:
        return result
    described = admin.describe_consumer_groups([group], request_timeout=timeout)[group] \
        .result(timeout + 5)
    if described.members or described.state not in _IDLE_STATES:
        return _active(result, offsets)
    current = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in offsets])],
        request_timeout=timeout)[group].result(timeout + 5)
    now = {(tp.topic, tp.partition): tp.offset for tp in current.topic_partitions
           if tp.error is None and tp.offset >= 0}
    ahead = {}
    for tp, o in sorted(offsets.items()):
        if tp in now and now[tp] >= o:
            result.left[tp] = (o, NOT_AHEAD, now[tp])
        else:
            ahead[tp] = o
    if not ahead:
        return result
    try:
        done = admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o)
                                                  for (t, p), o in ahead.items()])],
            request_timeout=timeout)[group].result(timeout + 5)
    except KafkaException as exc:
        if exc.args[0].code() in _MEMBERS_ERRORS:
            return _active(result, ahead)  # a member joined since it was described
        raise
    for tp in done.topic_partitions:
        if tp.error is not None:
            if tp.error.code() in _MEMBERS_ERRORS:
                return _active(result, ahead)
            raise KafkaException(tp.error)
    result.committed = ahead
    return result


def _active(result: Applied, offsets: dict) -> Applied:
    result.active = True
    result.committed = {}
    result.left.update({tp: (o, ACTIVE, None) for tp, o in offsets.items()})
    return result
