"""What each property of the connector's files becomes in a topology (`to_topology`): the
values both connectors take and must agree on (host, port, password, salt, cipher,
compression), each connector's own, the Java Kafka client properties as librdkafka's, and for
every property with no place in a topology (Kafka Connect's framework settings, Java-only client
settings, the other connector's, a typo) the reason, as an Unmapped. Pure functions: the files
are read by diode.connect_import.properties, the result written by .render and .command.
"""

import re
from dataclasses import dataclass

from diode.connect_import.properties import (SIDE_OF, SINK, SOURCE, Config, PropertiesError,
                                             assign_roles, shown)
from diode.link.path import ETHERNET_DATAGRAM, MAX_UDP_PAYLOAD
from diode.kafka import messages
from diode.runtime.topology import SECRET_KAFKA_KEYS

DEFAULT_PASSWORD_FILE = "secrets/diode.password"
CONNECT_BOOTSTRAP = "localhost:9092"  # Kafka Connect's default bootstrap.servers
PLACEHOLDER_TOPIC = "CHANGE-ME"


@dataclass(frozen=True)
class Unmapped:
    """A property that has no place in the topology, and why."""
    key: str
    path: str
    reason: str


# -- values both connectors take --------------------------------------------------------------

# key: (default both connectors take, normalizer); the two files must agree on these. The
# classes have no common default: the connector's envelope names them, so a source connector
# left at its default still read what its sink sent. Connect trims every value it parses
# (ConfigDef), passwords included, so the values are compared and mapped trimmed.
SHARED = {
    "diode.host": (None, str.strip),
    "diode.port": ("3456", lambda v: _integer(v, 1, 65535)),
    "diode.encryption.password": (None, str.strip),
    "diode.encryption.salt": (None, str.strip),
    "diode.encryption.class": (None, lambda v: v.strip().rpartition(".")[2]),
    "diode.compression.class": (None, lambda v: v.strip().rpartition(".")[2]),
}
SECRET_SHARED = ("diode.encryption.password", "diode.encryption.salt")
CIPHERS = {"Aes256CbcEncryptor": "aes-256-gcm", "NoopEncryptor": "none"}
COMPRESSIONS = {"GzipCompressor": "gzip", "NoopCompressor": "none"}
_REFERENCE = re.compile(r"\$\{[^}]*\}")  # Connect config providers: ${file:PATH:KEY}, ...


def _integer(value: str, lo: int, hi: int) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ValueError(f"must be an integer, not {shown(value)}") from None
    if not lo <= n <= hi:
        raise ValueError(f"must be between {lo} and {hi}, not {n}")
    return n


def shared_values(sink: Config | None, source: Config | None) -> dict:
    """key -> (normalized value, path it came from) for every SHARED key either connector file
    sets; when both set one (or one sets it and the other keeps the connector's default) they
    must agree. Secrets are compared, never shown."""
    out = {}
    for key, (default, normalize) in SHARED.items():
        seen = []  # (value, where, set in the file)
        for cfg in (sink, source):
            raw = cfg.props.get(key) if cfg is not None else None
            if cfg is None or (raw is None and default is None):
                continue
            try:
                value = normalize(default if raw is None else raw)
            except ValueError as exc:
                raise PropertiesError(f"{cfg.path}: {key} {exc}") from None
            where = cfg.path if raw is not None else f"{cfg.path} (the connector's default)"
            seen.append((value, where, raw is not None))
        if len(seen) == 2 and seen[0][0] != seen[1][0]:
            (a, pa, _), (b, pb, _) = seen
            if key in SECRET_SHARED:
                raise PropertiesError(f"{key} differs between {pa} and {pb} (values not "
                                      "shown): both sides must use the same")
            raise PropertiesError(f"{key} is {shown(a)} in {pa} but {shown(b)} in {pb}: both "
                                  "sides must use the same")
        explicit = [(value, where) for value, where, given in seen if given]
        if explicit:
            out[key] = explicit[0]
    return out


def password(sink: Config | None, source: Config | None) -> str | None:
    """The password to write into the password file; None when there is none to write (not
    set, a Connect config provider reference diode cannot resolve, or encryption off)."""
    shared = shared_values(sink, source)
    value = shared.get("diode.encryption.password", (None,))[0]
    cipher = shared.get("diode.encryption.class", ("Aes256CbcEncryptor",))[0]
    if value is None or _REFERENCE.search(value) or CIPHERS.get(cipher) == "none":
        return None
    return value


