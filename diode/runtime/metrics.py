"""Per-process counters, gauges and histograms, exported two ways:

- **Prometheus over HTTP** (`sender.metrics.listen`, `receiver.metrics.listen`): each worker
  mirrors its metrics about once a second into prometheus_client's multiprocess files (one
  directory per side in the run directory); one exporter process per side serves them
  (diode.runtime.exporter), with the supervisor's view of its workers;
- **a textfile** per worker, `<run dir>/metrics/<side>-<stage>-<index>.prom`, rewritten about
  once a second (atomic rename), for a node exporter's textfile collector, `diode tune --live`,
  `diode soak` and the tests (`supervisor.metrics.textfile`, on by default).

The stages count into plain dicts (a dict update per batch on the hot path); names follow
Prometheus conventions where they are exported: a counter `records` is `diode_records_total`,
a gauge `journal_bytes` is `diode_journal_bytes`, a histogram `end_to_end_latency_seconds` has
its `_bucket`, `_sum` and `_count`. Gauges that hold a cumulative count (`CUMULATIVE`: a
process's CPU seconds, the writer's acknowledged records, the kernel's socket drops) are
exported as counters. Every sample carries the worker's labels (side, stage, index);
`index` and not `instance`, which Prometheus gives every scraped series (its target).

A count that outlives the process (`Metrics.carry`: the kernel's drops on the udp_reader's
socket, which the supervisor made and a restarted reader inherits) is the whole count in the
textfile, and in Prometheus what it grew past the worker's earlier processes' export: the
exporter sums a worker's processes, the dead ones' counters included, so that sum is the
count, not its earlier part twice.
"""

import bisect
import functools
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from diode.accounting import reasons
from diode.runtime import files

log = logging.getLogger("diode.runtime.metrics")

# gauges whose value only grows (but for a process restart): exported as counters
CUMULATIVE = frozenset({"cpu_seconds", "output_blocked_seconds", "records", "duplicates",
                        "socket_drops", "source_filtered_datagrams"})
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)
# one step of a worker's loop: 0.1 ms (a step with nothing to do) to 10 s (a loop that blocked;
# the supervisor kills a worker silent for supervisor.heartbeat.timeout.seconds)
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Metric:
    kind: str            # counter, gauge (CUMULATIVE ones export as counters), histogram
    stages: tuple        # the stages that export it ("supervisor": its exporter)
    help: str
    reasons: tuple = ()  # its `reason` label's values, each exported from 0
    per_topic: bool = False  # labelled by source topic: no series until a topic has one
    buckets: tuple = LATENCY_BUCKETS  # a histogram's upper bounds (seconds)


def _per_topic(about: str) -> Metric:
    """A writer's gauge per source topic (label `topic`), about the source's state."""
    return Metric("gauge", ("kafka_writer",), f"Per source topic (label topic): {about}",
                  per_topic=True)


READERS, ALL = ("kafka_reader",), ("kafka_reader", "packer", "udp_sender", "udp_reader",
                                   "unpacker", "kafka_writer")
FORWARDING = ("kafka_reader", "packer", "udp_reader", "unpacker")
REJECTS = ("bad_magic", "bad_version", "truncated", "bad_kind", "auth_failed", "unknown_key",
           "replayed", "decompress_failed", "bad_compression", "decode_failed", "misrouted",
           "fragments_lost", "journal_damaged", "internal_error")
