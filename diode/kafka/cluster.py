"""The Kafka cluster a command talks to: its client settings, given the same way to every
command that reads or writes one (`diode produce`, `consume`, `verify`, `tickets`, `resend`),
and a first question to it that fails clearly.

The settings come from, each over the one before:

- `--topology FILE`: a side's `kafka` section (`--side`, where a command may talk to either
  side's cluster; by default the side whose cluster the command is about), read as the launch
  reads it (diode.kafka.clients.client_settings: ${file:PATH} relative to the topology file,
  ${env:NAME}), keeping what says how to reach the cluster (clients.CONNECTION_KEYS:
  bootstrap.servers, security.*, sasl.*, ssl.*, ...), not how the pipeline tunes its producers
  and consumers;
- `-X KEY=VALUE`, repeatable: a librdkafka setting by its name, as kcat takes it; a value may
  name a file or a variable as in a topology (${file:PATH}, relative to the current directory,
  or ${env:NAME}), which keeps a secret off the command line, where every user of the host can
  read it;
- `--bootstrap HOST:PORT[,...]`: bootstrap.servers.

`reach` asks the cluster for its metadata before the command does anything else and turns what
librdkafka says when it cannot into one error naming the setting to check, within a timeout:
authentication refused (sasl.password), a certificate not trusted (ssl.ca.location), a listener
of another security.protocol, nothing answering at bootstrap.servers. What waiting cannot mend
(a refused password, a certificate not trusted) ends it at once. No secret's value is printed,
in errors or with `diode -v`: `describe` and `source_of` say where a secret came from instead.
"""

import argparse
import logging
import os
import re
import time
from dataclasses import dataclass

from diode.errors import ClusterError, SecretError
from diode.runtime.topology import REFERENCE, SECRET_KAFKA_KEYS, SIDES

CONNECT_TIMEOUT_SECONDS = 10.0
WHAT = {"sender": "the source cluster", "receiver": "the destination cluster"}
# what librdkafka adds around a log line or an error: "sasl_ssl://host:port/bootstrap: ...
# (after 8ms in state SSL_HANDSHAKE)"
NOISE = re.compile(r"^\S+/\S+: | \(after \d+ms in state \w+\)$")
log = logging.getLogger("diode.kafka.cluster")


def is_secret(key: str) -> bool:
    """A setting whose value is never printed (the topology's secrets, and any password,
    secret or JAAS configuration)."""
    return key in SECRET_KAFKA_KEYS or "password" in key or "secret" in key or \
        key in ("sasl.jaas.config", "sasl.oauthbearer.config")


@dataclass(frozen=True)
class Cluster:
    """One cluster's librdkafka settings (`settings`, resolved: secrets in clear, never
    printed), each as it was given (`given`: a ${file:}/${env:} reference kept) and where
    (`origin`: "in receiver.kafka of FILE", "given with -X", "given with --bootstrap")."""
    what: str  # "the destination cluster", for messages
    settings: dict
    given: dict
    origin: dict

    @property
    def bootstrap(self) -> str:
        return str(self.settings.get("bootstrap.servers", ""))

    @property
    def name(self) -> str:
        """'the destination cluster (host:9093)'"""
        return f"{self.what} ({self.bootstrap})"

    def source_of(self, key: str) -> str:
        """How `key` was given, for a message: '${file:kafka.password} in receiver.kafka of
        t.yaml', 'SASL_SSL given with -X', 'not set'; for a secret written out, where only:
        'given with -X'."""
        if key not in self.settings:
            return "not set"
        given = str(self.given[key])
        if is_secret(key) and not REFERENCE.fullmatch(given):
            return self.origin[key]
        return f"{given} {self.origin[key]}"

    def describe(self) -> str:
        """Every setting as key=value, a secret as key=(where it came from)."""
        return ", ".join(f"{k}={v}" if not is_secret(k) else f"{k}=({self.source_of(k)})"
                         for k, v in sorted(self.settings.items()))

    def config(self, **extra) -> dict:
        """Settings for a producer or consumer of the command: these, `extra`, and librdkafka's
        log kept off the terminal (shown with `diode -v`): `reach` says why a cluster cannot be
        used."""
        return {**self.settings, **extra, "logger": librdkafka_log()}

    def admin_config(self) -> dict:
        """Settings for an admin client: those that connect (clients.admin_config), and the
        log as `config` keeps it."""
        from diode.kafka.clients import admin_config
        return {**admin_config(self.settings), "logger": librdkafka_log()}


