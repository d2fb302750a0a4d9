"""What diode writes to Kafka and reads back, each defined, built and parsed here, once.

The headers diode adds to the records it writes (the provenance: sourceTopic, sourcePartition,
sourceOffset, sourceTopicId; the written-at header; a resent record's ticket; a dead letter's
why), the receiver's events on `receiver.missing.records.topic` (a range missing, filled, a
ticket closed), the audit's events (`diode verify --stream`) and the records of the heartbeat,
digest and group-checkpoint topics are read by people, by diode's own readers (`diode tickets`,
the restart's recovery, the group translation, the audits) and by whatever an operator builds on
them. Each is defined here: its fields, in order, with their JSON type and meaning (headers: their
names and what they say); the missing-records events' reasons, with what each means, whether it
is a resend ticket, whether its records can be resent and what to do, are in
diode.accounting.reasons.

Built here and nowhere else: `provenance_headers` (the writer's hot path, one header list per
record), `written_at_header`, `ticket_header`, `dead_letter_headers`, and the records of the
events, heartbeats, digests and group checkpoints (`range_record`, `heartbeat_record`,
`digest_record`, `group_checkpoint_record`, `audit_event`), through `Event.build`, which refuses
a field the definition lacks or misses. Parsed here: `Provenance.parse` (a record's headers as a
typed value) and `RangeEvent.parse` (an event of the missing-records topic); the audits read the
same headers as Spark columns through the names here (diode.spark.verify). The audits' Spark
schemas come from `Event.spark_schema`; docs/events.md is generated from here (`diode docs
--events`) and a test keeps the two equal; so are the field lists docs/topology.md and `diode
import-properties` give. tests/unit/test_structure.py checks that
no other module builds a header or an event. Pure: no I/O.
"""

import json
from typing import NamedTuple

from diode.accounting.reasons import REASONS
from diode.kafka import identity


class Field(NamedTuple):
    name: str
    type: str       # the JSON type: string, integer, boolean, object, array; "|null" if it may be
    meaning: str
    spark: str = ""  # its Spark type where the JSON type does not say (an integer is a long)


class Event(NamedTuple):
    """One kind of JSON object diode writes: `kind` is its `type` field's value, when it has
    one (the missing-records topic's events); `fields` every field, in the order written."""
    name: str
    kind: str | None
    fields: tuple
    about: str

    @property
    def names(self) -> tuple:
        return tuple(f.name for f in self.fields)

    def build(self, **values) -> dict:
        """The event with exactly the defined fields, in their order (`type` is filled in)."""
        if self.kind is not None:
            values = {"type": self.kind, **values}
        missing = [n for n in self.names if n not in values]
        extra = [n for n in values if n not in self.names]
        if missing or extra:
            raise ValueError(f"a {self.name} event: fields missing {missing}, not defined "
                             f"{extra}")
        return {n: values[n] for n in self.names}

    def spark_schema(self, *names: str) -> str:
        """Spark's DDL of these fields (all by default): for from_json and Parquet."""
        chosen = [f for f in self.fields if not names or f.name in names]
        return ", ".join(f"{f.name} {_spark(f)}" for f in chosen)


def _spark(field: Field) -> str:
    """A field's Spark type: its own, or its JSON type's (an integer is a long)."""
    return field.spark or {"string": "string", "integer": "long",
                           "boolean": "boolean"}[field.type.split("|")[0]]


# -- the missing-records topic ----------------------------------------------------------------

_SOURCE = (
    Field("sourceTopic", "string", "The source topic."),
    Field("sourcePartition", "integer", "The source partition.", spark="int"),
    Field("sourceTopicId", "string|null", "The incarnation of the source partition the offsets "
          "belong to: the source topic's id (KIP-516, 22 characters of URL-safe base64); null "
          "for records of no known incarnation."),
    Field("firstOffset", "integer", "The range's first source offset."),
    Field("lastOffset", "integer", "The range's last source offset (inclusive). On a compacted "
          "or transactional topic the range may span offsets that hold no record."),
)


def _range(kind: str) -> tuple:
    """The fields every event of the missing-records topic has, `kind` its type."""
    return (Field("type", "string", f"{kind}."), *_SOURCE,
            Field("reason", "string", "Why ([reasons](#reasons))."),
            Field("detectedAt", "integer", "When the receiver wrote the event (ms since the "
                  "epoch)."))