# Every metric diode exports: the HELP text, what docs/metrics.md lists, what a new worker
# exports at 0 (so a rate or an alert has a series before the first event).
CATALOG = {
    "records": Metric("counter", ("kafka_reader", "udp_sender", "unpacker", "kafka_writer"),
                      "Records read from the source (kafka_reader), handed to the link's socket "
                      "(udp_sender), unpacked from datagrams (unpacker), acknowledged by the "
                      "destination (kafka_writer)"),
    "datagrams": Metric("counter", ("packer", "udp_sender", "udp_reader", "unpacker"),
                        "Datagrams made, sent, received, opened"),
    "bytes": Metric("counter", ("packer", "udp_sender", "udp_reader"), "Datagram bytes"),
    "cpu_seconds": Metric("gauge", ALL, "CPU time of the worker process, every thread"),
    "output_blocked_seconds": Metric("gauge", FORWARDING, "Time the next stage took nothing "
                                     "(backpressure: the next stage is the slower)"),
    "output_queue_messages": Metric("gauge", FORWARDING, "Messages waiting for room downstream"),
    "errors": Metric("counter", ("kafka_reader", "udp_sender", "kafka_writer"),
                     "Errors by reason (logged)", ("metadata", "consume", "commit", "send",
                                                   "recovery", "checkpoint", "event",
                                                   "produce")),
    "rejects": Metric("counter", ("udp_reader", "unpacker", "kafka_writer"),
                      "Datagrams or runs dropped, by reason: forged, replayed, damaged, "
                      "misrouted", REJECTS),
    "heartbeats": Metric("counter", ("kafka_reader", "unpacker", "kafka_writer"),
                         "Sender heartbeats sent, opened, received"),
    "commits": Metric("counter", READERS, "Offset commits to the source cluster"),
    "rewinds": Metric("counter", READERS, "Re-sends after a worker downstream died"),
    "inflight_records": Metric("gauge", READERS, "Records sent, not yet committed"),
    "partitions": Metric("gauge", READERS, "Source partitions this reader owns"),
    "dead_letter_records": Metric("counter", ("packer",), "Records too large for the link, to "
                                  "sender.dead.letter.topic"),
    "fragmented_records": Metric("counter", ("packer",), "Records sent as fragments"),
    "heartbeat_datagrams": Metric("counter", ("packer",), "Heartbeat datagrams (and those of "
                                  "the source's state and of digests)"),
    "digests": Metric("counter", ("kafka_reader", "kafka_writer"), "Digests of ranges read "
                      "(sent; written to receiver.digest.topic)"),
    "metadata_sent": Metric("counter", READERS, "Metadata messages sent by reader 0 (the "
                            "replicated topics' partition counts and configs, the groups' "
                            "committed offsets): what changed, and all of it every "
                            "sender.metadata.interval.ms"),
    "metadata_changes": Metric("counter", ("kafka_writer",), "Changes writer 0 made on the "
                               "destination from the sender's metadata, by reason: created (a "
                               "topic), partitions (a topic's count raised), config (one config "
                               "set), group_commit (a group's translated offset committed), "
                               "group_checkpoint (one written to receiver.group.checkpoints."
                               "topic)", reasons=("created", "partitions", "config",
                                                  "group_commit", "group_checkpoint")),
    "metadata_refused": Metric("counter", ("kafka_writer",), "Changes the sender's metadata "
                               "asked for that were not made, by reason: pinned (the topology "
                               "pins the config), denied (receiver.sync.topic.configs.allow or "
                               ".deny), rejected (the destination refused it: logged with its "
                               "error), untranslatable (a group offset with no record to "
                               "translate it by yet)", reasons=("pinned", "denied", "rejected",
                                                                "untranslatable")),
    "metadata_synced_timestamp_seconds": _per_topic(
        "when its metadata (partition count, configs) was last applied to its destination "
        "topic (seconds since the epoch)"),
    "group_synced_timestamp_seconds": Metric(
        "gauge", ("kafka_writer",), "Per consumer group (label group): when its offsets were "
        "last translated and committed or checkpointed (seconds since the epoch)",
        per_topic=True),
    "parity_datagrams": Metric("counter", ("packer", "unpacker"), "FEC parity datagrams"),
    "kernel_pacing": Metric("gauge", ("udp_sender",), "1 when the kernel (fq) paces the socket"),
    "receive_buffer_bytes": Metric("gauge", ("udp_reader",), "The socket's receive buffer"),
    "udp_offload": Metric("gauge", ("udp_sender", "udp_reader"), "1 while the socket batches "
                          "datagrams in the kernel (GSO on the sender, GRO on the receiver)"),
    "syscalls": Metric("counter", ("udp_sender", "udp_reader"), "Send or receive calls on the "
                       "link's socket (fewer than datagrams with GSO or GRO)"),
    "socket_drops": Metric("gauge", ("udp_reader",), "Datagrams the kernel dropped: the "
                           "socket's buffer was full (with a source filter the kernel cannot "
                           "count apart, those it filtered too: the log says so at start)"),
    "socket_queue_bytes": Metric("gauge", ("udp_reader",), "Bytes waiting in the socket"),
    "source_filter": Metric("gauge", ("udp_reader",), "Where datagrams from addresses not in "
                            "link.source.addresses are dropped: 2 in the kernel (a socket "
                            "filter), 1 by the udp_reader (the kernel refused the filter), 0 "
                            "nowhere (the setting is empty: anyone can reach the port)"),
    "source_filtered_datagrams": Metric(
        "gauge", ("udp_reader",), "Datagrams from addresses not in link.source.addresses, "
        "dropped before anything read them (by the kernel, counted exactly but for a batch a "
        "NIC coalesced, which counts once; or by the udp_reader): someone on the low network "
        "is sending to the port (docs/threat-model.md)"),
    "journal_bytes": Metric("gauge", ("udp_reader",), "Size of the receive journal"),
    "journal_unforwarded_bytes": Metric("gauge", ("udp_reader",), "Journaled, not yet "
                                        "forwarded (the unpackers and writers are behind)"),
    "journal_max_bytes": Metric("gauge", ("udp_reader",), "The journal's bound "
                                "(receiver.journal.max.bytes; 0 without a journal)"),
    "journal_full": Metric("gauge", ("udp_reader",), "1 while the journal is at its limit"),
    "journal_failing": Metric("gauge", ("udp_reader",), "1 while the journal cannot be "
                              "written"),
    "journal_errors": Metric("counter", ("udp_reader",), "Journal write or fsync failures"),
    "journal_dropped_datagrams": Metric("counter", ("udp_reader",), "Datagrams read while the "
                                        "journal was full and the unpackers behind"),
    "journal_released_bytes": Metric("counter", ("udp_reader",), "Journal segments released "
                                     "after the writers' checkpoints"),
    "replays": Metric("counter", ("udp_reader",), "Journal replays (restarts)"),
    "replayed_datagrams": Metric("counter", ("udp_reader",), "Datagrams replayed"),
    "fec_recovered": Metric("counter", ("unpacker",), "Datagrams rebuilt from parity"),
    "fec_unrecoverable_blocks": Metric("gauge", ("unpacker",), "FEC blocks lost for good"),
    "fragments": Metric("counter", ("unpacker",), "Fragments received"),
    "reassembled_records": Metric("counter", ("unpacker",), "Records rebuilt from fragments"),
    "reassembly_bytes": Metric("gauge", ("unpacker",), "Memory held by incomplete fragments"),
    "sessions_active": Metric("gauge", ("unpacker",), "Sender sessions seen in the last 30 to "
                              "60 s (one per packer per sender start)"),
    "missing_records": Metric("counter", ("kafka_writer",), "Records reported missing"),
    "missing_ranges": Metric("counter", ("kafka_writer",), "Missing ranges reported"),
    "missing_records_last_hour": Metric("gauge", ("kafka_writer",), "Records reported missing "
                                        "in the last hour"),
    "missing_ranges_last_hour": Metric("gauge", ("kafka_writer",), "Missing ranges reported in "
                                       "the last hour"),
    "source_lag_records": _per_topic(
        "records its source holds past what was written here or reported missing, as of the "
        "sender's last look at it (sender.source.state.interval.ms)"),
    "source_held_records": _per_topic(
        "records its source still holds (end - log start): what could still be resent"),
    "missing_at_risk_records": _per_topic(
        "records reported missing that the source deletes next (within "
        "receiver.resend.margin.records of its log start, or by their timestamps and the "
        "topic's retention.ms within receiver.resend.horizon.ms): resend them first"),
    "missing_expired_records": Metric("counter", ("kafka_writer",), "Records reported missing "
                                      "that the source no longer holds: they can never be "
                                      "resent (reported again with reason expired)"),
    "tickets_open": Metric("gauge", ("kafka_writer",), "Resend tickets open: reported missing "
                           "ranges not yet filled or expired (diode tickets)"),
    "ticket_oldest_age_seconds": Metric("gauge", ("kafka_writer",), "Age of the oldest open "
                                        "resend ticket (0: none open)"),
    "resend_horizon_seconds": Metric("gauge", ("kafka_writer",), "receiver.resend.horizon.ms "
                                     "in seconds: a ticket older than this has waited past "
                                     "the horizon its range is judged at risk by"),
    "tickets_closed": Metric("counter", ("kafka_writer",), "Resend tickets closed, by reason: "
                             "filled (every record arrived), expired (the source deleted what "
                             "was left), untracked (past the open tickets kept per partition)",
                             reasons=reasons.TICKET_CLOSED),
    "ticket_repair_seconds": Metric("counter", ("kafka_writer",), "Seconds from report to "
                                    "repair, summed over the tickets closed filled (divided by "
                                    "tickets_closed{reason=filled}: the mean time to repair)"),
    "late_records": Metric("counter", ("kafka_writer",), "Records that came after being "
                           "reported missing (fills), written"),
    "duplicates": Metric("gauge", ("kafka_writer",), "Duplicate records dropped"),
    "pending_records": Metric("gauge", ("kafka_writer",), "Records waiting for their "
                              "predecessors (reordering)"),
    "backlog_records": Metric("gauge", ("kafka_writer",), "Records waiting for the "
                              "destination cluster"),
    "events_waiting": Metric("gauge", ("kafka_writer",), "Missing-range and heartbeat events "
                             "waiting to be written"),
    "checkpoints": Metric("counter", ("kafka_writer",), "Checkpoints written"),
    "checkpoint_flush_seconds": Metric("gauge", ("kafka_writer",), "The last checkpoint's "
                                       "flush"),
    "checkpoint_low_water": Metric("gauge", ("kafka_writer",), "Journal position the writer "
                                   "still needs"),
    "dead_letters": Metric("counter", ("kafka_writer",), "Records to "
                           "receiver.dead.letter.topic"),
    "refused_records": Metric("counter", ("kafka_writer",), "Records the destination refused "
                              "for good"),
    "source_resets": Metric("counter", ("kafka_reader", "kafka_writer"), "New incarnations of "
                            "a source partition (its topic recreated, its cluster rebuilt): "
                            "seen by the reader, which reads it from its start; taken up by "
                            "the writer, which reports what the old one left open"),
    "reorder_wait_widened": Metric("counter", ("kafka_writer",), "Times a late fill widened a "
                                   "partition's reorder wait"),
    "link_silent": Metric("gauge", ("kafka_writer",), "1 while no heartbeat comes"),
    "sender_stopped": Metric("gauge", ("kafka_writer",), "1 while the sender is stopped "
                             "cleanly (its last heartbeats said so: no silent link is "
                             "reported)"),
    "link_heartbeat_age_seconds": Metric("gauge", ("kafka_writer",), "Since the sender's last "
                                         "heartbeat, on the receiver's clock (writer 0)"),
    "end_to_end_latency_seconds": Metric("histogram", ("kafka_writer",), "Source timestamp to "
                                         "the destination's acknowledgement, one sample a "
                                         "run of records (its oldest)"),
    "step_seconds": Metric("histogram", ALL, "Time one step of the worker's loop took (the "
                           "stage contract: never more than about 0.1 s; a step over 1 s is "
                           "logged as a warning)", buckets=STEP_BUCKETS),
    "worker_up": Metric("gauge", ("supervisor",), "1 while the worker runs"),
    "worker_state": Metric("gauge", ("supervisor",), "1 for the worker's state in the "
                           "supervisor (label state: stopped, starting, running, backoff, "
                           "stopping, exited, fatal), 0 for the others. A FATAL worker stops "
                           "the launch: its state is served while the launch drains"),
    "worker_restarts": Metric("counter", ("supervisor",), "Times the supervisor restarted "
                              "the worker"),
}


