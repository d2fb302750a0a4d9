"""What a launch needs, checked before it (`diode check`), everything at once, as Vector's
healthchecks do.

A topology can be valid and still fail to launch on a host: a password file that is not there, a
variable not set, a key file of the wrong length, a TLS file librdkafka cannot open, a journal
directory that cannot be written, a port another process holds. Each is a problem (`diode check`
exits 2) naming the setting and the file, variable or address, never a secret's value. Whether
each Kafka cluster answers, and holds the topics to replicate, is a warning (a cluster may come
up after the diode): both are asked at once, within a short timeout, with librdkafka's own log
kept off the terminal (it goes to the `diode.librdkafka.<side>` loggers, shown with `diode -v`).

Only the sides asked for are checked: each host has its own side's secrets, directories and
ports. The key material is needed by both (the sender seals with it, the receiver opens).
"""

import errno
import logging
import os
import re
import shutil
import socket
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import psutil

from diode.errors import ClusterError, DiodeError, SecretError
from diode.link import admission
from diode.runtime import key_material as keys
from diode.runtime import launches, statedir
from diode.runtime import topology as topo
from diode.runtime.topology import FILE_KAFKA_KEYS, REFERENCE

CLUSTER_TIMEOUT_SECONDS = 2.5
CLUSTER = {"sender": "source", "receiver": "destination"}
VOLATILE_FILESYSTEMS = ("tmpfs", "ramfs")
IPC_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un.sun_path, less its NUL)


@dataclass
class Report:
    """What `check` found: problems stop a launch, warnings do not, notes describe."""
    problems: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def add(self, other: "Report") -> None:
        self.problems += other.problems
        self.warnings += other.warnings
        self.notes += other.notes


def check(t, sides=topo.SIDES, timeout: float = CLUSTER_TIMEOUT_SECONDS,
          verbose: bool = False) -> Report:
    """Everything a launch of `sides` of `t` needs on this host. The clusters are asked in
    threads while the rest is checked, so the whole takes about `timeout` at most."""
    report = Report()
    report.add(key_material(t))
    unreadable = {}
    for side in sides:
        found, unreadable[side] = kafka_files(t, side)
        report.add(found)
    ports = ports_report(t, sides)
    ask = [side for side in sides if not unreadable[side] and _asked(t, side, ports)]
    with ThreadPoolExecutor(max_workers=max(1, len(ask))) as pool:
        asked = [pool.submit(cluster, t, side, timeout) for side in ask]
        for side in sides:
            report.problems += kafka_problems(t, side, unreadable[side], verbose)
        if "receiver" in sides and t.receiver.journal_enabled:
            report.add(journal_dir(t))
        report.add(directories(t, sides))
        report.add(ports)
        if "receiver" in sides:
            report.add(admission_report(t))
        for future in asked:
            report.add(future.result())
    return report


# -- files and variables -----------------------------------------------------------------------

def key_material(t) -> Report:
    """The link's current key and, during a rotation, the next one: each file readable, each
    variable set, neither empty, a key file of 32 raw bytes or 64 hex characters; read as a
    launch reads them (diode.runtime.key_material)."""
    report = Report()
    if t.security.cipher == "none":
        return report
    for which in (keys.CURRENT, keys.NEXT):
        try:
            material = keys.read(t, which)
        except SecretError as exc:
            report.problems.append(str(exc))
            continue
        if material is not None and material.warning:
            report.warnings.append(material.warning)
    return report


def kafka_files(t, side: str) -> tuple[Report, set]:
    """A side's Kafka settings that name something outside the topology: every ${env:NAME} set,
    every ${file:PATH} readable (relative to the topology file), and every file librdkafka
    opens (ssl.ca.location, ssl.key.location, ...: relative to where the launch runs, as
    librdkafka reads them) there. (The report, the keys whose value could not be made.)"""
    from diode.kafka.clients import reference
    report, failed = Report(), set()
    for key, value in getattr(t, side).kafka.items():
        if not isinstance(value, str):
            continue
        where = f"{side}.kafka.{key}"
        for kind, arg in REFERENCE.findall(value):
            try:
                reference(kind, arg, t.resolve)
            except SecretError as exc:
                report.problems.append(f"{where}: {exc}")
                failed.add(key)
        if key not in FILE_KAFKA_KEYS or key in failed:
            continue
        path = REFERENCE.sub(lambda m: reference(*m.groups(), t.resolve), value)
        if key == "ssl.ca.location" and path == "probe":
            continue  # (librdkafka looks in the system's usual places)
        problem = _readable(path, directory_ok=key == "ssl.ca.location")
        if problem:
            report.problems.append(f"{where}: {problem}")
            failed.add(key)
    return report, failed