# -- properties that mean nothing without Kafka Connect ---------------------------------------

CONNECT = "a Kafka Connect framework setting, no meaning without Connect"
CONVERTERS = ("diode copies keys, values and headers as bytes, as the ByteArrayConverter the "
              "connector requires does: nothing to set")
FRAMEWORK = {
    "connector.class": CONNECT + " (it told which connector the file configures)",
    "tasks.max": "Connect tasks: diode runs processes per stage instead, sized in "
                 "sender.stages / receiver.stages (instances, cpus); `diode tune` proposes them",
    "key.converter": CONVERTERS, "value.converter": CONVERTERS, "header.converter": CONVERTERS,
    "config.action.reload": CONNECT,
    "errors.tolerance": "diode never skips a record quietly: records the sender cannot send go "
                        "to sender.dead.letter.topic, records the destination refuses to "
                        "receiver.dead.letter.topic, lost ones to receiver.missing.records.topic",
    "errors.deadletterqueue.topic.replication.factor": "diode creates its dead-letter topic "
                                                       "with the cluster's default replication; "
                                                       "create it beforehand for another",
    "errors.deadletterqueue.context.headers.enable": "diode's dead-letter records always carry "
                                                     "their source coordinates and the error "
                                                     "in headers",
    "exactly.once.support": "Connect's exactly-once source: diode's receiver drops duplicates per "
                            "source partition and checkpoints in receiver.journal.dir",
    "transaction.boundary": "Connect's exactly-once source: diode's receiver drops duplicates "
                            "per source partition",
    "offsets.storage.topic": "Connect's source offsets: diode's receiver checkpoints in "
                             "receiver.journal.dir",
}
FRAMEWORK_PREFIXES = {
    "key.converter.": CONVERTERS, "value.converter.": CONVERTERS,
    "header.converter.": CONVERTERS,
    "transforms": "Single Message Transforms run inside Connect: diode writes every record as "
                  "it was, with provenance headers",
    "predicates": "predicates of Single Message Transforms, which run inside Connect",
    "errors.": "Connect's error handling: diode never skips a record quietly (dead-letter and "
               "missing-records topics)",
    "transaction.boundary.": "Connect's exactly-once source",
    "topic.creation.": "Connect's topic creation: diode's kafka_writer creates each missing "
                       "destination topic with the source's partition count",
    "confluent.license": "Confluent licensing: diode needs no license",
    "confluent.topic": "Confluent's license topic: diode needs no license",
    "admin.override.": "Connect's admin client: diode's admin calls use the side's kafka "
                       "settings",
}


def _framework_reason(key: str) -> str | None:
    if key in FRAMEWORK:
        return FRAMEWORK[key]
    return next((r for p, r in FRAMEWORK_PREFIXES.items() if key.startswith(p)), None)


# -- Kafka client settings: Java client properties -> librdkafka -------------------------------

_JAAS = ("Java JAAS configuration: librdkafka takes sasl.username and sasl.password; give the "
         "password as ${file:PATH} in {side}.kafka")
JAVA_ONLY = {
    "key.deserializer": "a Java deserializer: diode moves bytes as they are",
    "value.deserializer": "a Java deserializer: diode moves bytes as they are",
    "key.serializer": "a Java serializer: diode moves bytes as they are",
    "value.serializer": "a Java serializer: diode moves bytes as they are",
    "enable.auto.commit": "diode commits the sent prefix itself (sender.offset.commit.interval.ms)",
    "auto.commit.interval.ms": "diode commits the sent prefix itself "
                               "(sender.offset.commit.interval.ms)",
    "max.poll.records": "a Java consumer setting: sender.max.inflight.records bounds what a "
                        "reader holds",
    "partition.assignment.strategy": "diode's readers assign partitions themselves",
    "buffer.memory": "a Java producer setting: librdkafka's is queue.buffering.max.kbytes",
    "max.block.ms": "a Java producer setting with no librdkafka equivalent",
    "interceptor.classes": "Java interceptors",
    "metric.reporters": "Java metric reporters: diode exports Prometheus metrics",
    "sasl.jaas.config": _JAAS,
    "ssl.keystore.type": "librdkafka reads a PKCS#12 ssl.keystore.location, or PEM in "
                         "ssl.certificate.location and ssl.key.location",
    "ssl.protocol": "a Java TLS setting with no librdkafka equivalent",
    "ssl.enabled.protocols": "a Java TLS setting with no librdkafka equivalent",
    "ssl.provider": "a Java TLS setting with no librdkafka equivalent",
    "ssl.keymanager.algorithm": "a Java TLS setting with no librdkafka equivalent",
    "ssl.trustmanager.algorithm": "a Java TLS setting with no librdkafka equivalent",
    "ssl.secure.random.implementation": "a Java TLS setting with no librdkafka equivalent",
}
JAVA_ONLY_PREFIXES = {
    "ssl.truststore.": "a Java trust store: librdkafka takes PEM CA certificates in "
                       "ssl.ca.location",
    "sasl.login.": "a Java SASL login setting",
    "sasl.client.callback.handler.": "a Java SASL callback handler",
}
_SECRET_WORDS = ("password", "secret", "jaas", "credential", "user.info", "token")
START_POSITIONS = {"earliest": "earliest", "smallest": "earliest", "beginning": "earliest",
                   "latest": "latest", "largest": "latest", "end": "latest"}