TICKET = Field("ticket", "string|null", "The resend ticket of the range (20 hexadecimal "
               "characters, the same in every event about the range, before and after a "
               "restart); null for a range that is not a ticket (a refused record).")

MISSING = Event("missing", "missing", (*_range("missing"), TICKET), (
    "A range of source offsets that was sent and did not arrive (or that the destination "
    "refused), reported once; again, with reason expired, when the source no longer holds it."))
FILLED = Event("filled", "filled", _range("filled"), (
    "Records of a range reported missing arrived after all (late on the link, or resent): "
    "they are written, and consumers of this topic must treat the event as a correction."))
CLOSED = Event("closed", "closed", (
    *_range("closed"), TICKET._replace(type="string", meaning="The ticket closed."),
    Field("state", "string", "filled, expired or untracked (its reason too)."),
    Field("openedAt", "integer", "When the range was reported (ms since the epoch)."),
    Field("closedAt", "integer", "When the ticket closed (ms since the epoch)."),
), "A resend ticket closed: the range it names needs nothing more, or can never be repaired.")

MISSING_RECORDS = (MISSING, FILLED, CLOSED)
MISSING_RECORDS_EVENT = {e.kind: e for e in MISSING_RECORDS}  # by its type



def missing_records_fields() -> str:
    """The fields of the missing-records topic's events in a line, for the settings' reference
    (docs/topology.md) and `diode import-properties`'s notes."""
    extra = [n for n in CLOSED.names if n not in MISSING.names]
    less = [n for n in MISSING.names if n not in FILLED.names]
    return (f"type missing: {', '.join(MISSING.names)}; filled: the same without "
            f"{', '.join(less)}; closed: with {', '.join(extra)}")


# -- the audit's events (diode verify --stream) ------------------------------------------------

AUDIT = Event("audit", None, (
    Field("type", "string", "missing (a range first seen missing) or filled (a later record "
          "filled it)."),
    *_SOURCE,
    Field("reason", "string", "audit."),
    Field("detectedAt", "integer", "When the audit wrote the event (ms since the epoch)."),
    Field("batch", "integer", "The micro-batch that found it."),
), "`diode verify --stream`'s events, to `--missing-topic` (the receiver's format, keyed "
   "`topic-partition`) and `--missing-parquet` (these columns).")


# -- the other topics ------------------------------------------------------------------------

def _struct(fields: tuple) -> str:
    """The Spark type of a JSON object with `fields`, inside a struct<...>."""
    return ", ".join(f"{f.name}: {_spark(f)}" for f in fields)


LAST_SENT = (
    Field("topic", "string", "The source topic."),
    Field("partition", "integer", "The source partition.", spark="int"),
    Field("offset", "integer", "The last offset the sender handed to the kernel."),
    Field("chainStart", "integer", "Where the sender's chain started."),
    Field("topicId", "string", "The incarnation (the source topic's id)."),
    Field("sourceEnd", "integer", "The last offset the source held."),
    Field("retired", "boolean", "An incarnation that went away."),
)  # a heartbeat's lastSent items, in the order written
_LAST_SENT_NAMES = tuple(f.name for f in LAST_SENT)

HEARTBEAT = Event("heartbeat", None, (
    Field("senderTime", "integer", "The sender's clock when it sent the heartbeat (ms)."),
    Field("receivedAt", "integer", "The receiver's clock when it recorded it (ms)."),
    Field("reader", "integer", "The kafka_reader that sent it."),
    Field("session", "string", "The sender session (a packer's crypto session) that sealed it."),
    Field("sourceCluster", "string|null", "The source cluster's id."),
    Field("partitions", "integer", "How many partitions it speaks for (lastSent)."),
    Field("counters", "object", "The reader's counters (records read, sent, ...)."),
    Field("lastSent", "array", "Per partition the reader speaks for, an object: "
          "[lastSent](#lastsent).", spark=f"array<struct<{_struct(LAST_SENT)}>>"),
), "Each heartbeat received, keyed by session, like MirrorMaker's heartbeats: `diode verify "
   "--heartbeat-topic` finds a lost head and tail from them.")

