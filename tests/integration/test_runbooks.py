"""docs/runbooks.md as an operator follows it: every command it shows, run as printed, in order,
on both "hosts" at once (two directories of this machine) against a source broker (Tansu) and a
destination broker (Apache Kafka: the refusals of a real cluster) and launches of this test.

The page marks each code block with a comment naming the host it is for and what it is
(`<!-- receiving host -->`, `<!-- sending host, topology -->`, `<!-- receiving host, log -->`,
`<!-- sending host; not run: REASON -->`). Commands (`$ ...`) run through bash with only host
names, ports and paths changed (HOST_NAMES, Host.paths) and a leading `sudo` dropped; each must
exit 0 and print every line shown after it (`…`: anything; a run of spaces: any). Topology
blocks are applied to that host's topology file; log lines must appear in that side's launch
log. Blocks not run say why; for those the test does to its own launches what a `systemctl`
line does, and checks that every `diode` command parses. What an operator would have lived
through before a section (an outage, a refused record, a destination frozen) the test makes
happen (SCENES), and after some it checks the outcome the section promises."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from diode import cli
from diode.kafka import messages as events
from diode.kafka.brokers import free_port
from tests.conftest import ROOT, Launched, consume, create_topic, produce, wait_for

RUNBOOKS = ROOT / "docs" / "runbooks.md"
MARKER = re.compile(r"<!-- (receiving|sending) host(?:, (topology|log))?"
                    r"(?:; not run: (?P<why>.+?))? -->")


class Block(NamedTuple):
    section: str
    host: str           # "receiving" or "sending"
    kind: str           # "commands", "topology" or "log"
    not_run: str | None  # why the test does not run it as printed
    lines: list


def blocks(path: Path = RUNBOOKS) -> list:
    """Every fenced block of the page, with its marker; a block without one is an error (the
    test must know where and what it is)."""
    out, section, marker, lines = [], "", None, None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if lines is not None:
            if line.startswith("```"):
                out.append(Block(section, *marker, lines))
                lines, marker = None, None
            else:
                lines.append(line)
        elif line.startswith("## "):
            section = line[3:].strip()
        elif m := MARKER.fullmatch(line.strip()):
            marker = (m.group(1), m.group(2) or "commands", m.group("why"))
        elif line.startswith("```"):
            assert marker is not None, f"{path.name}:{number}: a block without its marker"
            lines = []
        elif line.strip() and marker is not None:
            raise AssertionError(f"{path.name}:{number}: text between a marker and its block")
    return out


def commands(block: Block) -> list:
    """[(command, the lines it prints)] of a block of commands."""
    out = []
    for line in block.lines:
        if line.startswith("$ "):
            out.append((line[2:].strip(), []))
        elif line.strip():
            assert out, f"output before any command in {block}"
            out[-1][1].append(line)
    return out


def pattern(line: str) -> re.Pattern:
    """A line as the docs print it: `…` stands for anything, a run of spaces for any."""
    parts = re.split(r"(…|\s+)", line.strip())
    return re.compile("".join(".*?" if p == "…" else r"\s+" if p.isspace() else re.escape(p)
                              for p in parts if p))


def unmatched(shown: list, printed: str, search: bool = False) -> list:
    """The lines shown that no line printed matches (whole, or anywhere with `search`)."""
    got = [g.strip() for g in printed.splitlines()]
    return [s for s in shown
            if not any((pattern(s).search if search else pattern(s).fullmatch)(g) for g in got)]


class Host:
    """One side's host: its directories, its topology file and its launch."""

    def __init__(self, name: str, side: str, root: Path, world: "World"):
        self.name, self.side, self.world = name, side, world
        self.dir = root / name
        for sub in ("etc", "state", "run"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.topology = self.dir / "etc" / "plant1.yaml"
        self.launch: Launched | None = None

    def paths(self, text: str) -> str:
        """The page's names and paths as this test has them on this host."""
        for page, here in (("/etc/diode/", f"{self.dir}/etc/"),
                           ("/var/lib/diode/", f"{self.dir}/state/"),
                           ("/run/diode/", f"{self.dir}/run/"),
                           ("/mnt/transfer/", f"{self.world.transfer}/"),
                           *self.world.names.items()):
            text = text.replace(page, here)
        return text

    def write(self, data: dict) -> None:
        self.topology.write_text(yaml.safe_dump(data, sort_keys=False))

    def read(self) -> dict:
        return yaml.safe_load(self.topology.read_text())

    def start(self) -> None:
        self.launch = Launched(self.topology, self.dir / "run" / f"{self.side}-plant1",
                               self.side)
        self.launch.wait_ready(3)

    def stop(self) -> None:
        assert self.launch.stop() == 0, self.launch.output()

    def log(self) -> str:
        return self.launch.output() if self.launch else ""


class World:
    def __init__(self, tmp: Path, source: str, destination: str):
        self.transfer = tmp / "transfer"
        self.transfer.mkdir()
        self.link_port, self.metrics_port = free_port(), free_port()
        self.names = {"kafka-high:9093": source, "kafka-low:9092": destination,
                      "10.20.0.2:3456": f"127.0.0.1:{self.link_port}",
                      "from 10.20.0.1 alone": "from 127.0.0.1 alone",
                      "127.0.0.1:9465": f"127.0.0.1:{self.metrics_port}"}
        self.source, self.destination = source, destination
        self.hosts = {"receiving": Host("receiving", "receiver", tmp, self),
                      "sending": Host("sending", "sender", tmp, self)}

    def receiver_metric(self, name: str, stage: str, **labels) -> float:
        return self.hosts["receiving"].launch.metric(name, stage, **labels)


def topology(host: Host) -> dict:
    """deploy.md's topology with the runbooks' additions (a key file, the receiver's metrics);
    and what only this test needs: a small journal, for "A full journal" to fill quickly, and
    the heartbeat and digest topics, whose records are checked against their definitions."""
    return {
        "name": "plant1", "compression": "zstd",
        "link": {"host": "127.0.0.1", "port": host.world.link_port,
                 "source.addresses": ["127.0.0.1"], "rate.mbps": 200},
        "security": {"key.file": host.paths("/etc/diode/plant1.key0"), "key.id": 0},
        "sender": {"kafka": {"bootstrap.servers": host.world.source},
                   "topics": ["orders", "telemetry"]},
        "receiver": {"kafka": {"bootstrap.servers": host.world.destination},
                     "topic.prefix": "high.", "missing.records.topic": "diode-missing",
                     "journal.dir": host.paths("/var/lib/diode/receiver-plant1"),
                     "metrics.listen": f"127.0.0.1:{host.world.metrics_port}",
                     "journal.max.bytes": 1 << 20, "journal.segment.bytes": 1 << 16,
                     "heartbeat.topic": "diode-heartbeats", "digest.topic": "diode-digests"},
    }


# -- what the test does in the place of a command it does not run -----------------------------

def systemctl(world: World, host: Host, argv: list) -> None:
    """`systemctl VERB diode@SIDE-plant1`, done to the test's own launch of that side."""
    verb, unit = argv[-2], argv[-1]
    side = unit.removeprefix("diode@").removesuffix("-plant1")
    target = next(h for h in world.hosts.values() if h.side == side)
    assert target is host, f"{unit} on the {host.name} host"
    if verb in ("stop", "restart"):
        target.stop()
    if verb in ("start", "restart") or argv[-3:-1] == ["enable", "--now"]:
        target.start()
    if verb == "reload":
        before = target.log().count("SIGHUP:")
        os.kill(target.launch.pid, signal.SIGHUP)
        wait_for(lambda: target.log().count("SIGHUP:") > before, 15, "the reload")


def parses(argv: list) -> None:
    """A `diode` command exists with these options."""
    try:
        cli.build_parser().parse_args(argv)
    except SystemExit as exc:  # (--version and --help exit 0)
        assert exc.code == 0, f"diode {shlex.join(argv)} does not parse"


# Read-only commands: run again until they print what the page shows (what they report may
# take a moment to come: a heartbeat, a ticket, a metric of the last second).
AGAIN = re.compile(r"^(diode (status|consume)|diode tickets (?!.*--manifest)|curl )")


def run(world: World, host: Host, command: str, shown: list) -> None:
    line = host.paths(command).removeprefix("sudo ")
    argv = shlex.split(line)
    if argv[0] == "diode":
        parses(argv[1:])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    deadline = time.monotonic() + (40 if AGAIN.match(line) else 0)
    expected = [host.paths(s) for s in shown]
    while True:
        r = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True,
                           text=True, env=env, cwd=world.transfer.parent, timeout=120)
        printed = r.stdout + r.stderr
        missing = unmatched(expected, printed)
        if (r.returncode == 0 and not missing) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.returncode == 0, f"$ {line}\nexit {r.returncode}\n{printed}"
    assert not missing, f"$ {line}\nprinted:\n{printed}\nnot the lines:\n" + "\n".join(missing)


