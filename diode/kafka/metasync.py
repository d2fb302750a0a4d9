"""The receiver's side of the source's metadata (wire.KIND_METADATA, diode.kafka.metadata).

Writer 0 takes the metadata readers send and hands it to a MetadataSync, a thread with clients
of its own (what it asks of the destination waits on it: never in the writer's loop), which
makes the destination follow the source:

- **Topics.** A replicated topic the destination lacks is created with the source's partition
  count and configs, those of a look together (one CreateTopics request, as the writers'
  Preparer does: the sender's first look names every topic as its records start, and one
  request per topic made the last of 200 wait over a minute on a loaded broker); a partition
  count raised on the source is raised on the destination (the writers keep a record's
  partition number only where the destination has it); each config the source describes is
  set on the destination topic where it differs, unless the operator pinned it
  (receiver.topic.configs, applied at creation and kept), receiver.sync.topic.configs is off,
  or the allow/deny lists leave it out. Each change is logged and counted
  (metadata_changes{reason}); each refusal once per value (metadata_refused{reason}).
- **Consumer groups** (sender.groups): each committed source offset is translated into the
  destination offset of the first record at or after it (diode.kafka.groups, from the
  provenance headers the writers wrote), committed for the same group when the group has no
  active member on the destination (receiver.sync.group.offsets, never moving it back), and
  written to receiver.group.checkpoints.topic.

Reports go back to the loop through a small queue: what was done or refused per topic and
group, and when, which the writer logs and exports (`diode status` shows the last sync).
"""

import logging
import queue
import time
from collections.abc import Callable
from typing import NamedTuple

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ResourceType)

from diode.errors import DiodeError
from diode.kafka import groups, messages
from diode.kafka.clients import (admin_config, create_topic, create_topics, producer_config,
                                 raise_partitions)
from diode.kafka.preparer import CREATE_TIMEOUT, TOPICS_PER_LOOK, describe, described
from diode.kafka.refresh import REQUEST_TIMEOUT, Looker, hand, topic_configs

log = logging.getLogger("diode.kafka.metasync")

MAX_PARTITIONS = 10_000   # most partitions a destination topic is given by metadata
MAX_SAID = 100_000        # refusals (and translations) remembered, to say or do each once
TRANSLATE_TIMEOUT = 10.0  # s: reading a destination partition to translate an offset
AHEAD_SETTLE_SECONDS = 30.0  # how long an offset past what arrived waits (see _group)


class Report(NamedTuple):
    kind: str       # "topic" or "group"
    name: str       # the source topic, or the group
    done: list      # (reason, what): changes made (metadata_changes' reasons)
    refused: list   # (reason, what): changes not made (metadata_refused's reasons)
    at: float       # when it was applied (time.time()); 0.0 when nothing could be (error)
    error: str | None = None


def pins(pinned: dict, destination: str) -> dict:
    """The configs the operator pinned for a destination topic (receiver.topic.configs:
    `*` for every topic, then the topic's own), values as strings."""
    return {k: _text(v) for k, v in {**pinned.get("*", {}), **pinned.get(destination, {})
                                     }.items()}