def exported_name(name: str, kind: str) -> str:
    """The Prometheus name of an internal metric of kind counter, gauge or histogram."""
    if kind == "counter" or (kind == "gauge" and name in CUMULATIVE):
        return f"diode_{name}_total"
    return f"diode_{name}"


def _escaped(value) -> str:
    """A label value as Prometheus's text format writes it (a topic name comes from the
    sender: whatever it holds stays inside its quotes)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Histogram:
    """One histogram's counts: per bucket (the last one +Inf), their sum, how many. `observe`
    is cheap enough for every step of a worker's loop."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class Metrics:
    def __init__(self, labels: dict, path: str | None = None, interval: float = 1.0,
                 prometheus_dir: str | None = None):
        self.labels = {k: str(v) for k, v in labels.items()}
        self.counters: dict[tuple, float] = defaultdict(float)
        self.gauges: dict[tuple, float] = {}
        self.histograms: dict[tuple, Histogram] = {}
        self.carried: set = set()  # CUMULATIVE gauges an earlier process counted too (carry)
        self.path = path
        self.interval = interval
        self._next_write = 0.0
        self._series: dict = {}  # (kind, (name, labels)) -> ((family, type), "name{labels} ")
        self._mirror = _PrometheusMirror(prometheus_dir, self.labels) if prometheus_dir \
            else None
        for name, m in CATALOG.items():  # this stage's series exist from the start
            if self.labels.get("stage") not in m.stages or m.kind == "histogram" or m.per_topic:
                continue
            table = self.counters if m.kind == "counter" else self.gauges
            for labels in ([(("reason", r),) for r in m.reasons] if m.reasons else [()]):
                table[(name, labels)] = 0

    def inc(self, name: str, n: float = 1, **labels) -> None:
        # (per datagram on the receiver: an unlabelled count builds no label tuple)
        self.counters[(name, tuple(sorted(labels.items())) if labels else ())] += n

    def set(self, name: str, value: float, **labels) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.gauges[key] = value
        if name in CUMULATIVE:  # a count kept elsewhere (the zero it began with goes)
            self.counters.pop(key, None)

    def carry(self, *names: str) -> None:
        """Gauges of CUMULATIVE counts that this worker's earlier processes counted too, kept
        where they outlive a process (the kernel's, of a socket the supervisor made): the
        value set is the whole count, and Prometheus gets what it grew past what those
        processes exported."""
        self.carried.update(names)

    def observe(self, name: str, value: float, **labels) -> None:
        """One observation of a histogram (seconds, in the metric's buckets)."""
        self.histogram(name, **labels).observe(value)

    def histogram(self, name: str, **labels) -> Histogram:
        """A histogram of the catalog, to observe into directly where a call per observation
        counts (the worker's loop times every step)."""
        key = (name, tuple(sorted(labels.items())))
        h = self.histograms.get(key)
        if h is None:
            metric = CATALOG.get(name)
            h = self.histograms[key] = Histogram(metric.buckets if metric else LATENCY_BUCKETS)
        return h

    def get(self, name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return self.counters.get(key, self.gauges.get(key, 0))

    def text(self) -> str:
        """Prometheus text exposition format, one TYPE line per metric. Each series' name and
        labels are rendered once and kept (`_series`): a writer over 2 000 topics exports
        8 000 per-topic series every second, and rendering their labels each time cost it
        most of its idle turns (16 ms a second, 844 KB)."""
        lines = []
        families: dict = {}
        series = self._series
        if len(series) > 2 * (len(self.counters) + len(self.gauges)) + 64:
            series.clear()  # (series gone: bounded by those that exist)
        for kind, table in (("counter", self.counters), ("gauge", self.gauges)):
            for key, value in table.items():
                known = series.get((kind, key))
                if known is None:
                    name, labels = key
                    shown = "counter" if kind == "counter" or name in CUMULATIVE else "gauge"
                    full = exported_name(name, kind)
                    known = series[(kind, key)] = (
                        (full, shown), f"{full}{{{self._label_text(labels)}}} ")
                families.setdefault(known[0], []).append((key[1], known[1], value))
        for (full, kind), samples in sorted(families.items()):
            lines.append(f"# TYPE {full} {kind}")
            samples.sort(key=_labels_of)
            lines += [prefix + _number(value) for _, prefix, value in samples]
        for (name, labels), h in sorted(self.histograms.items(), key=lambda kv: kv[0]):
            full = f"diode_{name}"
            lines.append(f"# TYPE {full} histogram")
            cumulative = 0
            for le, count in zip((*map(str, h.bounds), "+Inf"), h.counts):
                cumulative += count
                lines.append(f"{full}_bucket{{{self._label_text(labels, le=le)}}} {cumulative}")
            lines.append(f"{full}_sum{{{self._label_text(labels)}}} {_number(h.sum)}")
            lines.append(f"{full}_count{{{self._label_text(labels)}}} {h.count}")
        return "\n".join(lines) + "\n"

    def _label_text(self, labels: tuple, **more) -> str:
        return ",".join(f'{k}="{_escaped(v)}"'
                        for k, v in {**self.labels, **dict(labels), **more}.items())

    def due(self) -> bool:
        return time.monotonic() >= self._next_write

    def due_in(self, now: float) -> float:
        """Seconds from `now` (time.monotonic()) until the next write is due."""
        return self._next_write - now

    def maybe_write(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_write:
            return
        self._next_write = now + self.interval
        if self._mirror is not None:
            self._mirror.update(self)
        if not self.path:
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        files.replace(self.path, self.text(), sync=False)


def _labels_of(sample: tuple) -> tuple:
    return sample[0]


def _number(value) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class _PrometheusMirror:
    """The worker's metrics in prometheus_client's multiprocess files (`directory`), updated
    once a second from the dicts: counters by what they grew since (a restarted process begins
    again at 0, which Prometheus reads as a counter reset), gauges by their value
    (multiprocess mode livesum: a dead worker's gauges go with it), histograms by what each
    bucket and the sum grew since (a step histogram takes thousands of observations a second:
    replaying them one by one would cost more than the steps). A carried count
    (Metrics.carry) by what it grew past what the worker's earlier processes exported: their
    files stay, and the exporter adds them up."""

    def __init__(self, directory: str, labels: dict):
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        from prometheus_client import values
        # chosen when prometheus_client was first imported, perhaps before this process had a
        # directory: every value made from now on goes to this process's own files
        values.ValueClass = values.MultiProcessValue()
        self.labels = labels
        self.families: dict = {}     # (exported name, kind) -> prometheus_client metric
        self.exported: dict = {}     # key -> value already exported (counters)
        self.histograms: dict = {}   # key -> (bucket counts, sum) already exported
        self._broken: set = set()

    def _child(self, name: str, kind: str, labels: tuple):
        from prometheus_client import Counter, Gauge, Histogram as Family
        full = exported_name(name, kind) if kind != "histogram" else f"diode_{name}"
        if (full, kind) in self._broken:
            return None
        names = (*self.labels, *(k for k, _ in labels))
        family = self.families.get((full, kind))
        if family is None:
            base = full.removesuffix("_total")
            about = CATALOG[name].help if name in CATALOG else name
            if kind == "counter":
                family = Counter(base, about, names, registry=None)
            elif kind == "gauge":
                family = Gauge(full, about, names, registry=None, multiprocess_mode="livesum")
            else:
                family = Family(full, about, names, registry=None,
                                buckets=CATALOG[name].buckets if name in CATALOG
                                else LATENCY_BUCKETS)
            self.families[(full, kind)] = family
        try:
            return family.labels(**self.labels, **dict(labels))
        except ValueError:  # the same metric with other label names: a bug, said once
            log.error("metric %s used with labels %s, unlike before: not exported", full,
                      [k for k, _ in labels])
            self._broken.add((full, kind))
            return None

    def _exported_before(self, name: str, labels: tuple) -> float:
        """What every process's file in the directory holds of one counter series: before
        this process exported any of it, what the worker's earlier processes exported."""
        from prometheus_client.multiprocess import MultiProcessCollector
        full, want = exported_name(name, "counter"), {**self.labels, **dict(labels)}
        files = [str(f) for f in Path(self.directory).glob("counter_*.db")]
        return sum(s.value for family in MultiProcessCollector.merge(files)
                   for s in family.samples if s.name == full and s.labels == want)

    def update(self, m: Metrics) -> None:
        for kind, table in (("counter", m.counters), ("gauge", m.gauges)):
            for key, value in table.items():
                name, labels = key
                if kind == "gauge" and name not in CUMULATIVE:
                    child = self._child(name, "gauge", labels)
                    if child is not None:
                        child.set(value)
                    continue
                before = self.exported.get(key)
                new = before is None  # (a new series is exported from 0)
                if name in m.carried:
                    if new:
                        before = self._exported_before(name, labels)
                    # (never a reset: the count lives as long as what keeps it, longer than
                    # this process; below what was exported is one not read yet)
                    grew, value = max(0.0, value - before), max(value, before)
                else:
                    before = before or 0.0
                    grew = value - before if value >= before else value
                if grew > 0 or new:
                    child = self._child(name, "counter", labels)
                    if child is not None and grew > 0:
                        child.inc(grew)
                self.exported[key] = value
        for key, h in m.histograms.items():
            counts, total = self.histograms.get(key, ((0,) * len(h.counts), 0.0))
            if h.count == sum(counts):
                continue
            child = self._child(key[0], "histogram", key[1])
            if child is not None:
                # (prometheus_client has no call for many observations at once: its buckets
                # are not cumulative, one value each, as Histogram.observe increments them)
                for value, grew in zip(child._buckets, (n - b for n, b in zip(h.counts,
                                                                               counts))):
                    if grew:
                        value.inc(grew)
                child._sum.inc(h.sum - total)
            self.histograms[key] = (tuple(h.counts), h.sum)


def samples(text) -> list:
    """Every sample in Prometheus text (one string, or a list of them: textfiles, scrapes) as
    (name, labels, value), the name as exported (`diode_records_total`,
    `diode_end_to_end_latency_seconds_count`), the label values unescaped: read by
    prometheus_client's parser, the one reading of the format in diode and its tests."""
    texts = [text] if isinstance(text, str) else text
    return [sample for one in texts for sample in _parsed(one)]


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> tuple:
    # (a text is read for several metrics in a row: `diode status`, `diode tune --live`)
    from prometheus_client.parser import text_string_to_metric_families
    return tuple((s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
                 for s in family.samples)


def read_counter(text, name: str, **labels) -> float:
    """Sum of a metric's samples in Prometheus text (one string or a list) whose labels include
    `labels`: `name` as the stages count it (`records` finds diode_records_total,
    `journal_bytes` diode_journal_bytes)."""
    names = (f"diode_{name}", f"diode_{name}_total")
    return float(sum(value for full, found, value in samples(text) if full in names and
                     all(found.get(k) == str(v) for k, v in labels.items())))


def reference_markdown() -> str:
    """docs/metrics.md, from CATALOG (`diode docs --metrics`)."""
    out = ["# Metrics", "",
           "Generated from `diode/runtime/metrics.py` by `diode docs --metrics > "
           "docs/metrics.md`; a test keeps the two equal, and another scrapes a running "
           "pipeline for every name here and in the Grafana dashboard "
           "(`deploy/grafana/diode.json`).", "",
           "Every sample has the labels `side`, `stage` and `index` (the stage instance; not "
           "`instance`, which Prometheus gives every scraped series). `reason` labels count "
           "from 0 for each reason listed. Scrape `sender.metrics.listen` and "
           "`receiver.metrics.listen` (one endpoint per side); the same metrics are in the "
           "textfiles `<run dir>/metrics/*.prom` unless `supervisor.metrics.textfile` is "
           "false.", "",
           "| metric | type | stages | meaning |", "| --- | --- | --- | --- |"]
    for name, m in CATALOG.items():
        kind = "counter" if m.kind == "gauge" and name in CUMULATIVE else m.kind
        full = exported_name(name, m.kind) if m.kind != "histogram" else f"diode_{name}"
        about = m.help + (f" (`reason`: {', '.join(m.reasons)})" if m.reasons else "")
        out.append(f"| `{full}` | {kind} | {', '.join(m.stages)} | {about} |")
    return "\n".join(out) + "\n"
