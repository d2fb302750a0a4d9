"""Each stage's CPU cost on this machine, per record and per datagram, with the topology's own
settings (datagram size, cipher, compression, FEC, fragmenting, pacing) and a record size.

A measurement runs the topology's real pipeline, both sides with one instance of each stage,
on brokers (`Bench`: the topology's own clusters when they answer, else embedded ones; for one
side only, `side`, that side's cluster alone at both ends, the other cluster never asked), at a
paced rate, and reads each worker's CPU time (user + system, librdkafka's threads included)
over a window, against the records the writers wrote and the datagrams the sender sent
meanwhile. Every stage is its own process, so each one's CPU is its own cost, measured in
place: real datagrams, real queues, real brokers. The brokers' own CPU is not counted.

Two windows, with the topology's datagram size and with datagrams a few times smaller (more
datagrams for the same records), separate what a stage pays per record from what it pays per
datagram: cpu = r × records + d × datagrams, solved per stage (docs/tuning.md shows both).
"""

import copy
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from diode.runtime import topology as topo
from diode.runtime.launches import Launch
from diode.errors import DiodeError
from diode.link.path import ETHERNET_DATAGRAM, MAX_AUTO
from diode.runtime.topology import PIPELINES, SIDES

WARMUP_SECONDS = 4.0
REWRITE_WAIT_SECONDS = 5.0  # the most a sample waits for the workers' metrics to be written
FIRST_RECORD_SECONDS = 60.0  # the most a window waits for its first record to be written
MEASURE_SECONDS = 10.0
PARTITIONS = 8
SAMPLE_RECORDS = 2000
SMALL_DATAGRAM_DIVISOR = 8   # the second window's datagrams: this many times smaller


@dataclass
class Window:
    """One measured window of a running pipeline."""
    datagram_bytes: int
    seconds: float
    records: int            # written by the kafka_writers
    datagrams: int          # sent by the udp_sender (data, parity, heartbeats, fragments)
    bytes: int              # their bytes (UDP payload)
    missing: int            # reported missing meanwhile (a measurement that drops is void)
    cpu: dict               # stage -> CPU seconds of its workers
    worker_cpu: dict        # worker title ("receiver/unpacker-0") -> CPU seconds

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    def cost_us(self) -> dict:
        """stage -> CPU µs per record."""
        return {stage: sec / max(1, self.records) * 1e6 for stage, sec in self.cpu.items()}


@dataclass
class Measured:
    record_bytes: float         # mean value size of the records measured
    rate: float                 # records/s it ran at
    records_per_datagram: float  # at the topology's datagram size, at that rate
    cost_us: dict               # stage -> CPU µs per record, the topology's settings
    per_record_us: dict         # stage -> the part paid per record
    per_datagram_us: dict       # stage -> the part paid per datagram
    brokers: str                # where it ran
    windows: list


def fit(a: Window, b: Window) -> tuple[dict, dict]:
    """Per stage, (µs per record, µs per datagram) from two windows with different datagram
    counts for their records: cpu = r·records + d·datagrams. A negative part (noise) is taken
    as 0 and the other fitted alone."""
    per_record, per_datagram = {}, {}
    det = a.records * b.datagrams - b.records * a.datagrams
    for stage in a.cpu:
        ca, cb = a.cpu[stage], b.cpu.get(stage, 0.0)
        r = (ca * b.datagrams - cb * a.datagrams) / det if det else -1.0
        d = (a.records * cb - b.records * ca) / det if det else -1.0
        if d < 0 or not det:
            r, d = (ca + cb) / max(1, a.records + b.records), 0.0
        elif r < 0:
            r, d = 0.0, (ca + cb) / max(1, a.datagrams + b.datagrams)
        per_record[stage], per_datagram[stage] = r * 1e6, d * 1e6
    return per_record, per_datagram


def one_instance(side: str) -> dict:
    """{stage: {"instances": 1}} for every stage of `side`: what a measurement runs, and what a
    side runs that a one-side plan leaves out."""
    return {stage: {"instances": 1} for stage in PIPELINES[side]}