def settings_of(cluster) -> dict:
    """The librdkafka settings of a cluster given as a Cluster, as settings, or as its bootstrap
    servers (what the audit's functions take)."""
    if isinstance(cluster, Cluster):
        return dict(cluster.settings)
    if isinstance(cluster, str):
        return {"bootstrap.servers": cluster}
    return dict(cluster)


def librdkafka_log(name: str = "diode.librdkafka", verbose: bool | None = None) -> logging.Logger:
    """The logger librdkafka's log goes to (confluent-kafka's `logger` setting) instead of
    stderr, where a broker not answering yet writes a line every second: on the terminal only
    with `diode -v` (`verbose`; by default, the root logger at DEBUG)."""
    out = logging.getLogger(name)
    out.setLevel(logging.DEBUG)
    out.propagate = logging.getLogger().isEnabledFor(logging.DEBUG) if verbose is None \
        else verbose
    if not out.handlers:
        out.addHandler(logging.NullHandler())  # (not Python's last resort, to stderr)
    return out


# -- the settings --------------------------------------------------------------------------------

def setting(text: str) -> tuple[str, str]:
    """One -X argument: KEY=VALUE (argparse's type)."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise argparse.ArgumentTypeError(f"takes KEY=VALUE (a librdkafka setting), not {text!r}")
    return key.strip(), value


def of_topology(t, side: str, overrides=(), bootstrap: str | None = None,
                what: str | None = None, flag: str = "-X") -> "Cluster":
    """Side `side`'s cluster of topology `t` (a diode.runtime.topology.Topology): its kafka
    section's connection settings as the launch reads them, then `overrides` ((key, value)
    pairs, as -X gives them) and `bootstrap` over them. ClusterError naming the setting when
    one cannot be made."""
    from diode.kafka.clients import CONNECTION_KEYS
    section = [(k, v, f"in {side}.kafka of {t.path}", f"{side}.kafka.{k}", t.resolve)
               for k, v in getattr(t, side).kafka.items() if k.startswith(CONNECTION_KEYS)]
    return _made(what or WHAT[side], section, overrides, bootstrap, flag)


def of_options(topology: str | None, side: str, overrides=(), bootstrap: str | None = None,
               what: str | None = None, flag: str = "-X") -> "Cluster":
    """The cluster a command's options give (add_options): `topology` (a file) read for
    `side`, or none; then `overrides` and `bootstrap`. `what` names it in messages (default:
    the side's cluster when a topology says which, else "the cluster")."""
    if topology:
        from diode.runtime import topology as topo
        return of_topology(topo.load(topology), side, overrides, bootstrap, what, flag)
    return _made(what or "the cluster", [], overrides, bootstrap, flag)


def _made(what: str, section: list, overrides, bootstrap: str | None, flag: str) -> "Cluster":
    """A Cluster of a topology's `section` ((key, value, where, its name in messages, what
    places its ${file:} paths)), `overrides` given with `flag` and `bootstrap` over it."""
    from diode.kafka.clients import resolved
    settings, given, origin = {}, {}, {}

    def put(key, value, where, name, path_of):
        try:
            settings[key] = resolved(value, name, path_of)
        except SecretError as exc:
            raise ClusterError(f"{what}: {exc}") from None
        given[key], origin[key] = value, where

    for entry in section:
        put(*entry)
    for key, value in overrides:
        if is_secret(key) and not REFERENCE.fullmatch(value):
            log.warning("%s %s=... on the command line can be read by every user of this host "
                        "(ps, /proc): give it as ${file:PATH} or ${env:NAME}", flag, key)
        put(key, value, f"given with {flag}", f"{flag} {key}", os.path.abspath)
    if bootstrap:
        put("bootstrap.servers", bootstrap, "given with --bootstrap", "--bootstrap",
            os.path.abspath)
    if not settings.get("bootstrap.servers"):
        raise ClusterError(f"{what}: no bootstrap.servers: give --bootstrap HOST:PORT, a "
                           f"--topology FILE, or {flag} bootstrap.servers=HOST:PORT")
    return Cluster(what, settings, given, origin)


# -- the options ---------------------------------------------------------------------------------

def add_options(p, side: str, either_side: bool = False, topology: bool = True,
                prefix: str = "", flag: str = "-X", topology_help: str | None = None) -> None:
    """The options that give a command its cluster (of_args reads them): --topology FILE (not
    when the command takes its topology as an argument: `topology` False), --side when the
    command may talk to `either_side`'s cluster (`side` the default), -X KEY=VALUE and
    --bootstrap. `prefix` and `flag` name a second cluster's (verify's source:
    --source-topology, -S, --source-bootstrap)."""
    what = "the cluster" if either_side else WHAT[side]
    if topology:
        p.add_argument(f"--{prefix}topology", metavar="FILE", help=topology_help or (
            f"take {WHAT[side]}'s client settings from this topology: its {side}.kafka section"
            f"{' (or --side)' if either_side else ''}, the settings that reach the cluster "
            "(bootstrap.servers, security.*, sasl.*, ssl.*), secrets read from its ${file:} "
            "and ${env:} as the launch reads them"))
    if either_side:
        p.add_argument(f"--{prefix}side", choices=SIDES, default=side,
                       help="the side whose kafka section --topology gives: sender (the source "
                       "cluster) or receiver (the destination); default %(default)s")
    over = f"--{prefix}topology's" if topology else "the topology's"
    p.add_argument(flag, dest=f"{prefix.replace('-', '_')}kafka", metavar="KEY=VALUE",
                   action="append", default=[], type=setting,
                   help=f"a librdkafka setting for {what}, added or over {over} (repeatable, "
                   "as kcat's -X); a value may be ${file:PATH} or ${env:NAME}, which keeps a "
                   "secret off the command line")
    p.add_argument(f"--{prefix}bootstrap", metavar="HOST:PORT",
                   help=f"{what}'s bootstrap servers (bootstrap.servers, over {over} and "
                   f"{flag}'s)")


def of_args(args, side: str, prefix: str = "", flag: str = "-X",
            what: str | None = None) -> "Cluster | None":
    """The cluster the options of add_options give (`prefix` and `flag` as given there; `what`
    as of_options takes it); None when none of them was given and `prefix` names a second
    cluster (verify without the source)."""
    dest = prefix.replace("-", "_")
    topology = getattr(args, f"{dest}topology", None)
    overrides = getattr(args, f"{dest}kafka")
    bootstrap = getattr(args, f"{dest}bootstrap")
    if prefix and not (topology or overrides or bootstrap):
        return None
    return of_options(topology, getattr(args, f"{dest}side", side), overrides, bootstrap,
                      what, flag)


# -- the first question --------------------------------------------------------------------------

class _Heard(logging.Handler):
    """What librdkafka said of one client: its errors (error_cb) and log lines, each also
    handed on to diode.librdkafka (on the terminal with `diode -v`)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.errors: list = []  # (code name, text)
        self.lines: list[str] = []
        self.log = logging.Logger("diode.librdkafka")  # (this client's own, not registered)
        self.log.addHandler(self)

    def error(self, err) -> None:
        self.errors.append((err.name(), err.str()))

    def emit(self, record) -> None:
        text = record.args[2] if isinstance(record.args, tuple) and len(record.args) == 3 \
            else record.getMessage()
        self.lines.append(str(text).split("]: ", 1)[-1])
        librdkafka_log().handle(record)


class SettingsRefused(ClusterError):
    """librdkafka refuses a setting (an unknown name, a value it cannot take): its text names
    it."""


def reach(cluster: Cluster, timeout: float = CONNECT_TIMEOUT_SECONDS):
    """The cluster's metadata (confluent_kafka's ClusterMetadata), asked within `timeout`
    seconds before a command does anything else; ClusterError naming the setting to check when
    it cannot be had (`diagnose`), at once when waiting cannot mend it."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from diode.kafka.clients import admin_config
    heard = _Heard()
    log.debug("%s: %s", cluster.what, cluster.describe())
    try:
        admin = AdminClient({**admin_config(cluster.settings), "logger": heard.log,
                             "error_cb": heard.error})
    except KafkaException as exc:
        raise SettingsRefused(f"{cluster.name}: {exc.args[0].str()}") from None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return admin.list_topics(timeout=max(0.05, min(0.5, left)))
        except KafkaException:
            admin.poll(0)  # (serves error_cb and the log lines so far)
        final, why = diagnose(cluster, heard.errors, heard.lines)
        if final:
            raise ClusterError(f"{cluster.name}: {why}")
        if left <= 0.5:
            raise ClusterError(f"{cluster.name} did not answer within {timeout:g} s"
                               f"{': ' + why if why else ''}")