# What a side's client needs to reach its cluster: the part of missing.records.* diode keeps.
CONNECTION_KEYS = ("bootstrap.servers", "security.protocol", "sasl.", "ssl.", "client.dns.lookup")

# How much a Kafka setting's source weighs: a connector's override beats the worker's
# consumer./producer. settings, which beat what the worker's top level gives every client.
WORKER_LEVEL, MISSING_LEVEL, WORKER_CLIENT_LEVEL, GROUP_LEVEL, OVERRIDE_LEVEL = range(5)


def _client_setting(side: str, key: str, value: str) -> tuple:
    """What one Java client property becomes: ("kafka", key, value), ("start", position) or
    ("skip", reason). Secrets are never copied: the topology may only name a file holding one."""
    reason = JAVA_ONLY.get(key) or next(
        (r for p, r in JAVA_ONLY_PREFIXES.items() if key.startswith(p)), None)
    if reason:
        return "skip", reason.replace("{side}", side)
    if key in SECRET_KAFKA_KEYS or any(word in key for word in _SECRET_WORDS):
        return "skip", (f"a secret: diode never writes one in the topology; put it in a file "
                        f"(mode 0600) and set {side}.kafka.{key}: ${{file:PATH}}")
    if key == "auto.offset.reset" and side == "sender":
        position = START_POSITIONS.get(value.strip().lower())
        if position is None:
            return "skip", (f"{shown(value)}: a partition with no committed offset starts at "
                            "sender.start.position, earliest or latest")
        return "start", position
    if _REFERENCE.search(value):
        return "skip", ("a Connect config provider reference: diode cannot resolve it; give "
                        f"the value in {side}.kafka as ${{file:PATH}} or ${{env:NAME}}")
    return "kafka", key, _scalar(value.strip())


def _scalar(value: str):
    """A librdkafka value as YAML shows it best: integers and booleans as such, when they
    read back as the same text."""
    if re.fullmatch(r"-?[1-9][0-9]*|0", value):
        return int(value)
    return {"true": True, "false": False}.get(value, value)


# -- the mapping ------------------------------------------------------------------------------

class _Draft:
    """What the files of one side say, gathered property by property."""

    def __init__(self, role: str):
        self.role, self.side = role, SIDE_OF[role]
        self.values: dict = {}      # topology path -> value
        self.kafka: dict = {}       # librdkafka key -> (level, value, property, path)
        self.unmapped: list = []
        self.notes: list = []

    def skip(self, cfg, key, reason):
        self.unmapped.append(Unmapped(key, cfg.path, reason))

    def client(self, cfg, prop, key, value, level):
        """A Java client property for this side's kafka map, at `level`."""
        result = _client_setting(self.side, key, value)
        if result[0] == "skip":
            self.skip(cfg, prop, result[1])
        elif result[0] == "start":
            self.values["sender.start.position"] = result[1]
        else:
            self.offer(result[1], result[2], level, prop, cfg.path)

    def offer(self, key, value, level, prop, path):
        held = self.kafka.get(key)
        if held is None or level >= held[0]:
            if held and held[1] != value:
                self.unmapped.append(Unmapped(held[2], held[3], f"overridden by {prop} "
                                              f"({shown(path)})"))
            self.kafka[key] = (level, value, prop, path)
        elif held[1] != value:
            self.unmapped.append(Unmapped(prop, path, f"overridden by {held[2]} "
                                          f"({shown(held[3])})"))