def apply(host: Host, block: Block) -> None:
    """A topology block: its sections replace (security) or merge into (receiver) the file's."""
    change = yaml.safe_load(host.paths("\n".join(block.lines)))
    data = host.read()
    for key, value in change.items():
        data[key] = value if key == "security" else {**data.get(key, {}), **value}
    host.write(data)


def seen_in_log(host: Host, block: Block) -> None:
    shown = [host.paths(s) for s in block.lines if s.strip()]
    wait_for(lambda: not unmatched(shown, host.log(), search=True), 30,
             f"the {host.side}'s log lines:\n" + "\n".join(unmatched(shown, host.log(),
                                                                      search=True)))


# -- what an operator lived through before a section, made to happen ---------------------------

def receiver_was_down(world: World) -> None:
    """"A missing range": the receiver stopped while the sender sent five records."""
    receiving = world.hosts["receiving"]
    receiving.stop()
    sent = world.hosts["sending"].launch.metric("records", "udp_sender")
    produce(world.source, "orders", [{"key": b"plant1", "value": b"sent while down %d" % i,
                                      "partition": 0} for i in range(5)])
    sending = world.hosts["sending"].launch
    wait_for(lambda: sending.metric("records", "udp_sender") >= sent + 5, 30, "the five sent")
    receiving.start()