def _readable(path: str, directory_ok: bool = False) -> str | None:
    """Why `path` cannot be read by this user, or None."""
    if directory_ok and os.path.isdir(path):
        return None if os.access(path, os.R_OK | os.X_OK) else \
            f"cannot read the directory {path}: permission denied"
    try:
        with open(path, "rb"):
            return None
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"


def kafka_problems(t, side: str, skip=(), verbose: bool = False) -> list[str]:
    """librdkafka's own verdict on a side's pass-through settings (unknown keys, bad values),
    found by building its client without waiting for it to connect, after reading the
    ${file:...} and ${env:...} they name; `skip`: keys already reported (a file that cannot be
    read), left out rather than reported twice. Only `diode check` does this: the supervisor
    must not create Kafka clients before it forks."""
    from confluent_kafka import Consumer, KafkaException, Producer
    from diode.kafka.clients import client_settings, consumer_config, producer_config
    kafka = {k: v for k, v in getattr(t, side).kafka.items() if k not in skip}
    t = replace(t, **{side: replace(getattr(t, side), kafka=kafka)})
    quiet = {"logger": client_log(side, verbose)}
    try:
        if side == "sender":
            Consumer({**consumer_config(t), **quiet}).close()
        else:
            Producer({**producer_config(client_settings(t, "receiver")), **quiet})
    except SecretError as exc:
        return [f"{side}.kafka: {exc}"]
    except KafkaException as exc:
        err = exc.args[0]
        return [f"{side}.kafka: {err.str() if hasattr(err, 'str') else err}"]
    return []


def client_log(side: str, verbose: bool) -> logging.Logger:
    """The logger a side's check clients hand librdkafka's log to, instead of librdkafka writing
    it on stderr: `Connect to ... failed` is what a cluster not up yet says, and the check says
    it once, as a warning. On the terminal only with `diode -v`."""
    from diode.kafka.cluster import librdkafka_log
    return librdkafka_log(f"diode.librdkafka.{side}", verbose)


# -- directories -------------------------------------------------------------------------------

def writable_dir(path: str) -> tuple[str | None, str]:
    """(why a process of this user cannot keep files in directory `path`, or None; the
    existing directory it is, or will be made in). One that exists is tried with a file made
    and removed; one that does not, by its nearest existing parent."""
    if os.path.isdir(path):
        try:
            fd, name = tempfile.mkstemp(prefix=".diode-check-", dir=path)
            os.close(fd)
            os.unlink(name)
            return None, path
        except OSError as exc:
            return f"cannot write in {path}: {exc.strerror}", path
    if os.path.lexists(path):
        return f"{path} is not a directory", path
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot create {path}: {parent} is not a directory", parent
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create {path}: {parent} is not writable by this user", parent
    return None, parent