DIGEST = Event("digest", None, (
    *_SOURCE[:3],
    Field("firstOffset", "integer", "The first source offset the digest covers."),
    Field("lastOffset", "integer", "The last source offset it covers (inclusive)."),
    Field("count", "integer", "How many records the sender read in the range."),
    Field("digest", "string", "BLAKE2b of each record's key, value, headers and timestamp, in "
          "order (hex; docs/wire-format.md, kind 6)."),
    Field("sentAt", "integer", "The sender's clock when it sent the digest (ms)."),
    Field("sourceCluster", "string|null", "The source cluster's id."),
    Field("resend", "boolean", "The digest of a range `diode resend` read again."),
), "The sender's digest of a range it read, keyed `topic-partition`: `diode verify "
   "--digest-topic` proves the destination's records against it.")

GROUP_CHECKPOINT = Event("group checkpoint", None, (
    Field("consumerGroupId", "string", "The consumer group (the key has this, topic and "
          "partition)."),
    Field("topic", "string", "The destination topic."),
    Field("partition", "integer", "The destination partition."),
    Field("upstreamOffset", "integer", "The offset the group committed on the source."),
    Field("downstreamOffset", "integer", "Its translation: the destination offset to resume "
          "from."),
    Field("sourceTopic", "string", "The source topic."),
    Field("sourcePartition", "integer", "The source partition.", spark="int"),
    Field("sourceTopicId", "string|null", "The incarnation the source offset belongs to."),
    Field("time", "integer", "When the receiver translated it (ms)."),
), "A consumer group's source position translated to the destination, keyed by group, topic "
   "and partition (the topic is compacted), as MirrorMaker 2's checkpoints: a consumer active "
   "on the low side seeks itself by it.")

TOPICS = ((("receiver.missing.records.topic", "keyed `topic-partition` of the source, so that "
            "each source partition's events are in order"), MISSING_RECORDS),
          (("diode verify --stream --missing-topic", ""), (AUDIT,)),
          (("receiver.heartbeat.topic", ""), (HEARTBEAT,)),
          (("receiver.digest.topic", ""), (DIGEST,)),
          (("receiver.group.checkpoints.topic", ""), (GROUP_CHECKPOINT,)))


# -- headers -----------------------------------------------------------------------------------

class Header(NamedTuple):
    name: str
    on: str
    meaning: str


SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TOPIC_ID = (
    "sourceTopic", "sourcePartition", "sourceOffset", "sourceTopicId")
PROVENANCE = (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TOPIC_ID)  # in this order
WRITTEN_AT = "writtenAt"            # receiver.written.at.header's default
TICKET_HEADER = "diodeTicket"
DESTINATION_TOPIC_HEADER, ERROR_HEADER = "diode.destination.topic", "diode.error"
SENDER_ERROR_HEADER = "diodeError"

HEADERS = (
    Header(SOURCE_TOPIC, "every destination record", "The source topic (UTF-8)."),
    Header(SOURCE_PARTITION, "every destination record", "The source partition (decimal)."),
    Header(SOURCE_OFFSET, "every destination record", "The source offset (decimal)."),
    Header(SOURCE_TOPIC_ID, "every destination record", "The source topic's id, the "
           "incarnation (22 characters of URL-safe base64)."),
    Header(WRITTEN_AT, "every destination record", "When the receiver wrote it (ms, decimal; "
           "`receiver.written.at.header`, empty: none). End-to-end latency is this minus the "
           "record's timestamp."),
    Header(TICKET_HEADER, "a resent record in a ticket's range", "The ticket it fills."),
    Header(DESTINATION_TOPIC_HEADER, "a record on `receiver.dead.letter.topic`",
           "The destination topic that refused it (its own headers and the provenance "
           "headers are kept)."),
    Header(ERROR_HEADER, "a record on `receiver.dead.letter.topic`", "Why it was refused "
           "(librdkafka's error)."),
    Header(SENDER_ERROR_HEADER, "a record on `sender.dead.letter.topic` (source cluster)",
           "Why it was not sent: larger than `sender.max.record.bytes` (with the provenance "
           "headers)."),
)
HEADER_NAMES = frozenset(h.name for h in HEADERS)


MAX_PROVENANCES = 20_000  # source partitions whose provenance headers are kept made
_provenances: dict = {}  # (topic, partition, incarnation) -> (sourceTopic, sourcePartition,
#                          sourceTopicId or None): the headers alike on its every record