def target_configs(source: dict, pinned: dict, allow: list, deny: list,
                   sync: bool) -> tuple[dict, list]:
    """(the configs a destination topic should have, [(reason, config, source value)] of the
    source's configs not applied): the pinned ones always; the source's where sync is on, the
    config allowed (an empty allow list allows all) and not denied, and not pinned."""
    target, refused = dict(pinned), []
    for name, value in sorted(source.items()):
        if name in pinned:
            if pinned[name] != value:
                refused.append(("pinned", name, value))
        elif not sync or name in deny or (allow and name not in allow):
            if sync:
                refused.append(("denied", name, value))
        else:
            target[name] = value
    return target, refused


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class MetadataSync(Looker):
    """`settings`: the destination's librdkafka settings; `r`: the receiver's settings;
    `destination(source topic)`: its destination topic."""

    name = "metadata-sync"

    def __init__(self, settings: dict, r, destination: Callable[[str], str]):
        self.settings, self.r, self.destination = settings, r, destination
        self.work: queue.Queue = queue.Queue(maxsize=1)
        self.busy = False  # work handed and not all reported (the loop's view)
        self._said: dict = {}      # (destination topic, config) -> (reason, value) reported
        self._translated: dict = {}  # (group, topic, partition) -> (incarnation, offset) done
        self._ahead: dict = {}  # (group, topic, partition) -> (incarnation, offset, since when)
        self._producer = None
        self._checkpoints_ready = False
        super().__init__(1024)

    def hand(self, topics: dict, positions: dict) -> None:
        """Apply `topics` (source topic -> (incarnation, partition count, configs)) and
        `positions` ((group, topic, partition) -> (incarnation, committed offset)); the loop
        hands work only while not busy."""
        self.busy = True
        self.work.put_nowait((topics, positions))

    def take(self) -> list:
        """Reports since the last call (never waits); the last of a piece of work is None."""
        out = []
        for report in super().take():
            if report is None:
                self.busy = False
            else:
                out.append(report)
        return out

    def close(self, timeout: float = 1.0) -> None:
        super().close(timeout)
        if self._producer is not None:
            self._producer.flush(1)

    def _run(self) -> None:
        admin = AdminClient({**admin_config(self.settings), "allow.auto.create.topics": False})
        while not self._stop.is_set():
            try:
                topics, positions = self.work.get(timeout=0.5)
            except queue.Empty:
                continue
            names = sorted(topics)
            for i in range(0, len(names), TOPICS_PER_LOOK):
                part = names[i:i + TOPICS_PER_LOOK]
                known = self._known(admin, {t: topics[t] for t in part})
                made = self._create_missing(admin, {t: topics[t] for t in part
                                                    if t not in known})
                for topic in part:
                    self._report(self._guarded("topic", topic, self._topic, admin, topic,
                                               *topics[topic], known.get(topic), made))
            by_group: dict = {}
            for (group, topic, partition), entry in positions.items():
                by_group.setdefault(group, {})[(topic, partition)] = entry
            for group, entries in sorted(by_group.items()):
                self._report(self._guarded("group", group, self._group, admin, group, entries))
            self._report(None)

    def _report(self, report) -> None:
        hand(self.found, report, self._stop)

    def _guarded(self, kind: str, name: str, apply, *args) -> Report:
        try:
            return apply(*args)
        except (KafkaException, DiodeError) as exc:
            return Report(kind, name, [], [], 0.0, str(exc))
        except Exception as exc:  # (a bug: reported all the same, the loop must not wait)
            log.exception("applying the metadata of %s %s failed", kind, name)
            return Report(kind, name, [], [], 0.0, repr(exc))

    # -- topics ----------------------------------------------------------------------------

    def _known(self, admin, topics: dict) -> dict:
        """source topic -> (its destination topic's partition count, {config: value} of the
        configs it may be given), for those whose destination topic exists: what `_topic` would
        ask of each, asked of all in two requests (their metadata, their configs). {} when the
        destination does not answer now (each topic then asks for itself, and is reported)."""
        dests = {t: self.destination(t) for t in topics}
        try:
            counts = described(admin, sorted(set(dests.values())))
            there = sorted({d for d in dests.values() if counts[d][0]})
            names = sorted({*(n for _, _, configs in topics.values() for n in configs),
                            *(n for d in there for n in pins(self.r.topic_configs, d))})
            current = topic_configs(admin, there, names)
        except KafkaException:
            return {}
        return {t: (counts[d][0], current.get(d, {})) for t, d in dests.items()
                if counts[d][0]}

    def _target(self, dest: str, configs: dict) -> tuple[dict, list]:
        """target_configs of a destination topic, given its source topic's `configs`."""
        r = self.r
        return target_configs(configs, pins(r.topic_configs, dest), r.sync_topic_configs_allow,
                              r.sync_topic_configs_deny, r.sync_topic_configs)

    def _create_missing(self, admin, topics: dict) -> set:
        """The destination topics of `topics` (source topic -> (incarnation, partition count,
        configs), those `_known` did not find) created now, all in one CreateTopics request,
        each with what `_topic` would create it with; one refused, or there already (a writer
        made it meanwhile), is left to `_topic`, which says why."""
        wanted = {}
        for topic, (_, partitions, configs) in sorted(topics.items()):
            dest = self.destination(topic)
            wanted.setdefault(dest, (max(1, partitions if partitions <= MAX_PARTITIONS else 0),
                                     self._target(dest, configs)[0]))
        if not wanted:
            return set()
        try:
            made = create_topics(admin, wanted, CREATE_TIMEOUT)
        except KafkaException:
            return set()
        return {dest for dest, created in made.items() if created is True}

    def _topic(self, admin, topic: str, incarnation: bytes, partitions: int,
               configs: dict, known: tuple | None = None, made: set | None = None) -> Report:
        """Make the destination topic of `topic` follow it; `known`: (its partition count,
        its configs) when `_known` found it, else it is asked here; `made`: the destination
        topics `_create_missing` created (each reported created once, here)."""
        dest = self.destination(topic)
        target, refused = self._target(dest, configs)
        done, said = [], []
        for reason, name, value in refused:
            if self._said.get((dest, name)) != (reason, value):
                why = "pinned by receiver.topic.configs" if reason == "pinned" else \
                    "left out by receiver.sync.topic.configs.allow/deny"
                said.append((reason, f"{dest}: the source's {name}={value} not applied "
                                     f"({why})"))
                self._remember((dest, name), (reason, value))
        if partitions > MAX_PARTITIONS:
            said.append(("rejected", f"{dest}: {partitions} partitions: more than "
                                     f"{MAX_PARTITIONS}, not followed"))
            partitions = 0
        if made and dest in made:
            made.discard(dest)  # (another source topic of the same destination: not created)
            done.append(("created", f"{dest} with {max(1, partitions)} partition(s)"
                                    f"{' and ' + _listed(target) if target else ''}"))
            return Report("topic", topic, done, said, time.time())
        count = known[0] if known else describe(admin, dest)[0]
        if not count:
            if self._create(admin, dest, max(1, partitions), target):
                done.append(("created", f"{dest} with {max(1, partitions)} partition(s)"
                                        f"{' and ' + _listed(target) if target else ''}"))
                return Report("topic", topic, done, said, time.time())
            count, _ = describe(admin, dest)  # (a writer created it meanwhile)
            if not count:
                raise KafkaException(f"{dest} is not in the destination's metadata")
        if partitions > count:
            try:
                raise_partitions(admin, dest, partitions, CREATE_TIMEOUT)
                done.append(("partitions", f"{dest} from {count} to {partitions} partitions"))
            except KafkaException as exc:
                if self._said.get((dest, "partitions")) != ("rejected", partitions):
                    said.append(("rejected", f"{dest}: partitions {count} -> {partitions}: "
                                             f"{exc.args[0].str()}"))
                    self._remember((dest, "partitions"), ("rejected", partitions))
        current = known[1] if known else \
            topic_configs(admin, [dest], sorted(target)).get(dest, {})
        changes = {k: v for k, v in target.items() if current.get(k) != v}
        if changes:
            for name, value, error in self._alter(admin, dest, changes):
                if error is None:
                    done.append(("config", f"{dest}: {name} {current.get(name)} -> {value}"))
                    self._said.pop((dest, name), None)
                elif self._said.get((dest, name)) != ("rejected", value):
                    said.append(("rejected", f"{dest}: {name}={value}: {error}"))
                    self._remember((dest, name), ("rejected", value))
        return Report("topic", topic, done, said, time.time())

    def _create(self, admin, dest: str, partitions: int, configs: dict) -> bool:
        """Create `dest` with `configs`; one the destination refuses with its configs is
        created without them (the alteration after names what it refuses). False: it exists."""
        try:
            return create_topic(admin, dest, partitions, CREATE_TIMEOUT, config=configs)
        except KafkaException as exc:
            if not configs:
                raise
            log.warning("creating %s with %s refused (%s): creating it without them", dest,
                        _listed(configs), exc.args[0].str())
            return create_topic(admin, dest, partitions, CREATE_TIMEOUT)

    def _alter(self, admin, dest: str, changes: dict) -> list:
        """Set `changes` on `dest`: [(config, value, None or the error)]. All at once; when
        the destination refuses the set, each alone, to name the one it refuses."""
        if self._set(admin, dest, changes) is None:
            return [(k, v, None) for k, v in changes.items()]
        if len(changes) == 1:
            (k, v), = changes.items()
            return [(k, v, self._set(admin, dest, changes))]
        return [(k, v, self._set(admin, dest, {k: v})) for k, v in changes.items()]

    @staticmethod
    def _set(admin, dest: str, configs: dict) -> str | None:
        resource = ConfigResource(ResourceType.TOPIC, dest, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()])
        try:
            admin.incremental_alter_configs([resource], request_timeout=REQUEST_TIMEOUT)[
                resource].result(REQUEST_TIMEOUT + 5)
            return None
        except KafkaException as exc:
            return exc.args[0].str()

    def _remember(self, key, value) -> None:
        if len(self._said) >= MAX_SAID:
            self._said.clear()  # (refusals are said again: bounded, never wrong)
        self._said[key] = value

    # -- groups ----------------------------------------------------------------------------

    def _group(self, admin, group: str, entries: dict) -> Report:
        """Translate a group's committed source offsets (entries: (source topic, partition) ->
        (incarnation, offset)) and commit them, or checkpoint them while the group is active
        on the destination. An offset past every record that arrived of its partition waits
        AHEAD_SETTLE_SECONDS, seen so at each sync (records below it may still be on their
        way: committed at once, the position after the last one here would have the consumer
        reprocess them); one already applied is not translated again."""
        done, said, translated, waiting = [], [], {}, False
        now = time.monotonic()
        for (topic, partition), (incarnation, offset) in sorted(entries.items()):
            key = (group, topic, partition)
            if self._translated.get(key) == (incarnation, offset):
                continue
            dest = self.destination(topic)
            found = groups.translate(self.settings, dest, partition, incarnation, [offset],
                                     TRANSLATE_TIMEOUT)
            at = found.get(offset)
            if at is None:
                waiting = True
                if self._said.get(key) != ("untranslatable", offset):
                    said.append(("untranslatable", f"{topic}[{partition}] offset {offset}: "
                                                   f"{found.why}; tried again at each sync"))
                    self._remember(key, ("untranslatable", offset))
                continue
            if offset in found.ahead:
                seen = self._ahead.setdefault(key, (incarnation, offset, now))
                if seen[:2] != (incarnation, offset):
                    self._ahead[key] = (incarnation, offset, now)
                    waiting = True
                    continue
                if now - seen[2] < AHEAD_SETTLE_SECONDS:
                    waiting = True
                    continue
            self._ahead.pop(key, None)
            translated[(dest, partition)] = (topic, partition, incarnation, offset, at)
        if not translated:  # (synced when every offset was applied before; else not yet)
            return Report("group", group, done, said, 0.0 if waiting else time.time())
        offsets = {tp: entry[4] for tp, entry in translated.items()}
        applied = groups.apply(admin, group, offsets, REQUEST_TIMEOUT) \
            if self.r.sync_group_offsets else None
        for (dest, partition), at in (applied.committed if applied else {}).items():
            topic, _, _, offset, _ = translated[(dest, partition)]
            done.append(("group_commit", f"{dest}[{partition}] committed at {at} (the source's "
                                         f"{topic}[{partition}] at {offset})"))
        if self.r.group_checkpoints_topic:
            for (dest, partition), (topic, sp, incarnation, offset, at) in translated.items():
                self._checkpoint(*messages.group_checkpoint_record(
                    group, topic, sp, offset, dest, partition, at, incarnation,
                    int(time.time() * 1000)))
            self._producer.flush(REQUEST_TIMEOUT)
            if applied is None or applied.active:
                done.append(("group_checkpoint", f"{len(translated)} offset(s) to "
                             f"{self.r.group_checkpoints_topic}"
                             f"{' (active on the destination)' if applied else ''}"))
        for (dest, partition), (topic, sp, incarnation, offset, _) in translated.items():
            if applied is None or not applied.active:
                self._translated[(group, topic, sp)] = (incarnation, offset)
        for seen in (self._translated, self._ahead):
            if len(seen) > MAX_SAID:
                seen.clear()  # (translated again, waited for again: bounded, never wrong)
        return Report("group", group, done, said, time.time())

    def _checkpoint(self, key: bytes, value: bytes) -> None:
        """A translated offset to receiver.group.checkpoints.topic (created compacted)."""
        topic = self.r.group_checkpoints_topic
        if self._producer is None:
            self._producer = Producer(producer_config(self.settings))
        if not self._checkpoints_ready:
            admin = AdminClient(admin_config(self.settings))
            create_topic(admin, topic, 1, CREATE_TIMEOUT, config={"cleanup.policy": "compact"})
            self._checkpoints_ready = True
        while True:
            try:
                self._producer.produce(topic, value, key)
                return
            except BufferError:
                self._producer.poll(0.1)


def _listed(configs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(configs.items()))