def journal_dir(t) -> Report:
    """receiver.journal.dir: writable or creatable, this topology's own (not another flow's
    state), and how much room its filesystem has."""
    report = Report()
    r = t.receiver
    path = t.resolve(r.journal_dir)
    problem, existing = writable_dir(path)
    if problem:
        report.problems.append(f"receiver.journal.dir: {problem}")
        return report
    found = statedir.read_identity_quietly(path) if existing == path else None
    if found is not None and found != statedir.identity_of(t):
        report.problems.append(
            f"receiver.journal.dir: {path} holds the state of topology {found['topology']!r} "
            f"({found['link']}): a launch refuses it (point it elsewhere, or launch with "
            "--reset-state)")
    free = shutil.disk_usage(existing).free
    held = _journal_bytes(path) if existing == path else 0
    made = "exists" if existing == path else "made at launch"
    report.notes.append(f"receiver.journal.dir {path}: writable ({made}), {_size(free)} free on "
                        "its filesystem")
    if free + held < r.journal_max_bytes:
        report.warnings.append(
            f"receiver.journal.dir: {_size(free)} free on the filesystem of {path}, less than "
            f"receiver.journal.max.bytes ({_size(r.journal_max_bytes)}): a long destination "
            "outage fills the disk before the journal's own bound")
    fstype = _filesystem(existing)
    if fstype in VOLATILE_FILESYSTEMS:
        report.warnings.append(f"receiver.journal.dir: {path} is on a {fstype}, which a reboot "
                               "empties: the journal and checkpoints must survive restarts")
    return report


def _journal_bytes(path: str) -> int:
    from diode.runtime.journal import SEGMENT_NAME
    try:
        return sum(e.stat().st_size for e in os.scandir(path) if SEGMENT_NAME.match(e.name))
    except OSError:
        return 0


def _filesystem(path: str) -> str:
    """The type of the filesystem holding `path` (the longest mount point above it)."""
    real = os.path.realpath(path)
    best, fstype = "", ""
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") + "/"
        if (real + "/").startswith(mount) and len(mount) > len(best):
            best, fstype = mount, part.fstype
    return fstype


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def directories(t, sides) -> Report:
    """The other directories a launch writes: supervisor.run.dir (and the length of the socket
    paths in it), an embedded broker's data.dir."""
    report = Report()
    wanted = {"supervisor.run.dir": t.supervisor.run_dir}  # (as the launch takes it: as is)
    for i, b in enumerate(t.brokers):
        if b.side in sides and b.kind == "kafka":
            wanted[f"brokers[{i}].data.dir"] = t.resolve(b.data_dir)
    for setting, path in wanted.items():
        if path:
            problem, _ = writable_dir(path)
            if problem:
                report.problems.append(f"{setting}: {problem}")
    if t.supervisor.run_dir:
        report.problems += _ipc_paths(t, sides, t.supervisor.run_dir)
    return report


def _ipc_paths(t, sides, run_dir: str) -> list[str]:
    """The queues' ipc endpoints in the run directory are Unix socket paths, of at most
    IPC_PATH_MAX bytes: a longer one fails every worker's start."""
    from diode.runtime import wiring
    longest = max((e for spec in wiring.plan(t, sides) for e in wiring.describe(
        t, spec, run_dir)[0] if e.startswith("ipc://")), key=len, default="")
    path = longest.removeprefix("ipc://")
    if len(path.encode()) <= IPC_PATH_MAX:
        return []
    return [f"supervisor.run.dir: {run_dir} is too long for the queues' sockets in it: "
            f"{path} is {len(path.encode())} bytes, a Unix socket path at most {IPC_PATH_MAX}"]


# -- ports -------------------------------------------------------------------------------------

@dataclass
class Ports(Report):
    embedded_down: set = field(default_factory=set)  # listen addresses the launch starts


