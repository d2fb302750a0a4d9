"""`diode import-properties`: a topology from the Confluent Data Diode connector's configuration.

Confluent's *sink* connector runs on the high side and sends datagrams (diode's sender); its
*source* connector runs on the low side and receives them (diode's receiver). An operator moving
from the connector has their two .properties files (or the JSON a Connect REST API takes) and,
perhaps, the Connect workers' files. This module maps every property it can to a topology key and
lists every other one with the reason, so nothing changes behind the operator's back; the
password is never written into the topology, only into a file of its own.

Pure functions do the work (parse_properties, to_topology, render_yaml); `main` around them
reads the files, validates the result with the topology registry, writes the password file and
prints. Bad input (an unreadable file, a malformed line, values the two sides disagree on) is a
PropertiesError, exit 2.
"""

import json
import os
import re
import string
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

from diode.errors import DiodeError
from diode.kafka import messages
from diode.runtime import files
from diode.runtime.topology import SECRET_KAFKA_KEYS

SINK, SOURCE = "sink", "source"
SIDE_OF = {SINK: "sender", SOURCE: "receiver"}
CONNECTOR_CLASS = {SINK: "DataDiodeSinkConnector", SOURCE: "DataDiodeSourceConnector"}
DEFAULT_PASSWORD_FILE = "secrets/diode.password"
CONNECT_BOOTSTRAP = "localhost:9092"  # Kafka Connect's default bootstrap.servers
PLACEHOLDER_TOPIC = "CHANGE-ME"
MAX_DATAGRAM = 65507  # the largest UDP payload over IPv4
MTU_DATAGRAM = 1472   # one Ethernet frame of 1500 bytes


class PropertiesError(DiodeError):
    """Input that cannot be imported: which file, which line or property, what is wrong."""


@dataclass(frozen=True)
class Config:
    """One file read: where it came from (for messages), its properties in file order, and
    whether it is a Connect worker's file (connect-standalone.properties) or a connector's."""
    path: str
    props: dict
    worker: bool = False


@dataclass(frozen=True)
class Unmapped:
    """A property that has no place in the topology, and why."""
    key: str
    path: str
    reason: str


# -- java.util.Properties ---------------------------------------------------------------------

_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str, path: str = "<text>") -> dict:
    """Properties as java.util.Properties.load reads them: `key=value`, `key: value` or
    `key value`; `#` and `!` comment lines; a line ending in an odd number of backslashes goes
    on with the next (its leading whitespace dropped); \\t \\n \\r \\f \\uXXXX escapes, and a
    backslash before any other character stands for that character. The last of a repeated key
    wins, as in Java. Raises PropertiesError naming the line of a malformed \\u escape."""
    props = {}
    for lineno, line in _logical_lines(text):
        key, value = _split(line)
        props[_unescape(key, path, lineno)] = _unescape(value, path, lineno)
    return props


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _logical_lines(text: str):
    """(number of the first natural line, logical line): blank and comment lines dropped,
    continued lines joined. A comment line never continues."""
    lines = re.split(r"\r\n|\r|\n", text)
    i = 0
    while i < len(lines):
        start, line = i + 1, lines[i].lstrip(_WS)
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            line = line[:-1]
            if i == len(lines):
                break  # a continuation at the end of the file continues with nothing
            line += lines[i].lstrip(_WS)
            i += 1
        yield start, line


def _split(line: str) -> tuple[str, str]:
    """Key and (still escaped) value: the key ends at the first unescaped `=`, `:` or
    whitespace; one separator, with whitespace around it, comes before the value."""
    i = 0
    while i < len(line) and line[i] not in "=:" + _WS:
        i += 2 if line[i] == "\\" else 1
    key, rest = line[:i], line[i:]
    separated = rest[:1] in ("=", ":")
    rest = (rest[1:] if separated else rest).lstrip(_WS)
    if not separated and rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WS)
    return key, rest