def destination_froze(world: World) -> None:
    """"A full journal": the destination stops answering while 2 MB of records come."""
    world.frozen = True
    world.destination_broker.pause()
    produce(world.source, "orders", [{"key": b"plant1", "value": os.urandom(10_000),
                                      "partition": 0} for _ in range(200)])
    wait_for(lambda: world.receiver_metric("journal_full", "udp_reader") == 1, 30,
             "the journal to fill")


def destination_back(world: World) -> None:
    world.destination_broker.resume()
    world.frozen = False


def record_refused(world: World) -> None:
    """"A refused record": a record larger than its destination topic takes."""
    produce(world.source, "telemetry", [{"value": b"t" * 2000}])
    wait_for(lambda: world.receiver_metric("dead_letters", "kafka_writer") >= 1, 30,
             "the refused record")


SCENES = {"A missing range": receiver_was_down, "A full journal": destination_froze,
          "A refused record": record_refused}
# before the block whose first line is this: what the prose before it says to do
BEFORE_BLOCK = {"the journal has room again after … s": destination_back}


@pytest.fixture
def short_tmp():
    """A directory with a short path: the launches' ipc sockets live in it (107 bytes at most)."""
    path = Path(tempfile.mkdtemp(prefix="diode-rb-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_every_command_of_the_runbooks_as_printed(start_brokers, short_tmp):
    tmp_path = short_tmp
    [source] = start_brokers("tansu", "source")
    [destination] = start_brokers("kafka", "destination")
    world = World(tmp_path, source.bootstrap, destination.bootstrap)
    world.destination_broker, world.frozen = destination, False
    # What deploy.md and the page assume is there: the topics, the link's key on both hosts,
    # and a destination topic that takes records of 1 KB at most (for "A refused record")
    create_topic(source.bootstrap, "orders", 2)
    create_topic(source.bootstrap, "telemetry", 1)
    create_topic(destination.bootstrap, "high.telemetry", 1, {"max.message.bytes": "1024"})
    key = os.urandom(32).hex()
    for host in world.hosts.values():
        (host.dir / "etc" / "plant1.key0").write_text(key + "\n")
        (host.dir / "etc" / "plant1.key0").chmod(0o600)
        host.write(topology(host))
    sections = []
    try:
        for block in blocks():
            host = world.hosts[block.host]
            if not sections or sections[-1] != block.section:
                sections.append(block.section)
                if block.section in SCENES:
                    SCENES[block.section](world)
            if block.lines and block.lines[0] in BEFORE_BLOCK:
                BEFORE_BLOCK[block.lines[0]](world)
            if block.kind == "topology":
                apply(host, block)
            elif block.kind == "log":
                seen_in_log(host, block)
            elif block.not_run:
                for command, _ in commands(block):
                    argv = shlex.split(host.paths(command).removeprefix("sudo "))
                    if argv[0] == "systemctl":
                        systemctl(world, host, argv)
                    elif Path(argv[0]).name == "diode":
                        parses(argv[1:])
            else:
                for command, shown in commands(block):
                    run(world, host, command, shown)
        assert sections == ["First start", "Key rotation", "A missing range", "A full journal",
                            "A refused record", "Upgrading"], sections
        outcomes(world)
    finally:
        if world.frozen:
            destination.resume()
        for host in world.hosts.values():
            if host.launch is not None:
                host.launch.kill()


def outcomes(world: World) -> None:
    """What the sections promise, seen in the destination and the events."""
    # Key rotation rejected nothing
    for reason in ("unknown_key", "auth_failed"):
        assert world.receiver_metric("rejects", "unpacker", reason=reason) == 0
    # Every event of the missing-records topic is one diode.kafka.messages defines
    reported = [json.loads(m.value()) for m in consume(world.destination, "diode-missing", 3,
                                                       timeout=20, idle=0.5)]
    kinds = [(e["type"], e["reason"]) for e in reported]
    assert ("missing", "receiver-down") in kinds and ("closed", "filled") in kinds, kinds
    for e in reported:
        assert list(e) == list(events.MISSING_RECORDS_EVENT[e["type"]].names), e
    for topic, defined in (("diode-heartbeats", events.HEARTBEAT), ("diode-digests",
                                                                    events.DIGEST)):
        for m in consume(world.destination, topic, 1, timeout=20):
            assert list(json.loads(m.value())) == list(defined.names), (topic, m.value())
    # Every record of orders[0] arrived (the first, the five resent, the 200 the frozen
    # destination took late), or is reported missing and open (the kernel may drop some while
    # the journal is full)
    still_missing = set()
    for e in reported:
        if e["sourceTopic"] == "orders" and e["type"] in ("missing", "filled"):
            span = set(range(e["firstOffset"], e["lastOffset"] + 1))
            still_missing = still_missing | span if e["type"] == "missing" else \
                still_missing - span
    written = {int(dict(m.headers())["sourceOffset"])
               for m in consume(world.destination, "high.orders", 206, timeout=60)}
    assert set(range(206)) - still_missing <= written
    assert set(range(6)) <= written  # the first record and the five resent
    # The refused record is kept in the dead-letter topic, saying why, and its fix is pinned
    [dead] = consume(world.destination, "diode-dead-letter", 1, timeout=10)
    assert dict(dead.headers())["diode.error"].startswith(b"Broker: Message size too large")
    assert world.hosts["receiving"].read()["receiver"]["topic.configs"] == {
        "high.telemetry": {"max.message.bytes": "1048588"}}