def _provenance(topic: str, partition: int, incarnation: bytes | None) -> tuple:
    """A source partition's own provenance headers, made once (kept for MAX_PROVENANCES
    partitions; past that, made at each call): with runs of one record spread over a thousand
    partitions, making them (the incarnation's text above all) came once a record."""
    key = (topic, partition, incarnation)
    made = _provenances.get(key)
    if made is None:
        made = ((SOURCE_TOPIC, topic.encode()), (SOURCE_PARTITION, b"%d" % partition),
                (SOURCE_TOPIC_ID, identity.text(incarnation).encode())
                if incarnation is not None else None)
        if len(_provenances) < MAX_PROVENANCES:
            _provenances[key] = made
    return made


def provenance_headers(topic: str, partition: int, incarnation: bytes | None, offsets,
                       own=None, extra=()) -> list:
    """The headers of each record at `offsets` of a source partition, as written: its own
    (`own`: one sequence per record, as a run's header_lists gives them, or None for none), the
    provenance (sourceTopic, sourcePartition, sourceOffset as Confluent's connector writes them,
    UTF-8 decimal, and sourceTopicId: the incarnation's text, diode.kafka.identity; left out
    when `incarnation` is None), then `extra` (the written-at header, a ticket). One list per
    record, each built in one display: the writer's hot path (diode.kafka.clients.produce_run)
    makes these per record, so nothing here is per record but the list and its offset, and
    nothing per run but a look-up (_provenance)."""
    st, sp, si = _provenance(topic, partition, incarnation)
    if si is None:
        if own is None:
            return [[st, sp, (SOURCE_OFFSET, b"%d" % o), *extra] for o in offsets]
        return [[*mine, st, sp, (SOURCE_OFFSET, b"%d" % o), *extra]
                for mine, o in zip(own, offsets)]
    if own is None:
        return [[st, sp, (SOURCE_OFFSET, b"%d" % o), si, *extra] for o in offsets]
    return [[*mine, st, sp, (SOURCE_OFFSET, b"%d" % o), si, *extra]
            for mine, o in zip(own, offsets)]


def written_at_header(name: str, now_ms: int) -> list:
    """receiver.written.at.header (`name`) saying `now_ms`, as a list of headers: empty when
    the setting is empty (no header)."""
    return [(name, str(now_ms).encode())] if name else []


def ticket_header(ticket: str) -> tuple:
    """The headers naming the ticket a resent record fills."""
    return ((TICKET_HEADER, ticket.encode()),)


def dead_letter_headers(headers: list, destination_topic: str, error: str) -> list:
    """A record refused by the destination for good, on receiver.dead.letter.topic: its headers
    as written (its own and the provenance), then which topic refused it and why."""
    return [*headers, (DESTINATION_TOPIC_HEADER, destination_topic.encode()),
            (ERROR_HEADER, error.encode())]


def sender_dead_letter_headers(headers: list, error: str) -> list:
    """A record the sender did not send, on sender.dead.letter.topic: its headers with the
    provenance (provenance_headers), then why."""
    return [*headers, (SENDER_ERROR_HEADER, error.encode())]


class Provenance(NamedTuple):
    """Where a destination record came from, as its headers say (the nearest diode's: a record
    that crossed two diodes keeps both provenances, and the one appended last counts)."""
    topic: str
    partition: int
    offset: int
    incarnation: bytes | None  # None: the nearest diode named none (older than topic ids),
    #                            or named none that parses
    ticket: str | None         # the ticket a resent record fills (written out of order)

    @classmethod
    def parse(cls, headers) -> "Provenance | None":
        """The provenance of a record's headers ((name, value) pairs, values bytes or None);
        None when they carry none (a record diode did not write) or one that does not parse.
        The last header of each name counts, as dict() takes them; sourceTopicId only when it
        comes after the last sourceOffset (the nearest diode wrote it), as the audit takes it
        (diode.spark.verify)."""
        if not headers:
            return None
        topic = partition = offset = named = ticket = None
        for k, v in headers:
            if k == SOURCE_OFFSET:
                offset, named = v, None
            elif k == SOURCE_TOPIC_ID:
                named = v
            elif k == SOURCE_PARTITION:
                partition = v
            elif k == SOURCE_TOPIC:
                topic = v
            elif k == TICKET_HEADER:
                ticket = v or b""
        try:
            return cls(topic.decode(), int(partition), int(offset),
                       identity.parse(named) if named else None,
                       ticket.decode(errors="replace") if ticket is not None else None)
        except (AttributeError, TypeError, ValueError):  # (absent, or not UTF-8, not decimal)
            return None


