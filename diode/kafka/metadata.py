"""What the sender tells the receiver of its source besides records: topics and group positions.

Every `interval` seconds (sender.refresh.topics.interval.seconds) reader 0 looks, from a thread
with clients of its own (a slow source cluster never holds up its loop), at:

- each replicated topic's incarnation (its topic id), partition count and the configs of
  sender.metadata.topic.configs, as the source's broker describes them (a value it takes from
  its defaults included: Apache Kafka lists every config, Tansu only those a topic was created
  or altered with); the configs of a new or recreated topic at once, the others' in turn, each
  topic's at least every CONFIG_TURN_LOOKS looks;
- the committed offsets, on the replicated topics, of the consumer groups whose id matches
  sender.groups (diode.kafka.groups).

The loop sends what changed since it last sent (`Sent.changes`) at once, and everything every
sender.metadata.interval.ms, so a receiver that started late or lost a datagram catches up
(wire.KIND_METADATA). The receiver applies it: diode.kafka.metasync.
"""

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from diode.kafka import groups
from diode.kafka.clients import admin_config
from diode.kafka.refresh import REQUEST_TIMEOUT, RETRY_SECONDS, Looker, Turns, Unready, hand, \
    topic_configs, topic_ids

log = logging.getLogger("diode.kafka.metadata")

MAX_TOPICS = 10_000   # topics described per look (more: the first ones, by name, and a warning)
CONFIG_TURN_LOOKS = 6  # every topic's configs are described at least every this many looks


class Look(NamedTuple):
    cluster: str
    topics: dict   # topic -> (incarnation, partition count, {config: value})
    groups: dict   # (group, topic, partition) -> committed offset (the next record to read)
    error: str | None = None
    time_ms: int = 0


class MetadataWatcher(Looker):
    """`config`: the source's librdkafka settings; `matches(topic)`: whether a topic is
    replicated; `configs`: the config names to send; `patterns`: compiled group-id regexes."""

    name = "metadata-watcher"

    def __init__(self, config: dict, matches: Callable[[str], bool], configs: list,
                 patterns: list, interval: float):
        self.config, self.matches, self.configs = config, matches, list(configs)
        self.patterns, self.interval = patterns, interval
        self.described: dict = {}  # topic -> (incarnation, its configs as last described)
        self.turns = Turns(CONFIG_TURN_LOOKS)
        super().__init__(2)

    def _run(self) -> None:
        admin = AdminClient(admin_config(self.config))
        while not self._stop.is_set():
            found = self.look(admin)
            hand(self.found, found, self._stop)
            self._stop.wait(self.interval if found.error is None else
                            min(self.interval, RETRY_SECONDS))

    def look(self, admin) -> Look:
        now_ms = int(time.time() * 1000)
        try:
            md = admin.list_topics(timeout=REQUEST_TIMEOUT)
            counts = {name: len(t.partitions) for name, t in md.topics.items()
                      if t.error is None and self.matches(name)}
            if len(counts) > MAX_TOPICS:
                log.warning("%d replicated topics: the metadata of the first %d (by name) is "
                            "sent", len(counts), MAX_TOPICS)
                counts = dict(sorted(counts.items())[:MAX_TOPICS])
            # (a topic the cluster does not answer for yet is left out of this look: the
            # next one has it, and the receiver keeps what a look does not name)
            unready = Unready()
            ids = topic_ids(admin, sorted(counts), unready)
            configs = self._configs(admin, ids, unready)
            topics = {t: (ids[t], counts[t], configs.get(t, {})) for t in sorted(ids)
                      if t in configs or not self.configs}
            offsets = groups.read_group_offsets(admin, self.patterns, topics.__contains__,
                                                REQUEST_TIMEOUT) if self.patterns else {}
        except KafkaException as exc:  # (a timeout too: tried again soon)
            return Look("", {}, {}, str(exc), now_ms)
        own = self.config.get("group.id")  # (the readers' own: not a consumer to move)
        positions = {(g, t, p): offset for g, at in offsets.items() if g != own
                     for (t, p), offset in at.items() if t in topics}
        return Look(md.cluster_id or "", topics, positions, None, now_ms)


    def _configs(self, admin, ids: dict, unready: Unready) -> dict:
        """topic -> its configs of `self.configs`: described for a turn of the topics (each
        within CONFIG_TURN_LOOKS looks) and for those new or recreated since last described
        (a topic's whole config list crosses, 33 entries on Apache Kafka, whichever are
        asked: at 200 topics every look cost more than the rest of it); the others' as last
        described."""
        if not self.configs:
            return {}
        asked = self.turns.next(ids) | {t for t, inc in ids.items()
                                        if self.described.get(t, (None,))[0] != inc}
        described = topic_configs(admin, sorted(asked), self.configs, unready)
        self.described = {t: (inc, described[t]) if t in described else self.described[t]
                          for t, inc in ids.items() if t in described or (
                              t in self.described and self.described[t][0] == inc)}
        return {t: configs for t, (_, configs) in self.described.items()}


class Sent:
    """What the loop last sent of the source's metadata, to send only what changed between the
    whole sends: pure logic, tested alone."""

    def __init__(self):
        self.topics: dict = {}   # topic -> (incarnation, count, configs) as last sent
        self.groups: dict = {}   # (group, topic, partition) -> (incarnation, offset) sent

    def changes(self, look: Look, whole: bool) -> tuple[list, list]:
        """(topic entries, group entries) of `look` to send: all with `whole`, else those that
        differ from what was sent. Group entries name their topic's incarnation."""
        topics = [(t, *entry) for t, entry in look.topics.items()
                  if whole or self.topics.get(t) != entry]
        positions = []
        for (g, t, p), offset in look.groups.items():
            incarnation = look.topics[t][0]
            if whole or self.groups.get((g, t, p)) != (incarnation, offset):
                positions.append((g, t, p, incarnation, offset))
        return topics, positions

    def sent(self, look: Look) -> None:
        """`look` was sent (what it no longer names is forgotten: the state stays as large as
        the source's topics and groups)."""
        self.topics = dict(look.topics)
        self.groups = {(g, t, p): (look.topics[t][0], offset)
                       for (g, t, p), offset in look.groups.items()}