def diagnose(cluster: Cluster, errors: list, lines: list) -> tuple[bool, str]:
    """(final, why) from what librdkafka said of a client that got no metadata (`errors`: its
    (code name, text), `lines`: its log): why names the setting to check; final when waiting
    cannot mend it (a refused password, a certificate not trusted, the other side of a TLS
    listener), not when nothing answers (a broker may be starting)."""
    s = cluster.settings

    def check(key: str, also: str = "") -> str:
        """'check KEY (where it came from)', what each message ends with."""
        return f"check {also}{key} ({cluster.source_of(key)})"

    protocol = str(s.get("security.protocol", "plaintext")).upper()
    said = [text for _, text in errors if text] + lines
    auth = [text for code, text in errors if code == "_AUTHENTICATION"]
    if auth:
        mechanism = s.get("sasl.mechanism", s.get("sasl.mechanisms", "GSSAPI"))
        if "mechanism" in auth[-1] and "invalid credentials" not in auth[-1]:
            return True, f"{_short(auth[-1])}: {check('sasl.mechanism')}"
        who = f"sasl.username={s['sasl.username']}" if "sasl.username" in s else "this client"
        return True, (f"authentication failed for {who} ({mechanism} over {protocol}): "
                      f"{check('sasl.password')}")
    for text in said:
        if "certificate verify failed" in text:
            return True, (f"the broker's TLS certificate is not trusted ({_short(text)}): "
                          f"{check('ssl.ca.location')}")
        if "PLAINTEXT broker listener" in text or "wrong version number" in text:
            return True, ("a TLS handshake with a listener that does not speak TLS: "
                          f"{check('security.protocol')}")
        if "SSL handshake failed" in text:
            return True, (f"the TLS handshake failed ({_short(text)}): "
                          f"{check('security.protocol', also='the ssl.* settings and ')}")
    closed = [text for text in lines if "closed by peer" in text and "APIVERSION_QUERY" in text]
    if len(closed) >= 3 and not protocol.endswith("SSL"):
        return True, ("the broker closes the connection at the first request, as a TLS or "
                      "SASL listener does to a client that speaks neither: "
                      f"{check('security.protocol')}")
    failed = [text for text in said if "Connect to" in text or "resolve" in text
              or "Connection refused" in text or "timed out" in text]
    if failed:
        return False, f"{_short(failed[-1])}: {check('bootstrap.servers')}"
    return False, _short(said[-1]) if said else ""


def _short(text: str) -> str:
    """librdkafka's text without its prefixes and hints ('error:0A000086:SSL routines::')."""
    return re.sub(r"error:[0-9A-F]+:[^:]*::", "", NOISE.sub("", text)).strip()[:300]