def _take_sink(d: _Draft, cfg: Config, key: str, value: str) -> bool:
    """The sink connector's own properties (and its worker's); False: not one of them."""
    if key == "topics":
        d.values["sender.topics"] = [t.strip() for t in value.split(",") if t.strip()]
    elif key == "topics.regex":
        d.values["sender.topics.regex"] = [value.strip()]
    elif key == "diode.buffer.size.kb":
        try:
            kb = _integer(value, 1, 1 << 20)
        except ValueError as exc:
            raise PropertiesError(f"{cfg.path}: {key} {exc}") from None
        d.values["link.datagram.size.bytes"] = min(kb * 1024, MAX_UDP_PAYLOAD)
        if kb * 1024 > MAX_UDP_PAYLOAD:
            d.notes.append(f"{key} {kb} is more than one UDP datagram holds: "
                           f"link.datagram.size.bytes is {MAX_UDP_PAYLOAD}, the largest")
    elif key == "errors.deadletterqueue.topic.name":
        d.values["sender.dead.letter.topic"] = value.strip()
    elif key == "name" and not cfg.worker:
        d.values["connector.name"] = value.strip()
    elif key.startswith("consumer.override."):
        d.client(cfg, key, key.removeprefix("consumer.override."), value, OVERRIDE_LEVEL)
    elif key.startswith("consumer."):
        d.client(cfg, key, key.removeprefix("consumer."), value, WORKER_CLIENT_LEVEL)
    elif key == "offset.flush.interval.ms":
        try:
            d.values["sender.offset.commit.interval.ms"] = _integer(value, 1, 1 << 31)
        except ValueError as exc:
            raise PropertiesError(f"{cfg.path}: {key} {exc}") from None
    else:
        return False
    return True


def _take_source(d: _Draft, cfg: Config, key: str, value: str) -> bool:
    """The source connector's own properties (and its worker's); False: not one of them."""
    if key == "diode.bind.address":
        d.values["link.bind.address"] = value.strip()
    elif key == "kafka.topic.prefix":
        d.values["receiver.topic.prefix"] = value.strip()
    elif key == "missing.records.topic":
        d.values["receiver.missing.records.topic"] = value.strip()
        d.notes.append("receiver.missing.records.topic gets one JSON record per missing range "
                       "and one per late fill, exact rather than best effort "
                       f"({messages.missing_records_fields()}: docs/events.md)")
    elif key.startswith("missing.records."):
        sub = key.removeprefix("missing.records.")
        if sub.startswith(CONNECTION_KEYS):
            d.client(cfg, key, sub, value, MISSING_LEVEL)
        else:
            d.skip(cfg, key, "a setting of the connector's own missing-records producer: diode "
                   "writes missing ranges with the destination's producer (receiver.kafka)")
    elif key.startswith("producer.override."):
        d.client(cfg, key, key.removeprefix("producer.override."), value, OVERRIDE_LEVEL)
    elif key.startswith("producer."):
        d.client(cfg, key, key.removeprefix("producer."), value, WORKER_CLIENT_LEVEL)
    elif key == "name" and not cfg.worker:
        d.skip(cfg, key, "the Connect connector's name")
    else:
        return False
    return True


_TAKE = {SINK: _take_sink, SOURCE: _take_source}
_OTHER = {SINK: SOURCE, SOURCE: SINK}
# What only the other connector takes, to say so when a file has it.
_ONLY = {SINK: (("topics", "topics.regex", "diode.buffer.size.kb",
                 "errors.deadletterqueue.topic.name"), ("consumer.override.",)),
         SOURCE: (("diode.bind.address", "kafka.topic.prefix", "missing.records.topic"),
                  ("missing.records.", "producer.override."))}


def _other_connectors(role: str, key: str) -> bool:
    keys, prefixes = _ONLY[_OTHER[role]]
    return key in keys or key.startswith(prefixes)