def _unescape(s: str, path: str, lineno: int) -> str:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        i += 1
        if c != "\\":
            out.append(c)
        elif i < len(s) and s[i] == "u":
            digits = s[i + 1:i + 5]
            if len(digits) < 4 or not all(d in string.hexdigits for d in digits):
                raise PropertiesError(f"{path}:{lineno}: malformed \\uxxxx escape "
                                      f"\\u{_shown(digits)}")
            out.append(chr(int(digits, 16)))
            i += 5
        elif i < len(s):
            out.append(_ESCAPES.get(s[i], s[i]))
            i += 1
    try:  # \uXXXX pairs may spell one character beyond the basic plane, as UTF-16 does
        return "".join(out).encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        raise PropertiesError(f"{path}:{lineno}: a \\uXXXX escape is half of a surrogate "
                              "pair") from None


def parse_json_config(text: str, path: str) -> dict:
    """A connector configuration as the Connect REST API takes it: {"name": ..., "config":
    {...}} or the bare config map. Values become the strings a .properties file would hold."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PropertiesError(f"{path}: not valid JSON: {exc}") from None
    config = data.get("config", data) if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise PropertiesError(f"{path}: a JSON connector configuration is an object (with a "
                              "\"config\" object)")
    props = {}
    if isinstance(data.get("name"), str) and "config" in data:
        props["name"] = data["name"]
    for key, value in config.items():
        if isinstance(value, (dict, list)) or value is None:
            raise PropertiesError(f"{path}: {_shown(key)} must be a string, not {value!r}")
        props[key] = value if isinstance(value, str) else json.dumps(value)
    return props


def read_config(path: str, worker: bool = False) -> Config:
    """Read one file: JSON if it starts with `{`, otherwise .properties (UTF-8; Latin-1, what
    Java reads, when it is not UTF-8)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise PropertiesError(f"cannot read {path}: {exc.strerror}") from None
    if b"\0" in raw:
        raise PropertiesError(f"{path}: not a text file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    props = (parse_json_config(text, path) if text.lstrip().startswith("{")
             else parse_properties(text, path))
    if not props:
        raise PropertiesError(f"{path}: holds no properties")
    return Config(path, props, worker)


# -- which connector a file configures --------------------------------------------------------

_SINK_HINTS = ("topics", "topics.regex", "diode.buffer.size.kb")
_SOURCE_HINTS = ("kafka.topic.prefix", "missing.records.topic", "diode.bind.address")


def role_of(cfg: Config) -> str | None:
    """SINK or SOURCE from connector.class, else from the properties only one of them takes;
    None when the file does not say. A connector.class of another connector is an error."""
    cls = cfg.props.get("connector.class", "").strip()
    if cls:
        for role, name in CONNECTOR_CLASS.items():
            if cls.rpartition(".")[2] == name:
                return role
        raise PropertiesError(f"{cfg.path}: connector.class is {_shown(cls)}, not the Data "
                              "Diode sink or source connector")
    sink = any(k in cfg.props for k in _SINK_HINTS)
    source = any(k in cfg.props for k in _SOURCE_HINTS)
    return SINK if sink and not source else SOURCE if source and not sink else None


def assign_roles(files: list, sink: Config | None = None,
                 source: Config | None = None) -> tuple:
    """(sink, source) from files given by role and files whose role is read from their
    content; one file whose content does not say takes the role left over."""
    given = {SINK: sink, SOURCE: source}
    for role, cfg in given.items():
        found = cfg and role_of(cfg)
        if found and found != role:
            raise PropertiesError(f"{cfg.path} configures the {found} connector "
                                  f"(connector.class), but was given as --{role}")
    unknown = []
    for cfg in files:
        role = role_of(cfg)
        if role is None:
            unknown.append(cfg)
        elif given[role] is not None:
            raise PropertiesError(f"{given[role].path} and {cfg.path} both configure the "
                                  f"{role} connector")
        else:
            given[role] = cfg
    free = [role for role, cfg in given.items() if cfg is None]
    if len(unknown) > 1 or (unknown and len(free) != 1):
        raise PropertiesError(f"cannot tell whether {unknown[0].path} configures the sink or "
                              "the source connector (no connector.class): give it with --sink "
                              "or --source")
    if unknown:
        given[free[0]] = unknown[0]
    if given[SINK] is None and given[SOURCE] is None:
        raise PropertiesError("give the sink connector's file, the source connector's, or both")
    return given[SINK], given[SOURCE]


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
        raise ValueError(f"must be an integer, not {_shown(value)}") from None
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
            raise PropertiesError(f"{key} is {_shown(a)} in {pa} but {_shown(b)} in {pb}: both "
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
            return "skip", (f"{_shown(value)}: a partition with no committed offset starts at "
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
                                              f"({_shown(path)})"))
            self.kafka[key] = (level, value, prop, path)
        elif held[1] != value:
            self.unmapped.append(Unmapped(prop, path, f"overridden by {held[2]} "
                                          f"({_shown(held[3])})"))


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
        d.values["link.datagram.size.bytes"] = min(kb * 1024, MAX_DATAGRAM)
        if kb * 1024 > MAX_DATAGRAM:
            d.notes.append(f"{key} {kb} is more than one UDP datagram holds: "
                           f"link.datagram.size.bytes is {MAX_DATAGRAM}, the largest")
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
        if size > MTU_DATAGRAM:
            notes.append(f"link.datagram.size.bytes {size} relies on IP fragmentation, where "
                         f"one lost fragment loses the whole datagram; {MTU_DATAGRAM} fits an "
                         "MTU of 1500 (diode fragments large records itself)")
    elif sink is not None:
        notes.append("diode.buffer.size.kb not given: the connector sent datagrams of up to "
                     "40 KB; diode sends datagrams that fit the path's MTU "
                     f"(link.datagram.size.bytes: auto, {MTU_DATAGRAM} bytes for an MTU of "
                     "1500)")
    if sink is not None:
        notes.append("the connector sends unpaced; diode paces the sender at link.rate.mbps "
                     "(100 by default): set it just under what the link and the receiver take "
                     "(diode check measures the receiver)")


def _map_compression(shared: dict, unmapped: list) -> str:
    cls, path = shared.get("diode.compression.class", ("NoopCompressor", ""))
    if cls in COMPRESSIONS:
        return COMPRESSIONS[cls]
    unmapped.append(Unmapped("diode.compression.class", path, f"{_shown(cls)} is not a "
                             "compressor diode has: compression is none; diode also offers "
                             "gzip, zstd and lz4"))
    return "none"


def _map_security(shared: dict, password_file: str, unmapped: list, notes: list) -> dict:
    cls, cls_path = shared.get("diode.encryption.class", ("Aes256CbcEncryptor", ""))
    cipher = CIPHERS.get(cls)
    if cipher is None:
        unmapped.append(Unmapped("diode.encryption.class", cls_path, f"{_shown(cls)} is not an "
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


# -- the YAML ---------------------------------------------------------------------------------

HEADER = """\
Generated by `diode import-properties` from the Confluent Data Diode connector's configuration.
Every key: docs/topology.md. Check it on each side with: diode check FILE --side sender|receiver

The link format differs: the connector encrypts with AES-CBC, without authentication; diode
seals every datagram with AES-256-GCM, from a key derived the same way (PBKDF2-HMAC-SHA256,
65 536 rounds, from the same password and salt). Both sides must run diode: a connector and
diode cannot talk to each other. The password is not in this file: security.password.file names
the file holding it."""


def _shown(value) -> str:
    """A value fit for a message or a YAML comment: quoted when it is not plain printable text
    (a newline in a property must not end a comment line)."""
    text = str(value)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


def _comment(text: str, indent: str = "", hang: str = "") -> list[str]:
    """`text` as YAML comment lines of at most 100 characters; `hang` indents the lines a
    paragraph wraps onto."""
    lines = []
    for para in text.split("\n"):
        wrapped = textwrap.wrap(para, 98 - len(indent), subsequent_indent=hang,
                                break_on_hyphens=False, break_long_words=False) or [""]
        lines += [f"# {indent}{w}".rstrip() for w in wrapped]
    return lines


def grouped(unmapped) -> list[str]:
    """One line per reason: the properties (and files) it applies to, in the order met."""
    by_file: dict = {}
    for u in unmapped:
        by_file.setdefault((u.reason, u.path), []).append(_shown(u.key))
    lines: dict = {}
    for (reason, path), keys in by_file.items():
        lines.setdefault((reason, tuple(keys)), []).append(_shown(path))
    return [f"{', '.join(keys)} ({', '.join(paths)}): {reason}"
            for (reason, keys), paths in lines.items()]


class _Dumper(yaml.SafeDumper):
    """Lists of plain values on one line, as in the demo topology: `topics: [a, b]`."""


_Dumper.add_representer(list, lambda dumper, data: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", data,
    flow_style=all(isinstance(x, (str, int, float, bool)) for x in data)))


def render_yaml(topology: dict, unmapped=(), notes=(), origins=()) -> str:
    """The topology as YAML, after a comment block: where it came from, what differs from the
    connector, the notes and every property not mapped with its reason."""
    out = _comment(HEADER)
    if origins:
        out += ["#"] + _comment("From:") + [line for o in origins for line in _comment(o, "  ")]
    if notes:
        out += ["#"] + _comment("Notes:")
        out += [line for n in notes for line in _comment(f"- {n}", "  ", "  ")]
    if unmapped:
        out += ["#"] + _comment(f"Not mapped ({len(unmapped)} properties):")
        out += [line for g in grouped(unmapped) for line in _comment(f"- {g}", "  ", "  ")]
    body = [yaml.dump({key: value}, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                      allow_unicode=True, width=100) for key, value in topology.items()]
    compact = [b for b in body if "\n" not in b.rstrip("\n")]  # name:, compression:
    return "\n".join(out) + "\n" + "".join(compact) + "\n" + "\n".join(
        b for b in body if b not in compact)


# -- the command ------------------------------------------------------------------------------

def password_paths(output: str | None, option: str | None) -> tuple[Path, str]:
    """(where to write the password file, how the topology names it). The topology names it
    relative to its own directory (the output's, or this one when it goes to stdout)."""
    base = Path(output).resolve().parent if output else Path.cwd()
    if option is None:
        return base / DEFAULT_PASSWORD_FILE, DEFAULT_PASSWORD_FILE
    path = Path(option)
    if path.is_absolute():
        return path, option
    return path, os.path.relpath(path.resolve(), base)


def write_secret(path: Path, secret: str, force: bool) -> str:
    """Write `secret` to `path` with mode 0600 (through a new file, so never a moment with
    looser permissions); returns "written" or "unchanged". A file holding something else is
    replaced only with `force`."""
    if path.exists():
        try:
            held = path.read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise PropertiesError(f"cannot read {path}: {exc.strerror}") from None
        if held == secret.encode():
            return "unchanged"
        if not force:
            raise PropertiesError(f"{path} exists and holds another password: give --force to "
                                  "replace it, or --password-file another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        files.replace(path, secret + "\n", sync=False, mode=0o600)
    except OSError as exc:
        raise PropertiesError(f"cannot write the password file {path}: {exc.strerror}") from None
    return "written"


def _wrap(text: str, hang: str) -> str:
    return "\n".join(textwrap.wrap(text, 100, subsequent_indent=hang, break_on_hyphens=False,
                                   break_long_words=False))


def run(args, stdout=None, stderr=None) -> int:
    """Read, map, validate, write the password file, print; PropertiesError on bad input."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    from diode.runtime import topology as topo
    from diode.errors import TopologyError

    def read(path, worker=False):
        return read_config(path, worker) if path else None

    if len(args.files) > 2:
        raise PropertiesError("give at most two files: the sink connector's and the source's")
    sink, source = assign_roles([read(p) for p in args.files], read(args.sink),
                                read(args.source))
    if args.output and Path(args.output).exists() and not args.force:
        raise PropertiesError(f"{args.output} exists: give --force to replace it")
    secret_path, secret_ref = password_paths(args.output, args.password_file)
    t, unmapped, notes = to_topology(
        sink, source, sink_worker=read(args.sink_worker, True),
        source_worker=read(args.source_worker, True), password_file=secret_ref, name=args.name)
    try:
        topo.from_dict(t, args.output or "<stdout>")
    except TopologyError as exc:
        raise PropertiesError(f"the topology made is not valid:\n{exc}") from None
    origins = [f"{role} connector ({side}, diode's {SIDE_OF[role]}): {cfg.path}"
               for role, side, cfg in ((SINK, "high side", sink), (SOURCE, "low side", source))
               if cfg is not None]
    text = render_yaml(t, unmapped, notes, origins)

    secret = password(sink, source)
    if secret is not None:
        done = write_secret(secret_path, secret, args.force)
        where = ("" if args.output or os.path.isabs(secret_ref) else
                 " (the topology names it relative to its own directory: keep the topology in "
                 "this one)")
        print(f"password: {'written to' if done == 'written' else 'already in'} {secret_path} "
              f"(mode 0600), named by security.password.file{where}", file=stderr)
    elif t["security"].get("password.file"):
        print(f"password: not written; put it in {secret_path} (mode 0600)", file=stderr)
    if args.output:
        try:
            files.replace(args.output, text, sync=False, mode=0o644)
        except OSError as exc:
            raise PropertiesError(f"cannot write {args.output}: {exc.strerror}") from None
        print(f"topology: written to {args.output}", file=stderr)
    else:
        stdout.write(text)
    for n in notes:
        print(_wrap(f"note: {n}", "  "), file=stderr)
    if unmapped:
        print(f"not mapped ({len(unmapped)} properties; listed at the top of the topology too):",
              file=stderr)
        for g in grouped(unmapped):
            print(_wrap(f"  {g}", "    "), file=stderr)
    return 0


def main(args) -> int:
    """`diode import-properties`: exit 0, or 2 with the reason on bad input."""
    try:
        return run(args)
    except PropertiesError as exc:
        print(f"diode import-properties: {exc}", file=sys.stderr)
        return 2


def add_parser(sub) -> None:
    p = sub.add_parser(
        "import-properties", help="make a topology from the Confluent Data Diode connector's "
        "sink and/or source .properties (stdout); lists what cannot be mapped",
        description="Map the Confluent Data Diode connector's configuration to a diode "
        "topology. The sink connector (high side) becomes the sender, the source connector "
        "(low side) the receiver. Positional files are told apart by connector.class.")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="the sink's and/or the source's .properties (or Connect REST JSON)")
    p.add_argument("--sink", metavar="FILE", help="the sink connector's configuration")
    p.add_argument("--source", metavar="FILE", help="the source connector's configuration")
    p.add_argument("--sink-worker", metavar="FILE", help="the high side's Connect worker "
                   "properties: bootstrap.servers and consumer.* settings")
    p.add_argument("--source-worker", metavar="FILE", help="the low side's Connect worker "
                   "properties: bootstrap.servers and producer.* settings")
    p.add_argument("-o", "--output", metavar="FILE", help="write the topology here instead of "
                   "stdout")
    p.add_argument("--password-file", metavar="PATH", help="where to write the password "
                   f"(mode 0600); default {DEFAULT_PASSWORD_FILE} beside the output, or here")
    p.add_argument("--force", action="store_true", help="replace an existing password file "
                   "holding another password, or an existing --output")
    p.add_argument("--name", default="diode", help="the topology's name (default diode)")
    p.set_defaults(func=main)
