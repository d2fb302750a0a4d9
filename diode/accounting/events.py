"""What diode writes for its operators, each defined once.

The receiver's events on `receiver.missing.records.topic` (a range missing, filled, a ticket
closed), the audit's events (`diode verify --stream`), the records of the heartbeat, digest and
group-checkpoint topics and the headers diode adds to records are JSON objects (headers: strings)
read by people, by diode's own readers (`diode tickets`, the restart's recovery, the audits) and
by whatever an operator builds on them. Each is defined here: its fields, in order, with their
JSON type and meaning; the missing-records events' reasons, with what each means, whether it is
a resend ticket, whether its records can be resent and what to do, are in
diode.accounting.reasons.

The writers build their events with `Event.build`, which refuses a field the definition lacks or
misses; the audits' Spark schemas come from `Event.spark_schema`; docs/events.md is generated from
here (`diode docs --events`) and a test keeps the two equal. Pure: no I/O.
"""

from typing import NamedTuple

from diode.accounting.reasons import REASONS


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
        spark = {"string": "string", "integer": "long", "boolean": "boolean"}
        chosen = [f for f in self.fields if not names or f.name in names]
        return ", ".join(f"{f.name} {f.spark or spark[f.type.split('|')[0]]}" for f in chosen)


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

# The reasons of the missing-records events, with their meanings: diode.accounting.reasons.


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

HEARTBEAT = Event("heartbeat", None, (
    Field("senderTime", "integer", "The sender's clock when it sent the heartbeat (ms)."),
    Field("receivedAt", "integer", "The receiver's clock when it recorded it (ms)."),
    Field("reader", "integer", "The kafka_reader that sent it."),
    Field("session", "string", "The sender session (a packer's crypto session) that sealed it."),
    Field("sourceCluster", "string|null", "The source cluster's id."),
    Field("partitions", "integer", "How many partitions it speaks for (lastSent)."),
    Field("counters", "object", "The reader's counters (records read, sent, ...)."),
    Field("lastSent", "array", "Per partition: topic, partition, offset (the last offset handed "
          "to the kernel), chainStart (where the sender's chain started), topicId, sourceEnd "
          "(the last offset the source held) and retired (an incarnation that went away)."),
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


HEADERS = (
    Header("sourceTopic", "every destination record", "The source topic (UTF-8)."),
    Header("sourcePartition", "every destination record", "The source partition (decimal)."),
    Header("sourceOffset", "every destination record", "The source offset (decimal)."),
    Header("sourceTopicId", "every destination record", "The source topic's id, the "
           "incarnation (22 characters of URL-safe base64)."),
    Header("writtenAt", "every destination record", "When the receiver wrote it (ms, decimal; "
           "`receiver.written.at.header`, empty: none). End-to-end latency is this minus the "
           "record's timestamp."),
    Header("diodeTicket", "a resent record in a ticket's range", "The ticket it fills."),
    Header("diode.destination.topic", "a record on `receiver.dead.letter.topic`",
           "The destination topic that refused it (its own headers and the provenance "
           "headers are kept)."),
    Header("diode.error", "a record on `receiver.dead.letter.topic`", "Why it was refused "
           "(librdkafka's error)."),
    Header("diodeError", "a record on `sender.dead.letter.topic` (source cluster)",
           "Why it was not sent: larger than `sender.max.record.bytes` (with the provenance "
           "headers)."),
)


# -- docs/events.md ----------------------------------------------------------------------------

def _fields(event: Event) -> list:
    return ["| field | type | meaning |", "| --- | --- | --- |",
            *(f"| `{f.name}` | {f.type.replace('|', ' or ')} | {f.meaning} |"
              for f in event.fields), ""]


def reference_markdown() -> str:
    """docs/events.md, from the definitions above (`diode docs --events`)."""
    out = ["# Events and records diode writes", "",
           "Generated from `diode/accounting/events.py` by `diode docs --events > "
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
            out += [event.about, "", *_fields(event)]
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
