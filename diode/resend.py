"""`diode resend MANIFEST --topology FILE`: on the high side, send a resend manifest's ranges
again through the sender's pipeline, or (`--dry-run`) say what would be sent.

A manifest is made on the low side (`diode tickets --manifest`, `diode verify --manifest`),
which holds the link's key, and carried across by a person. Before anything is read it is
refused whole, exit 1, saying why, when:

- its signature does not check under the link's keys (diode.accounting.tickets.check): a link
  with a cipher takes only manifests made by a holder of its key and not changed since;
- it is not a manifest (parse);
- it names a topic the sender does not replicate (diode.kafka.clients.replicated, the readers'
  own choice of topics): the signature says who made a manifest, not what it may ask for, and
  the low side's key must not open the high side's other topics;
- a range of an entry that names tickets is not its ticket's range (tickets.out_of_bounds).

Then the source cluster is asked, per partition of the manifest: ranges of another incarnation
of their topic than the source's current one, and ranges of a partition the source does not
have, are refused (the rest is sent); offsets below a partition's log start are expired, never
sent (a range expired in part is sent from the log start).

The ranges left are sent by the sender's own stages in processes and a run directory of their
own, beside the running sender, with no metrics exporter: the running sender's holds
sender.metrics.listen. `--dry-run` instead reads each range with a consumer and prints how many
records the source holds in it, sending nothing: no pipeline, no UDP socket, no metrics port.
Exit 0 when every range was (or, dry, would be) sent whole; 1 when anything was refused,
expired or, dry, lies past a partition's end.
"""

import dataclasses
import json
import logging
import os
import sys
import time
from typing import NamedTuple

from diode.errors import DiodeError
from diode.kafka import identity
from diode.runtime import topology as topo

log = logging.getLogger("diode")

DRY_RUN_TIMEOUT = 30.0  # seconds for the dry run to read every range


class Entry(NamedTuple):
    """An entry of a manifest: ranges of one incarnation of a source partition."""
    topic: str
    partition: int
    incarnation: bytes | None  # None: not named (an older diode's manifest, or all zero)
    topic_id: str              # as the manifest writes it ("" for none)
    ranges: list               # [[first, last], ...]


class Span(NamedTuple):
    """A range of the manifest as the source holds it now."""
    topic: str
    partition: int
    topic_id: str
    first: int
    last: int
    log_start: int  # the partition's first offset still held

    @property
    def send(self) -> tuple[int, int] | None:
        """What is sent of the range: from the log start on; None when it is all expired."""
        return None if self.log_start > self.last else (max(self.first, self.log_start),
                                                        self.last)

    @property
    def expired(self) -> int:
        """How many of its offsets lie below the log start."""
        return max(0, min(self.last + 1, self.log_start) - self.first)


def parse(manifest: dict) -> list[Entry]:
    """The manifest's entries; ValueError, KeyError or TypeError when it is not a manifest."""
    entries = []
    for entry in manifest["missing"]:
        said = entry.get("topicId")
        inc = None if said is None else identity.parse(str(said))
        if said is not None and inc is None:
            raise ValueError(f"topicId {said!r} is not a topic id")
        topic, partition = entry["topic"], int(entry["partition"])
        if not isinstance(topic, str) or not topic or partition < 0:
            raise ValueError(f"{topic!r}[{partition}] is not a source partition")
        ranges = [[int(a), int(b)] for a, b in entry["ranges"]]
        for a, b in ranges:
            if not 0 <= a <= b:
                raise ValueError(f"{topic}[{partition}] {a}..{b} is not a range of offsets")
        named = entry.get("tickets")
        if named is not None and not (isinstance(named, list) and
                                      all(isinstance(x, str) for x in named)):
            raise ValueError(f"{topic}[{partition}]: tickets is not a list of ticket ids")
        # (the all-zero id: records whose incarnation the sender could not name, unchecked)
        entries.append(Entry(topic, partition, None if inc == identity.NO_INCARNATION else inc,
                             "" if said is None else str(said), ranges))
    return entries