def _draft(role: str, configs: list) -> _Draft:
    """Every property of one side's files (the worker's first, so the connector's win)."""
    d = _Draft(role)
    for cfg in configs:
        for key, value in cfg.props.items():
            if key in SHARED:
                if cfg.worker:
                    d.skip(cfg, key, "a connector setting in the worker's file: Connect "
                           "ignores it there")
                continue  # shared_values() reads these
            if key == "bootstrap.servers":
                d.client(cfg, key, key, value, WORKER_LEVEL)
            elif _TAKE[role](d, cfg, key, value):
                pass
            elif (reason := _framework_reason(key)) is not None:
                d.skip(cfg, key, reason)
            elif _other_connectors(role, key):
                d.skip(cfg, key, f"a setting of the {_OTHER[role]} connector, which the "
                       f"{role} connector does not take")
            elif cfg.worker:
                d.skip(cfg, key, "a Kafka Connect worker setting, no meaning without Connect")
            else:
                d.skip(cfg, key, f"not a setting of the Data Diode {role} connector (a typo?)")
    return d


def to_topology(sink: Config | None = None, source: Config | None = None, *,
                sink_worker: Config | None = None, source_worker: Config | None = None,
                password_file: str = DEFAULT_PASSWORD_FILE,
                name: str = "diode") -> tuple[dict, list, list]:
    """The topology (a dict for diode.runtime.topology.from_dict) that does what the connectors did,
    the properties it could not map (Unmapped, each with its reason) and notes on what diode
    does differently or had to assume. Either connector may be missing: its side is then
    filled with placeholders the notes name. Raises PropertiesError on bad or conflicting
    values. The password itself is never in the result: security.password.file names
    `password_file`, which the caller writes (see `password`)."""
    assign_roles([], sink, source)  # each file is the connector it is given as
    shared = shared_values(sink, source)
    drafts = {role: _draft(role, [c for c in configs if c is not None])
              for role, configs in ((SINK, (sink_worker, sink)),
                                    (SOURCE, (source_worker, source)))}
    unmapped = [u for d in drafts.values() for u in d.unmapped]
    notes = [n for d in drafts.values() for n in d.notes]
    values = {**drafts[SINK].values, **drafts[SOURCE].values}

    t = {"name": name, "compression": "none", "link": {}, "security": {}}
    _map_link(t["link"], shared, values, sink, source, notes)
    t["compression"] = _map_compression(shared, unmapped)
    t["security"] = _map_security(shared, password_file, unmapped, notes)
    t["sender"] = _map_sender(drafts[SINK], values, sink, notes)
    t["receiver"] = _map_receiver(drafts[SOURCE], values, source, notes)
    return t, unmapped, notes


def _map_link(link: dict, shared: dict, values: dict, sink, source, notes: list) -> None:
    bind = values.get("link.bind.address")
    if shared.get("diode.host", ("",))[0]:
        link["host"] = shared["diode.host"][0]
    elif bind and bind != "0.0.0.0":
        link["host"] = bind
        notes.append(f"link.host is the source connector's bind address {bind}: the sender "
                     "sends there (change it if the low side is reached by another address)")
    else:
        notes.append("link.host is 127.0.0.1: no diode.host given; set it to the receiver's "
                     "address as the sender sees it across the diode")
    link["port"] = shared.get("diode.port", (3456,))[0]
    if bind:
        link["bind.address"] = bind
    if "link.datagram.size.bytes" in values:
        link["datagram.size.bytes"] = size = values["link.datagram.size.bytes"]
        if size > ETHERNET_DATAGRAM:
            notes.append(f"link.datagram.size.bytes {size} relies on IP fragmentation, where "
                         f"one lost fragment loses the whole datagram; {ETHERNET_DATAGRAM} fits an "
                         "MTU of 1500 (diode fragments large records itself)")
    elif sink is not None:
        notes.append("diode.buffer.size.kb not given: the connector sent datagrams of up to "
                     "40 KB; diode sends datagrams that fit the path's MTU "
                     f"(link.datagram.size.bytes: auto, {ETHERNET_DATAGRAM} bytes for an MTU of "
                     "1500)")
    if sink is not None:
        notes.append("the connector sends unpaced; diode paces the sender at link.rate.mbps "
                     "(100 by default): set it just under what the link and the receiver take "
                     "(diode check measures the receiver)")


def _map_compression(shared: dict, unmapped: list) -> str:
    cls, path = shared.get("diode.compression.class", ("NoopCompressor", ""))
    if cls in COMPRESSIONS:
        return COMPRESSIONS[cls]
    unmapped.append(Unmapped("diode.compression.class", path, f"{shown(cls)} is not a "
                             "compressor diode has: compression is none; diode also offers "
                             "gzip, zstd and lz4"))
    return "none"