def ports_report(t, sides) -> Ports:
    """Every address a launch of `sides` listens on, bound for a moment and closed: the
    receiver's UDP socket (with the receive buffer the kernel grants it), each side's metrics
    endpoint, and nothing listening where an embedded broker will. A port held by a running
    launch of this topology is said to be its own (a warning: stop it first), not a failure."""
    report = Ports()
    running = launches.running(t.path)
    if "receiver" in sides:
        link = t.link
        exc, granted = _bind(socket.SOCK_DGRAM, link.bind_address, link.port,
                             link.receive_buffer_bytes)
        _bind_result(report, exc, "link.bind.address, link.port", "udp",
                     f"{link.bind_address}:{link.port}", running, "receiver")
        if granted < link.receive_buffer_bytes:
            report.warnings.append(
                f"link.receive.buffer.bytes: the kernel grants a receive buffer of {granted} "
                f"bytes, not the {link.receive_buffer_bytes} asked: bursts will be dropped. "
                f"Raise its limit: sysctl -w net.core.rmem_max={link.receive_buffer_bytes}")
    for side in sides:
        listen = getattr(t, side).metrics_listen
        if listen:
            host, _, port = listen.rpartition(":")
            exc, _ = _bind(socket.SOCK_STREAM, host.strip("[]"), int(port))
            _bind_result(report, exc, f"{side}.metrics.listen", "tcp", listen, running, side)
    from diode.kafka.brokers import accepts
    for i, b in enumerate(t.brokers):
        if b.side not in sides:
            continue
        host, _, port = b.listen.rpartition(":")
        if not accepts(host, int(port)):
            report.embedded_down.add(b.listen)
        elif not [e for e in running if b.side in e["sides"]]:
            report.problems.append(f"brokers[{i}].listen: something already listens on "
                                   f"{b.listen}: the launch's embedded broker "
                                   f"{b.name or b.listen} could not start")
    return report