def refusals(t, manifest: dict, entries: list[Entry]) -> list[str]:
    """Why the whole manifest is refused under topology `t` beside its signature (the topics
    the sender does not replicate, the ranges wider than their tickets), one line each."""
    from diode.accounting.tickets import out_of_bounds
    from diode.kafka.clients import replicated
    chosen = replicated(t.sender)
    problems = [f"{topic} is not a topic the sender replicates: {why}"
                for topic in sorted({e.topic for e in entries})
                if (why := chosen.why_not(topic)) is not None]
    return problems + out_of_bounds(manifest)


def by_incarnation(entries: list[Entry], current: dict) -> tuple[list, list, set]:
    """(the entries of the source's current incarnation of their topic, a line per refused
    incarnation, the topics sent unchecked); `current`: topic -> its incarnation now, for the
    topics whose entries name one (absent: the source has no such topic)."""
    kept, refused, unchecked = [], {}, set()
    for e in entries:
        now = current.get(e.topic)
        if e.incarnation is None or now == identity.NO_INCARNATION:
            unchecked.add(e.topic)  # (a broker without topic ids cannot tell either)
        elif e.incarnation != now:
            refused.setdefault((e.topic, e.incarnation, now), []).append(e.partition)
            continue
        kept.append(e)
    problems = []
    for (topic, said, now), parts in sorted(refused.items(), key=lambda kv: kv[0][:2]):
        where = (f"{topic} partition(s) {', '.join(map(str, sorted(parts)))}: the manifest "
                 f"names topic id {identity.text(said)}")
        problems.append(f"{where}, the source cluster's {topic} is topic id "
                        f"{identity.text(now)}: another incarnation, whose offsets hold other "
                        "records; not resent" if now is not None else
                        f"{where}, and the source cluster has no topic {topic} now; not resent")
    return kept, problems, unchecked


def spans(entries: list[Entry], starts: dict) -> tuple[list[Span], list[str]]:
    """(each range with its partition's log start, sorted; a line per partition the source
    does not have); `starts`: (topic, partition) -> log start, of those it has."""
    out, absent = [], set()
    for e in entries:
        start = starts.get((e.topic, e.partition))
        if start is None:
            absent.add((e.topic, e.partition))
            continue
        out.extend(Span(e.topic, e.partition, e.topic_id, a, b, start) for a, b in e.ranges)
    return sorted(out), [f"{t}[{p}]: the source cluster has no such partition; not resent"
                         for t, p in sorted(absent)]


def to_send(found: list[Span]) -> dict:
    """{(topic, partition): [[first, last], ...]}: what the sender's readers send
    (stages.kafka_resender), the expired offsets left out."""
    out: dict = {}
    for s in found:
        if s.send is not None:
            out.setdefault((s.topic, s.partition), []).append(list(s.send))
    return out


def expired_lines(found: list[Span]) -> list[str]:
    """A line per partition with offsets below its log start: expired, never sent."""
    per: dict = {}
    for s in found:
        if s.expired:
            n = per.setdefault((s.topic, s.partition, s.log_start), [0, 0])
            n[0] += 1
            n[1] += s.expired
    return [f"{t}[{p}]: {ranges} range(s) reach below the source's log start {start}: "
            f"{offsets} offset(s) expired, not resent (they can never be)"
            for (t, p, start), (ranges, offsets) in sorted(per.items())]