def measure(t, raw: dict, record_mix: list, rate: float, bench: "Bench",
            seconds: float = MEASURE_SECONDS, say=lambda message: None) -> Measured:
    """Costs per stage at `rate` records/s of `record_mix` ([(value bytes, weight)]), with one
    instance of each stage: a window at the topology's datagram size, one at a smaller size.
    A pipeline that does not keep up here (fewer records written than the rate, or any
    reported missing) is saturated, and a saturated stage's cost per record is not its cost:
    the window is measured again at 70 % of what got through (at most twice)."""
    from diode.soak.traffic import mean_size
    one = {side: one_instance(side) for side in SIDES}
    size = t.link.datagram_size_bytes
    small = max(ETHERNET_DATAGRAM, size // SMALL_DATAGRAM_DIVISOR)
    if small >= size:
        small = min(MAX_AUTO, size * 4)  # already small: the other window's are larger
    for attempt in range(3):
        a = bench.window(one, rate, record_mix, seconds)
        if (a.rate >= 0.9 * rate and not a.missing) or attempt == 2:
            break
        say(f"{a.rate:,.0f} records/s got through of {rate:,.0f} ({a.missing} reported "
            f"missing): saturated here; measuring again at {0.7 * a.rate:,.0f}")
        rate = 0.7 * a.rate
    b = bench.window(one, rate, record_mix, seconds, datagram_bytes=small)
    per_record, per_datagram = fit(a, b)
    return Measured(mean_size(record_mix), a.rate, a.records / max(1, a.datagrams),
                    a.cost_us(), per_record, per_datagram, bench.where, [a, b])


def sample_sizes(t, seconds: float = 10.0, count: int = SAMPLE_RECORDS) -> list:
    """The size mix ([(value bytes, weight)], up to 8 sizes) of up to `count` of the newest
    records of the sender's topics, read from the source cluster; DiodeError when it cannot be
    reached or holds none."""
    from confluent_kafka import Consumer, TopicPartition
    from diode.kafka.clients import client_settings, partition_counts, replicated
    conf = {**client_settings(t, "sender"), "group.id": f"diode-tune-{secrets.token_hex(4)}",
            "enable.auto.commit": False, "log_level": 0}
    consumer = Consumer(conf)
    try:
        try:
            counts = partition_counts(consumer, timeout=seconds)
        except Exception as exc:  # noqa: BLE001 - librdkafka's errors: say which cluster
            raise DiodeError(f"--sample: the source cluster "
                             f"({conf.get('bootstrap.servers')}) did not answer: {exc}") from None
        owned = sorted(replicated(t.sender).owned(counts))
        if not owned:
            raise DiodeError("--sample: the source cluster has none of the sender's topics")
        per = max(1, count // len(owned))
        start = []
        for topic, p in owned:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=seconds)
            if high > low:
                start.append(TopicPartition(topic, p, max(low, high - per)))
        consumer.assign(start)
        sizes, deadline = [], time.monotonic() + seconds
        while len(sizes) < count and start and time.monotonic() < deadline:
            for m in consumer.consume(500, 0.5):
                if m.error() is None:
                    sizes.append(len(m.value() or b"") + len(m.key() or b"") + sum(
                        len(k) + len(v or b"") for k, v in (m.headers() or [])))
    finally:
        consumer.close()
    if not sizes:
        raise DiodeError("--sample: the sender's topics hold no records to sample")
    return size_mix(sizes)


def size_mix(sizes: list, buckets: int = 8) -> list:
    """Sizes as a mix of at most `buckets` sizes with their weights: each distinct size when
    there are that few, else the mean of each equal share by rank; at least 16 bytes each
    (the traffic's smallest)."""
    sizes = sorted(sizes)
    n = len(sizes)
    mix: dict = {}
    if len(set(sizes)) <= buckets:
        for size in sizes:
            mix[max(16, size)] = mix.get(max(16, size), 0) + 1 / n
        return sorted(mix.items())
    for i in range(min(buckets, n)):
        part = sizes[i * n // min(buckets, n):(i + 1) * n // min(buckets, n)]
        size = max(16, round(sum(part) / len(part)))
        mix[size] = mix.get(size, 0) + len(part) / n
    return sorted(mix.items())


# -- the bench: brokers and pipelines to measure on ----------------------------------------------

class Bench:
    """Brokers, a scratch directory and topics of its own, to run the topology's pipeline on.

    The topology's own clusters are used when they answer (topics named diode-tune-<id>, deleted
    afterwards; its consumer group and its missing-records, heartbeat, dead-letter and digest
    topics replaced by the bench's own; no group offsets, schemas or group checkpoints carried);
    otherwise embedded brokers of the topology's kind (Tansu when it names none), started here.
    With `side` ("sender" or "receiver": a host across a diode reaches its own cluster only),
    that side's cluster is both the source and the destination of the pipeline measured (the
    copies under a prefix of the bench's own), and the other side's is never asked: on the
    sending host the sender's stages read the real source, on the receiving host the
    receiver's write to the real destination."""

    def __init__(self, t, raw: dict, broker_kind: str | None = None,
                 use_configured: bool = True, side: str | None = None):
        self.t, self.raw, self.side = t, raw, side
        self.kind = broker_kind or next((b.kind for b in t.brokers), "tansu")
        self.use_configured = use_configured
        self.id = secrets.token_hex(3)
        self.work = Path(tempfile.mkdtemp(prefix="diode-tune-"))
        self.started: list = []
        self.topics: list = []
        self.where = ""
        self.src = self.dst = None
        # the destination topic of a source topic: the topology's prefix, or the bench's own
        # where one cluster is both (a copy must not land in the topic it is read from)
        self.prefix = t.receiver.topic_prefix if side is None else f"diode-tune-{self.id}-copy-"
        self._n = 0

    def __enter__(self) -> "Bench":
        try:
            self._brokers()
        except BaseException:
            self.close(keep_logs=True)  # (a broker that did not start: its log says why)
            raise
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(keep_logs=kind is not None)

    def _brokers(self) -> None:
        from diode.kafka import brokers as embedded
        from diode.kafka.clients import client_settings
        configured = not self.t.brokers and self.use_configured
        sides = SIDES if self.side is None else (self.side,)
        if configured:
            clusters = [client_settings(self.t, side) for side in sides]
            if all(_answers(c) for c in clusters):
                self.src, self.dst = clusters[0], clusters[-1]
                self.where = "the topology's clusters" if self.side is None else \
                    f"the {self.side}'s cluster alone"
                return
        made = [embedded.make_broker(self.kind, name, f"127.0.0.1:{embedded.free_port()}",
                                     str(self.work / f"{name}.log"))
                for name in (("source", "destination") if self.side is None else ("cluster",))]
        embedded.start_all(made)
        self.started = made
        self.src, self.dst = made[0].client_config(), made[-1].client_config()
        self.where = f"embedded {self.kind} broker{'s' if len(made) > 1 else ''}"
        if configured:
            self.where += (" (the topology's clusters did not answer)" if self.side is None
                           else f" (the {self.side}'s cluster did not answer)")

    def close(self, keep_logs: bool = False) -> None:
        """Stop what the bench started and remove its files; after a failure its logs stay
        (errors name the directory)."""
        if self.topics and not self.started:  # the topology's clusters: leave nothing there
            _delete_topics(self.src, self.topics)
            _delete_topics(self.dst, [self.prefix + name for name in self.topics] +
                           [f"diode-tune-{self.id}-{what}" for what in
                            ("missing", "heartbeats", "dead-letter", "digests")])
        for b in self.started:
            b.stop()
        self.started = []
        if not keep_logs:
            shutil.rmtree(self.work, ignore_errors=True)
            return
        for journal in self.work.glob("journal-*"):
            shutil.rmtree(journal, ignore_errors=True)

    def topology(self, stages: dict, datagram_bytes: int | None = None,
                 link_mbps: float | None = None) -> tuple[Path, str, int]:
        """A topology file for one run of the pipeline: the bench's brokers and a topic of its
        own, `stages` ({side: {stage: {instances, cpus, ...}}}), the link on loopback through
        a free port. Returns (path, topic, udp port)."""
        from confluent_kafka.admin import AdminClient
        from diode.kafka import brokers as embedded
        from diode.kafka.clients import admin_config, create_topic
        self._n += 1
        topic = f"diode-tune-{self.id}-{self._n}"
        create_topic(AdminClient(admin_config(self.src)), topic, PARTITIONS)
        self.topics.append(topic)
        data = copy.deepcopy(self.raw)
        data.pop("brokers", None)
        data["name"] = f"tune-{self.id}-{self._n}"  # its own consumer group
        s = data.setdefault("sender", {})
        r = data.setdefault("receiver", {})
        # only the bench's topic crosses: no group offsets, no registry topic (which, with one
        # cluster at both ends, would be written back into the one it is read from)
        for key in ("topics.regex", "groups", "schemas", "metrics.listen"):
            s.pop(key, None)
        s.update({"topics": [topic], "start.position": "earliest", "stages": stages["sender"],
                  "dead.letter.topic": f"diode-tune-{self.id}-dead-letter"})
        r.pop("metrics.listen", None)  # (the stages are measured, not an endpoint)
        r.update({"stages": stages["receiver"], "topic.prefix": self.prefix,
                  "journal.dir": str(self.work / f"journal-{self._n}"),
                  "missing.records.topic": f"diode-tune-{self.id}-missing",
                  "dead.letter.topic": f"diode-tune-{self.id}-dead-letter",
                  "group.checkpoints.topic": ""})
        for key, what in (("heartbeat.topic", "heartbeats"), ("digest.topic", "digests")):
            if r.get(key):
                r[key] = f"diode-tune-{self.id}-{what}"
        if self.started:
            s["kafka"], r["kafka"] = dict(self.src), dict(self.dst)
        elif self.side is not None:  # the side's own settings (secrets as references) at both
            own = data[self.side].get("kafka", {})
            s["kafka"], r["kafka"] = copy.deepcopy(own), copy.deepcopy(own)
        port = embedded.free_port(socket.SOCK_DGRAM)
        link = data.setdefault("link", {})
        link.update({"host": "127.0.0.1", "port": port, "bind.address": "127.0.0.1",
                     "source.addresses": ["127.0.0.1"]})
        if datagram_bytes:
            link["datagram.size.bytes"] = datagram_bytes
        if link_mbps is not None:
            link["rate.mbps"] = round(link_mbps, 1)
        sec = data.setdefault("security", {})
        for key in ("password.file", "key.file", "next.password.file", "next.key.file"):
            if sec.get(key):
                sec[key] = self.t.resolve(sec[key])
        if not any(sec.get(k) and Path(sec[k]).exists() for k in ("password.file", "key.file")) \
                and not sec.get("password.env"):
            secret = self.work / "password"  # the demo's is made by ./scripts/demo
            secret.write_text(secrets.token_urlsafe(24) + "\n")
            sec["password.file"] = str(secret)
        data.setdefault("supervisor", {}).pop("run.dir", None)
        path = self.work / f"topology-{self._n}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        topo.load(path)  # still valid as rewritten
        return path, topic, port

    def window(self, stages: dict, rate: float, record_mix: list, seconds: float,
               datagram_bytes: int | None = None, warmup: float = WARMUP_SECONDS) -> Window:
        """Run both sides with `stages` at `rate` records/s (the link paced a fifth above what
        the records need, or as the topology paces it if that is more) and measure a window
        after `warmup` seconds."""
        from diode.soak import traffic
        from diode.soak.run import Counters
        mbps = rate * (traffic.mean_size(record_mix) + 60) * 8 / 1e6 * 1.2 + 1
        path, topic, _ = self.topology(stages, datagram_bytes,
                                       max(mbps, self.t.link.rate_mbps or 0))
        n = self._n
        launches = {}
        flow = None
        try:
            for side in ("receiver", "sender"):
                launches[side] = Launch(path, side, self.work / f"run-{n}-{side}",
                                        self.work / f"{side}-{n}.log").start()
                launches[side].wait_ready(sum(s["instances"] for s in stages[side].values()))
            records = traffic.Records([topic], PARTITIONS, record_mix, seed=n)
            flow = traffic.Traffic(self.src, records, rate).start()
            written = Counters([self.work / f"run-{n}-receiver"], "kafka_writer",
                               ("records", "missing_records"))
            sent = Counters([self.work / f"run-{n}-sender"], "udp_sender",
                            ("datagrams", "bytes"))
            # The warm-up counts from the first record written: on a busy machine a pipeline
            # (its consumer's assignment, the destination topic) takes longer to start.
            deadline = time.monotonic() + FIRST_RECORD_SECONDS
            while written.sample()["records"] <= 0 and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(warmup)
            # Each sample is taken just after the counted workers wrote their metrics (about
            # once a second, later on a busy machine): a window read between two writes would
            # count none of its records (a 1 s window between writes 1.2 s apart: "no record
            # crossed"), and its length is the writer's, between the two writes it counts.
            counted = [(self.work / f"run-{n}-receiver", "kafka_writer"),
                       (self.work / f"run-{n}-sender", "udp_sender")]
            at = _rewritten(counted, time.time())
            before = (_worker_cpu(launches), dict(written.sample()), dict(sent.sample()), at)
            time.sleep(seconds)
            at = _rewritten(counted, time.time())
            after = (_worker_cpu(launches), dict(written.sample()), dict(sent.sample()), at)
        finally:
            if flow is not None:
                flow.stop(timeout=5)
            for launch in launches.values():
                if launch.alive():
                    launch.stop()
        gone = set(before[0]) - set(after[0])
        if gone:
            raise DiodeError(f"{', '.join(sorted(gone))} died while measuring (logs in "
                             f"{self.work}): the measurement is void")
        worker_cpu = {w: after[0][w][1] - before[0][w][1] for w in after[0]
                      if w in before[0] and before[0][w][0] == after[0][w][0]}
        cpu: dict = {}
        for title, seconds_used in worker_cpu.items():
            stage = title.split("/")[1].rsplit("-", 1)[0]
            cpu[stage] = cpu.get(stage, 0.0) + seconds_used
        records = int(after[1]["records"] - before[1]["records"])
        if records <= 0:
            raise DiodeError(f"no record crossed while measuring (logs in {self.work})")
        return Window(datagram_bytes or self.t.link.datagram_size_bytes,
                      after[3] - before[3], records,
                      int(after[2]["datagrams"] - before[2]["datagrams"]),
                      int(after[2]["bytes"] - before[2]["bytes"]),
                      int(after[1]["missing_records"] - before[1]["missing_records"]),
                      cpu, worker_cpu)


def _rewritten(counted: list, since: float, limit: float = REWRITE_WAIT_SECONDS) -> float:
    """Wait until the metrics file of every worker of `counted` ((run dir, stage) each) was
    written at or after `since` (time.time()), `limit` seconds at most; when the kafka_writers'
    last was written (time.time()), else `since`."""
    deadline = time.monotonic() + limit
    while True:
        times = {stage: _written_at((run_dir / "metrics").glob(f"*-{stage}-*.prom"))
                 for run_dir, stage in counted}
        if all(t and min(t) >= since for t in times.values()) or time.monotonic() >= deadline:
            return max(times.get("kafka_writer") or [since])
        time.sleep(0.02)


def _written_at(paths) -> list:
    """When each of `paths` was last written (time.time()); one replaced meanwhile is left out."""
    out = []
    for path in paths:
        try:
            out.append(path.stat().st_mtime)
        except FileNotFoundError:
            pass
    return out


def _worker_cpu(launches: dict) -> dict:
    """worker title -> (pid, CPU seconds: user + system, every thread)."""
    out = {}
    for launch in launches.values():
        for title, proc in launch.workers().items():
            try:
                out[title] = (proc.pid, sum(proc.cpu_times()[:2]))
            except psutil.Error:
                pass
    return out


def _answers(kafka: dict, timeout: float = 5.0) -> bool:
    """Whether a cluster answers a metadata request within `timeout`."""
    from confluent_kafka.admin import AdminClient
    from diode.kafka.clients import admin_config
    if not kafka.get("bootstrap.servers"):
        return False
    try:
        AdminClient({**admin_config(kafka), "log_level": 0}).list_topics(timeout=timeout)
        return True
    except Exception:  # noqa: BLE001 - any failure means: not reachable from here
        return False


def _delete_topics(kafka: dict, topics: list) -> None:
    """Delete those of `topics` the cluster has (the event topics are made only when used)."""
    from confluent_kafka.admin import AdminClient
    from diode.kafka.clients import admin_config
    try:
        # (the client held until the answers are in: one dropped at once is destroyed, and
        # its futures fail with _DESTROY, the topics left there)
        admin = AdminClient(admin_config(kafka))
        present = admin.list_topics(timeout=15).topics
        there = [t for t in topics if t in present]
        futures = admin.delete_topics(there, operation_timeout=15) if there else {}
        for f in futures.values():
            try:
                f.result(20)
            except Exception:  # noqa: BLE001 - best effort, as below
                pass
    except Exception:  # noqa: BLE001 - best effort: the bench's topics are named for it
        pass