# -- the records of the topics above -----------------------------------------------------------

def _key(topic: str, partition: int) -> bytes:
    """The key of a source partition's events: `topic-partition`."""
    return f"{topic}-{partition}".encode()


_UNSET = object()


def range_record(kind: str, topic: str, partition: int, incarnation: bytes | None,
                 first: int, last: int, reason: str, detected_at: int, *, ticket=_UNSET,
                 state=_UNSET, opened_at=_UNSET, closed_at=_UNSET) -> tuple[bytes, bytes]:
    """(key, value) of an event of the missing-records topic: `kind` missing, filled or closed,
    of source offsets `first`..`last` of an incarnation (None: no known one). A missing event
    names its `ticket` (None: a range that is no ticket), a closed one its ticket, `state`,
    `opened_at` and `closed_at` (ms), a filled one none of these: ValueError otherwise."""
    more = {"ticket": ticket, "state": state, "openedAt": opened_at, "closedAt": closed_at}
    event = MISSING_RECORDS_EVENT[kind].build(
        sourceTopic=topic, sourcePartition=partition,
        sourceTopicId=identity.text(incarnation) if incarnation is not None else None,
        firstOffset=first, lastOffset=last, reason=reason, detectedAt=detected_at,
        **{k: v for k, v in more.items() if v is not _UNSET})
    return _key(topic, partition), json.dumps(event).encode()


class RangeEvent(NamedTuple):
    """An event of the missing-records topic as read back (range_record writes them): the
    fields every reader needs, typed; those a kind lacks are None."""
    kind: str                 # missing, filled or closed
    topic: str
    partition: int
    topic_id: str | None      # sourceTopicId as written (identity's text); None: no incarnation
    first: int
    last: int
    reason: str
    detected_at: int
    ticket: str | None = None
    state: str | None = None  # of a closed one: filled, expired or untracked
    closed_at: int | None = None

    @property
    def incarnation(self) -> bytes | None:
        """The incarnation its sourceTopicId names; None when it names none that parses."""
        return identity.parse(self.topic_id) if self.topic_id else None

    @classmethod
    def parse(cls, value) -> "RangeEvent | None":
        """The event of a record's value (JSON bytes), of its JSON object already loaded, or
        one parsed already; None for anything else (not JSON, not an object, another type, a
        range field missing or not a number). reason, detectedAt and the closed event's fields
        may be absent (0, "" or None then), as an older receiver's events may lack them."""
        if isinstance(value, RangeEvent):
            return value
        try:
            e = json.loads(value) if isinstance(value, (bytes, bytearray, str)) else value
            if not isinstance(e, dict) or e.get("type") not in MISSING_RECORDS_EVENT:
                return None
            named, ticket, closed = e.get("sourceTopicId"), e.get("ticket"), e.get("closedAt")
            return cls(e["type"], str(e["sourceTopic"]), int(e["sourcePartition"]),
                       str(named) if named is not None else None, int(e["firstOffset"]),
                       int(e["lastOffset"]), str(e.get("reason") or ""),
                       int(e.get("detectedAt") or 0), str(ticket) if ticket else None,
                       e.get("state"), int(closed) if closed is not None else None)
        except (KeyError, TypeError, ValueError):
            return None


def audit_event(kind: str, topic: str, partition: int, topic_id: str | None, first: int,
                last: int, detected_at: int, batch: int) -> dict:
    """An event of `diode verify --stream` (its `audit_record` is what goes to Kafka; the
    Parquet sink takes these as rows)."""
    return AUDIT.build(type=kind, sourceTopic=topic, sourcePartition=partition,
                       sourceTopicId=topic_id, firstOffset=first, lastOffset=last,
                       reason="audit", detectedAt=detected_at, batch=batch)


def audit_record(event: dict) -> tuple[bytes, bytes]:
    """(key, value) of an audit_event on `--missing-topic`: keyed as the receiver's."""
    return _key(event["sourceTopic"], event["sourcePartition"]), json.dumps(event).encode()