def _bind(kind: int, host: str, port: int, rcvbuf: int = 0) -> tuple[OSError | None, int]:
    """(why `host:port` cannot be bound, or None; the receive buffer the kernel grants a socket
    that asks for `rcvbuf`). Bound and closed at once."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=kind, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r}: {exc.strerror}"), rcvbuf
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, kind)
    granted = rcvbuf
    try:
        if kind == socket.SOCK_STREAM:  # (as the servers that listen there set it)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            granted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2  # (doubled)
        sock.bind(address)
        return None, granted
    except OSError as exc:
        return exc, granted
    finally:
        sock.close()


def _bind_result(report: Report, exc: OSError | None, setting: str, proto: str, address: str,
                 running: list, side: str) -> None:
    if exc is None:
        report.notes.append(f"{proto} {address} ({setting}): free")
        return
    if exc.errno == errno.EADDRINUSE:
        mine = [e for e in running if side in e["sides"]]
        if mine:
            report.warnings.append(
                f"{setting}: {proto} {address} is held by this topology's running {side} "
                f"(diode launch, pid {mine[0]['pid']}): a second launch would fail; stop it "
                "first")
            return
        why = f"{proto} {address} is in use by another process{_holder(proto, address)}"
    elif exc.errno == errno.EADDRNOTAVAIL:
        why = f"cannot assign {proto} {address}: {exc.strerror} (not an address of this host)"
    elif exc.errno == errno.EACCES:
        why = (f"cannot bind {proto} {address}: permission denied (a port below 1024 needs "
               "CAP_NET_BIND_SERVICE)")
    else:
        why = f"cannot bind {proto} {address}: {exc.strerror}"
    report.problems.append(f"{setting}: {why}")


def _holder(proto: str, address: str) -> str:
    """`: the receiver of topology NAME (FILE, pid N)` when another diode launch holds it."""
    port = int(address.rpartition(":")[2])
    for entry in launches.running():
        try:
            other = topo.load(entry["topology"])
        except DiodeError:
            continue
        held = {("udp", other.link.port)} if "receiver" in entry["sides"] else set()
        held |= {("tcp", int(getattr(other, s).metrics_listen.rpartition(":")[2]))
                 for s in entry["sides"] if getattr(other, s).metrics_listen}
        if (proto, port) in held:
            return (f": diode launch pid {entry['pid']} of topology {other.name!r} "
                    f"({entry['topology']})")
    return " (is another receiver running?)" if proto == "udp" else ""


def admission_report(t) -> Report:
    """Who can reach the receiver's port: the address it binds (link.bind.address, auto: the
    one link.host names where this host holds it) and the senders it admits
    (link.source.addresses, filtered in the kernel where it takes the filter)."""
    report = Report()
    link = t.link
    where = f"udp {link.bind_address}:{link.port}"
    if link.bind_address_note and admission.every_address(link.bind_address):
        report.warnings.append(f"link.bind.address: {link.bind_address_note}")
    elif link.bind_address_note:
        report.notes.append(f"{where} (link.bind.address {link.bind_address_note})")
    elif admission.every_address(link.bind_address):
        report.notes.append(f"{where} (link.bind.address): every address of this host")
    if not link.source_addresses:
        report.warnings.append(admission.unfiltered(link.bind_address, link.port))
        return report
    admitted = admission.describe(admission.networks(link.source_addresses))
    refused, uncounted = admission.kernel_refusals()
    if refused:
        report.warnings.append(
            f"link.source.addresses: this kernel refuses the source filter ({refused}): the "
            f"udp_reader drops datagrams from addresses other than {admitted} itself, after "
            "reading them (a flood still costs it its reads)")
    elif uncounted:
        report.warnings.append(
            f"link.source.addresses: the kernel drops datagrams from addresses other than "
            f"{admitted} before {where}, but cannot count them apart ({uncounted}): "
            "diode_socket_drops_total counts them with those a full buffer drops")
    else:
        report.notes.append(f"link.source.addresses: datagrams from {admitted} alone reach "
                            f"{where}, the others dropped by the kernel (a socket filter; "
                            "diode_source_filtered_datagrams_total)")
    return report


# -- the clusters ------------------------------------------------------------------------------

def _bootstrap(t, side: str) -> list[str]:
    servers = getattr(t, side).kafka.get("bootstrap.servers", "")
    return [s.strip() for s in str(servers).split(",") if s.strip()]


def _asked(t, side: str, ports: Ports) -> bool:
    """A cluster made of embedded brokers the launch starts and that are not running yet is
    not asked (it cannot answer before the launch): a note says so."""
    servers = _bootstrap(t, side)
    if servers and all(s in ports.embedded_down for s in servers):
        ports.notes.append(f"the {CLUSTER[side]} cluster ({', '.join(servers)}): an embedded "
                           "broker the launch starts, not asked")
        return False
    return bool(servers)


def cluster(t, side: str, timeout: float) -> Report:
    """Ask a side's cluster for its metadata within `timeout`, as every command asks its own
    (diode.kafka.cluster.reach: the same settings, the same verdict naming the setting to
    check): reachable or not, and (the source) whether the topics to replicate are there.
    Warnings only."""
    from diode.kafka.cluster import SettingsRefused, of_topology, reach
    report = Report()
    try:
        md = reach(of_topology(t, side), timeout)
    except SettingsRefused:
        return report  # (kafka_problems says which)
    except ClusterError as exc:
        report.warnings.append(f"{side}.kafka: {exc}")
        return report
    name = f"the {CLUSTER[side]} cluster ({', '.join(_bootstrap(t, side))})"
    topics = {n: m for n, m in md.topics.items() if m.error is None}
    report.notes.append(f"{name}: answered, {len(md.brokers)} broker(s), {len(topics)} topic(s)")
    denied = sorted(n for n, m in md.topics.items() if m.error is not None)
    if denied:
        report.warnings.append(f"{side}.kafka: {name} refused to describe "
                               f"{', '.join(denied[:5])}: {md.topics[denied[0]].error.str()}")
    if side == "sender":
        report.add(_source_topics(t, set(topics)))
    else:
        report.notes[-1] += _destination_topics(t, set(topics))
    return report


def _source_topics(t, present: set) -> Report:
    report = Report()
    s = t.sender
    wanted = list(s.topics) + ([s.schemas_topic] if s.schemas else [])
    missing = [n for n in wanted if n not in present]
    if missing:
        report.warnings.append(f"sender.topics: {', '.join(missing)} not on the source cluster "
                               "(yet): replicated once they are made (looked for every "
                               "sender.refresh.topics.interval.seconds)")
    for pattern in s.topics_regex:
        if not any(re.fullmatch(pattern, n) and not n.startswith("__") for n in present):
            report.warnings.append(f"sender.topics.regex: {pattern!r} matches no topic of the "
                                   "source cluster (yet)")
    return report


def _destination_topics(t, present: set) -> str:
    r = t.receiver
    names = [r.topic_rename.get(n) or r.topic_prefix + n for n in t.sender.topics]
    made = [n for n in names if n not in present]
    return f"; {', '.join(made)} made by the receiver at its first record" if made else ""