def _map_security(shared: dict, password_file: str, unmapped: list, notes: list) -> dict:
    cls, cls_path = shared.get("diode.encryption.class", ("Aes256CbcEncryptor", ""))
    cipher = CIPHERS.get(cls)
    if cipher is None:
        unmapped.append(Unmapped("diode.encryption.class", cls_path, f"{shown(cls)} is not an "
                                 "encryptor diode knows: diode encrypts with aes-256-gcm"))
        cipher = "aes-256-gcm"
    if cipher == "none":
        for key in SECRET_SHARED:
            if key in shared:
                unmapped.append(Unmapped(key, shared[key][1], "unused: diode.encryption.class "
                                         "is NoopEncryptor"))
        notes.append("NoopEncryptor: security.cipher is none with allow.plaintext, as the "
                     "connector sent; anyone on the low side network can then forge records. "
                     "Give a password file and salt and drop both keys to encrypt")
        return {"cipher": "none", "allow.plaintext": True}
    missing = [k for k in SECRET_SHARED if not shared.get(k, ("",))[0]]
    if missing:
        raise PropertiesError(f"{' and '.join(missing)} not given: the connector encrypts with "
                              "them (diode.encryption.class NoopEncryptor turns encryption off)")
    secret, secret_path = shared["diode.encryption.password"]
    if _REFERENCE.search(secret):
        unmapped.append(Unmapped("diode.encryption.password", secret_path, "a Connect config "
                                 f"provider reference diode cannot resolve: write the password "
                                 f"itself into {password_file} (mode 0600)"))
    salt = shared["diode.encryption.salt"][0]
    if _REFERENCE.search(salt):
        raise PropertiesError(f"{shared['diode.encryption.salt'][1]}: diode.encryption.salt is "
                              "a Connect config provider reference diode cannot resolve: give "
                              "the salt itself")
    return {"cipher": cipher, "password.file": password_file, "salt": salt}


def _kafka(d: _Draft, side_given: bool, notes: list) -> dict:
    kafka = {key: held[1] for key, held in d.kafka.items()}
    if "bootstrap.servers" not in kafka:
        kafka = {"bootstrap.servers": CONNECT_BOOTSTRAP, **kafka}
        cluster = "source" if d.side == "sender" else "destination"
        notes.append(f"{d.side}.kafka.bootstrap.servers is {CONNECT_BOOTSTRAP}, Connect's "
                     f"default: the {d.role} connector's files do not name the {cluster} "
                     f"cluster; set it, or give the Connect worker's file (--{d.role}-worker)"
                     if side_given else
                     f"no {d.role} connector file: {d.side}.kafka.bootstrap.servers is "
                     f"{CONNECT_BOOTSTRAP}, a placeholder for the {cluster} cluster")
    return kafka


def _map_sender(d: _Draft, values: dict, sink: Config | None, notes: list) -> dict:
    connector = values.get("connector.name")
    if connector:  # Connect names a sink's group after it, unless consumer.override.group.id
        d.offer("group.id", f"connect-{connector}", GROUP_LEVEL, "name", sink.path)
        if d.kafka["group.id"][2] == "name":
            notes.append(f"sender.kafka.group.id is connect-{connector}, the sink connector's "
                         "consumer group: diode resumes from the offsets the connector "
                         "committed (stop the connector first)")
    sender = {"kafka": _kafka(d, sink is not None, notes)}
    for key in ("topics", "topics.regex", "start.position", "dead.letter.topic",
                "offset.commit.interval.ms"):
        if f"sender.{key}" in values:
            sender[key] = values[f"sender.{key}"]
    if sink is None:
        sender["topics"] = [PLACEHOLDER_TOPIC]
        notes.append(f"no sink connector file: sender.topics is {PLACEHOLDER_TOPIC}, a "
                     "placeholder; the high side fills in the sender section")
    elif "dead.letter.topic" not in sender:
        notes.append("records larger than sender.max.record.bytes (8 MiB; the connector's "
                     "limit was 64 KB) go to diode-dead-letter on the source cluster "
                     "(sender.dead.letter.topic; empty: logged only, as the connector did)")
    return sender


def _map_receiver(d: _Draft, values: dict, source: Config | None, notes: list) -> dict:
    receiver = {"kafka": _kafka(d, source is not None, notes)}
    for key in ("topic.prefix", "missing.records.topic"):
        if f"receiver.{key}" in values:
            receiver[key] = values[f"receiver.{key}"]
    return receiver