def heartbeat_record(session: str, sender_time: int | None, received_at: int,
                     reader: int | None, cluster: str | None, counters: dict,
                     partitions: list) -> tuple[bytes, bytes]:
    """(key, value) of a heartbeat received, keyed by its session; `partitions` the sender's
    (topic, partition, incarnation, chain start, last sent, source end, retired) of each."""
    return session.encode(), json.dumps(HEARTBEAT.build(
        senderTime=sender_time, receivedAt=received_at, reader=reader, session=session,
        sourceCluster=cluster, partitions=len(partitions), counters=counters,
        lastSent=[dict(zip(_LAST_SENT_NAMES, (t, p, last, start, identity.text(inc), end,
                                              retired)))
                  for t, p, inc, start, last, end, retired in partitions])).encode()


def digest_record(topic: str, partition: int, incarnation: bytes, first: int, last: int,
                  count: int, digest: bytes, sent_at: int, cluster: str | None,
                  resend: bool) -> tuple[bytes, bytes]:
    """(key, value) of the sender's digest of a range, keyed `topic-partition`."""
    return _key(topic, partition), json.dumps(DIGEST.build(
        sourceTopic=topic, sourcePartition=partition, sourceTopicId=identity.text(incarnation),
        firstOffset=first, lastOffset=last, count=count, digest=digest.hex(), sentAt=sent_at,
        sourceCluster=cluster, resend=resend)).encode()


def group_checkpoint_record(group: str, source_topic: str, source_partition: int,
                            source_offset: int, destination_topic: str,
                            destination_partition: int, destination_offset: int,
                            incarnation: bytes, now_ms: int) -> tuple[bytes, bytes]:
    """(key, value) of a group checkpoint: compact JSON, keyed by its first three fields
    (group, destination topic and partition), so a compacted topic keeps the last of each."""
    value = GROUP_CHECKPOINT.build(
        consumerGroupId=group, topic=destination_topic, partition=destination_partition,
        upstreamOffset=source_offset, downstreamOffset=destination_offset,
        sourceTopic=source_topic, sourcePartition=source_partition,
        sourceTopicId=identity.text(incarnation), time=now_ms)
    key = {n: value[n] for n in GROUP_CHECKPOINT.names[:3]}
    return (json.dumps(key, separators=(",", ":")).encode(),
            json.dumps(value, separators=(",", ":")).encode())


# -- docs/events.md ----------------------------------------------------------------------------

def _fields(fields: tuple) -> list:
    return ["| field | type | meaning |", "| --- | --- | --- |",
            *(f"| `{f.name}` | {f.type.replace('|', ' or ')} | {f.meaning} |"
              for f in fields), ""]


def reference_markdown() -> str:
    """docs/events.md, from the definitions above (`diode docs --events`)."""
    out = ["# Events and records diode writes", "",
           "Generated from `diode/kafka/messages.py` by `diode docs --events > "
           "docs/events.md`; a test keeps the two equal, and the receiver builds its events "
           "from the same definitions. Every object is JSON, one a record; fields are in the "
           "order written. What to do about each: [runbooks.md](runbooks.md), "
           "[troubleshooting.md](troubleshooting.md).", ""]
    for (where, keyed), defined in TOPICS:
        title = "`diode verify --stream`'s events" if where.startswith("diode") \
            else f"`{where}`"
        out += [f"## {title}", ""]
        if keyed:
            out += [f"One record per event, {keyed}.", ""]
        for event in defined:
            if len(defined) > 1:
                out += [f"### `{event.kind}`", ""]
            out += [event.about, "", *_fields(event.fields)]
            if event is HEARTBEAT:
                out += ["### `lastSent`", "", "Each item of a heartbeat's `lastSent`: what the "
                        "sender says of one source partition.", "", *_fields(LAST_SENT)]
        if defined is MISSING_RECORDS:
            out += ["### Reasons", "",
                    "The `reason` of an event, what the receiver's log line says of it "
                    "(`missing t[p] offsets a..b (meaning)`), whether it opens a resend "
                    "ticket, whether `diode resend` can bring its records back, and what to "
                    "do.", "",
                    "| reason | events | meaning | ticket | resendable? | what to do |",
                    "| --- | --- | --- | --- | --- | --- |",
                    *(f"| `{r.name}` | {r.events} | {r.meaning} | "
                      f"{'yes' if r.ticket else 'no'} | {r.resendable} | {r.action} |"
                      for r in REASONS), ""]
    out += ["## Headers diode adds", "",
            "| header | on | meaning |", "| --- | --- | --- |",
            *(f"| `{h.name}` | {h.on} | {h.meaning} |" for h in HEADERS)]
    return "\n".join(out) + "\n"