def source_state(source, entries: list[Entry]) -> tuple[list[Span], list[str], set]:
    """Ask the source cluster (`source`, diode.kafka.cluster's, already reached): (the spans of
    the entries it can send, a line per entry or partition refused, the topics unchecked)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from diode.kafka.clients import admin_config
    from diode.kafka.refresh import start_offsets, topic_ids
    admin = AdminClient(admin_config(source.settings))
    named = sorted({e.topic for e in entries if e.incarnation is not None})
    try:
        current = topic_ids(admin, named) if named else {}
    except KafkaException as exc:
        raise DiodeError(f"cannot read the source topics' ids, to check that the manifest's "
                         f"ranges are of their current incarnation: {exc}") from None
    kept, refused, unchecked = by_incarnation(entries, current)
    try:
        starts = start_offsets(admin, sorted({(e.topic, e.partition) for e in kept}))
    except KafkaException as exc:
        raise DiodeError(f"cannot read the source partitions' log starts, to know which "
                         f"ranges it still holds: {exc}") from None
    found, absent = spans(kept, starts)
    return found, refused + absent, unchecked


# -- the dry run ---------------------------------------------------------------------------------

def count_held(consumer, topic: str, partition: int, first: int, last: int,
               deadline: float) -> tuple[int, int | None]:
    """(how many records the source holds at offsets first..last, the offset from which the
    range lies past the partition's end or None), read with `consumer` (enable.partition.eof;
    auto.offset.reset error). Records are read, not watermarks trusted: a compacted or
    transactional topic holds fewer records than offsets, and some brokers (Tansu) report a
    short end."""
    from confluent_kafka import KafkaError, TopicPartition
    consumer.assign([TopicPartition(topic, partition, first)])
    count, seen = 0, first - 1
    try:
        while True:
            if time.monotonic() > deadline:
                raise DiodeError(f"--dry-run: could not read {topic}[{partition}] "
                                 f"{first}..{last} in time (--timeout)")
            for m in consumer.consume(1000, timeout=0.2):
                err = m.error()
                if err is None:
                    offset = m.offset()
                    if seen < offset <= last:
                        count += 1
                    seen = max(seen, offset)
                    if offset >= last:
                        return count, None
                elif err.code() == KafkaError._PARTITION_EOF:
                    return count, m.offset() if m.offset() <= last else None
                elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                    return count, max(first, seen + 1)  # (no such offset: past the end)
                elif err.fatal():
                    raise DiodeError(f"--dry-run: {topic}[{partition}]: {err.str()}")
    finally:
        consumer.unassign()


def dry_run(t, found: list[Span], refused: list[str], deadline: float, out=sys.stdout) -> bool:
    """Print, per source partition and range, what a resend would send: the records the source
    holds in it now, the offsets expired or past its end; then what is refused. True when
    every range would be sent whole."""
    from confluent_kafka import Consumer
    from diode.kafka.clients import consumer_config
    consumer = Consumer({**consumer_config(t), "enable.partition.eof": True})
    rows, records, past = [], 0, 0
    try:
        for s in found:
            notes, held = [], "-"
            if s.expired:
                notes.append(f"{s.expired} offset(s) expired (the source's log starts at "
                             f"{s.log_start})")
            if s.send is not None:
                n, end = count_held(consumer, s.topic, s.partition, *s.send, deadline)
                held, records = str(n), records + n
                if end is not None:
                    past += s.last - end + 1
                    notes.append(f"offsets {end}..{s.last} past the partition's end: never "
                                 "written")
            rows.append((f"{s.topic}[{s.partition}]", s.topic_id or "-",
                         f"{s.first}..{s.last}", held, "; ".join(notes)))
    finally:
        consumer.close()
    print("dry run: nothing is sent", file=out)
    print(f"{'source':<28} {'topic id':<22} {'offsets':<23} {'records':>8}  note", file=out)
    for row in rows:
        print(f"{row[0]:<28} {row[1]:<22} {row[2]:<23} {row[3]:>8}  {row[4]}".rstrip(),
              file=out)
    for line in refused:
        print(f"refused: {line}", file=out)
    expired = sum(s.expired for s in found)
    sending = sum(1 for s in found if s.send is not None)
    print(f"would send {records} record(s) of {sending} range(s) in "
          f"{len({(s.topic, s.partition) for s in found})} partition(s); not sent: "
          f"{expired} offset(s) expired, {past} past an end, {len(refused)} refusal(s)",
          file=out)
    return not (expired or past or refused)


# -- the command ---------------------------------------------------------------------------------

def with_settings(t, overrides, bootstrap: str | None):
    """Topology `t` with `overrides` ((key, value) pairs, as -X gives them) and `bootstrap` over
    its sender.kafka, for the dry run and the pipeline alike. A ${file:PATH} given here is
    relative to where the command runs, so it is made absolute (the launch places a relative one
    by the topology file); secrets stay references, read where each client is made."""
    from diode.runtime.topology import REFERENCE
    if not overrides and not bootstrap:
        return t

    def placed(value: str) -> str:
        return REFERENCE.sub(lambda m: "${file:%s}" % os.path.abspath(m.group(2))
                             if m.group(1) == "file" else m.group(0), value)
    kafka = {**t.sender.kafka, **{key: placed(value) for key, value in overrides}}
    if bootstrap:
        kafka["bootstrap.servers"] = bootstrap
    return dataclasses.replace(t, sender=dataclasses.replace(t.sender, kafka=kafka))


def cmd_resend(args) -> int:
    from diode.kafka.cluster import of_topology, reach
    from diode.ticket_command import manifest_problem
    t = topo.load(args.topology)
    source = of_topology(t, "sender", args.kafka, args.bootstrap)
    t = with_settings(t, args.kafka, args.bootstrap)
    try:
        manifest = json.loads(open(args.manifest).read())
        problem = manifest_problem(t, manifest)
        if problem:
            raise DiodeError(f"{args.manifest} is refused, nothing resent: {problem}")
        entries = parse(manifest)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DiodeError(f"{args.manifest} is not a resend manifest: {exc}") from None
    problems = refusals(t, manifest, entries)
    if problems:
        raise DiodeError(f"{args.manifest} is refused, nothing resent:\n  " +
                         "\n  ".join(problems))
    # the source first: a refused password or certificate, or no answer, is one error naming
    # the setting (diode.kafka.cluster), before the pipeline would wait on it
    reach(source, args.connect_timeout)
    found, refused, unchecked = source_state(source, entries)
    if unchecked:
        log.warning("resending ranges of %s unchecked: no topic id to tell whether they are of "
                    "the topic's current incarnation (a manifest of a diode older than topic "
                    "ids, or a source broker without them)", ", ".join(sorted(unchecked)))
    if args.dry_run:
        return 0 if dry_run(t, found, refused, time.monotonic() + args.timeout) else 1
    ranges = to_send(found)
    if refused and not ranges:
        raise DiodeError("nothing resent:\n  " + "\n  ".join(refused))
    for line in refused:
        log.error("%s", line)
    expired = expired_lines(found)
    for line in expired:
        log.error("%s", line)
    if not ranges:
        print("nothing to resend", file=sys.stderr)
        return 1 if expired else 0
    from diode.runtime.supervisor import Supervisor
    from stages import kafka_resender
    # its own processes and run directory beside a running sender, whose exporter holds
    # sender.metrics.listen: none here; its brokers already run
    t = dataclasses.replace(t, sender=dataclasses.replace(t.sender, metrics_listen=""),
                            brokers=[], supervisor=dataclasses.replace(t.supervisor, run_dir=""))
    # the sender's pipeline, its readers reading the ranges (and finishing: then it drains)
    code = Supervisor(t, ("sender",), args.run_dir, stages={
        "kafka_reader": kafka_resender.Stage.for_ranges(ranges)}).run()
    return code or (1 if refused or expired else 0)


def add_parser(sub) -> None:
    p = sub.add_parser("resend", help="on the high side: send a resend manifest's missing "
                       "ranges again (from diode tickets or diode verify on the low side), or "
                       "--dry-run: say what would be sent; a manifest naming a topic the "
                       "sender does not replicate, or a range wider than its ticket, is refused "
                       "whole, and ranges of another incarnation than the source topic's "
                       "current one are refused (exit 1)")
    p.add_argument("manifest", help="JSON: {\"missing\": [{\"topic\", \"partition\", "
                   "\"topicId\", \"ranges\", \"tickets\"}, …], \"auth\": …} signed with the "
                   "link's key (docs/verification.md)")
    p.add_argument("--topology", required=True,
                   help="the sender's topology file (its pipeline sends, its key checks "
                   "the manifest, its sender.topics and sender.topics.regex bound it)")
    p.add_argument("--dry-run", action="store_true",
                   help="send nothing: read each range from the source and print, per topic "
                   "and partition, how many records it holds there now and which offsets are "
                   "expired or past the end (exit 0: all would be sent)")
    p.add_argument("--timeout", type=float, default=DRY_RUN_TIMEOUT, metavar="SECONDS",
                   help="how long --dry-run may read for (default %(default)g)")
    p.add_argument("--run-dir", help="directory for ipc endpoints and metrics")
    from diode.kafka.cluster import CONNECT_TIMEOUT_SECONDS, add_options
    add_options(p, "sender", topology=False)
    p.add_argument("--connect-timeout", type=float, default=CONNECT_TIMEOUT_SECONDS,
                   metavar="SECONDS", help="how long the source cluster may take to answer "
                   "its first question, before anything is read or sent (default %(default)g)")
    p.set_defaults(func=cmd_resend)
