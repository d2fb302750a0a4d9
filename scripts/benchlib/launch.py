"""diode as the bench runs it: a topology written to the work dir and `diode launch FILE
[--side sender|receiver]` as a subprocess; its workers' metrics files read afterwards."""

import os
import signal
import time
from pathlib import Path

import yaml

from diode.runtime import launches

from .resources import REPO, Bench, child_env, log

# Readers commit what was sent this often in the modes timed by committed offsets (sender
# alone, capture): the default (1000 ms) would add up to a second to every run's end.
SENDER_COMMIT_INTERVAL_MS = 100


def topology(b: Bench, name: str, src: str, dst: str, topic: str, prefix: str, udp_port: int,
             run_dir: str, rate_mbps: float, extra: dict | None = None) -> dict:
    """The bench's topology (both sides; `diode launch --side` picks one): AES-256-GCM with
    a password file and salt, the workers and link settings of the command line (the receiver
    admitting the sending host's address alone, as deployed), then `extra` and every --set on
    top."""
    args = b.args

    def stages(**counts):
        return {k: {"instances": v} for k, v in counts.items()}

    cfg = {
        "name": name,
        "compression": args.compression,
        "link": {"host": b.res.link_host, "port": udp_port, "bind.address": b.res.link_host,
                 "source.addresses": [b.res.link_source],
                 "datagram.size.bytes": args.datagram_bytes, "rate.mbps": rate_mbps,
                 "receive.buffer.bytes": args.receive_buffer,
                 "gso.enabled": not args.no_offload, "gro.enabled": not args.no_offload},
        "security": {"cipher": "aes-256-gcm", "password.file": b.secret,
                     "salt": "diode-bench-salt"},
        "sender": {"kafka": {"bootstrap.servers": src}, "topics": [topic],
                   "start.position": "earliest", "dead.letter.topic": "",
                   "stages": stages(kafka_reader=args.readers, packer=args.packers,
                                    udp_sender=1)},
        # a journal per run: each run's topics are new, a journal resumes old ones
        "receiver": {"kafka": {"bootstrap.servers": dst}, "topic.prefix": prefix,
                     "journal.dir": f"{run_dir}/journal",
                     "stages": stages(udp_reader=1, unpacker=args.unpackers,
                                      kafka_writer=args.writers)},
        "supervisor": {"run.dir": run_dir, "drain.timeout.seconds": 10},
    }
    for key, value in (extra or {}).items():
        section, _, rest = key.partition(".")
        cfg.setdefault(section, {})[rest] = value
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, rest = key.partition(".")
        target = cfg.setdefault(section, {}) if rest else cfg
        if section in ("sender", "receiver") and rest.startswith("kafka."):
            target, rest = target.setdefault("kafka", {}), rest[len("kafka."):]  # librdkafka's
        target[rest or section] = yaml.safe_load(value)
    return cfg


def group_id(cfg: dict) -> str:
    """The sender's consumer group (diode.kafka.clients.consumer_config: diode-NAME unless set)."""
    return cfg["sender"]["kafka"].get("group.id") or f"diode-{cfg['name']}"


class DiodeLaunch:
    """One `diode launch` of a topology, one side or both (the receiver on the receiving host
    of the test bed, if there is one), logging to the work dir; stopped by the bench's end,
    an error or Ctrl-C too (Resources.close)."""

    def __init__(self, b: Bench, cfg: dict, tag: str, side: str = "both"):
        self.b = b
        self.tag = tag
        self.side = side
        self.run_dir = cfg["supervisor"]["run.dir"]
        self.path = os.path.join(b.work, f"topology-{tag}.yaml")
        Path(self.path).write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.logfile = os.path.join(b.work, f"diode-{tag}.log")
        self.launch = launches.Launch(
            self.path, side, self.run_dir, self.logfile, env=child_env(), cwd=b.work,
            where=b.res.low_host([]) if side == "receiver" else (),
            python=str(REPO / ".venv/bin/python"))
        self.proc = None
        self.started = None
        self.code = None

    def start(self):
        self.started = time.monotonic()
        self.proc = self.b.res.add_launch(self.launch.start()).proc
        return self.proc

    def stop(self) -> int:
        """SIGTERM: the supervisor drains its workers (supervisor.drain.timeout.seconds)."""
        if self.proc is not None and self.code is None:
            self.code = self.b.res.stop_launch(self.launch, 30 if self.proc.poll() is None
                                               else 5)
        return self.code

    def report_failure(self, ended: str) -> None:
        if ended == "complete" and self.code in (0, -signal.SIGTERM):
            return
        log(f"diode {self.tag}: {ended}, exit {self.code}; last lines of {self.logfile}:")
        for line in Path(self.logfile).read_text(errors="replace").splitlines()[-15:]:
            log("  " + line)

    def metrics(self) -> dict:
        """A few counters from every worker's metrics file, by file name
        ("sender-udp_sender-0"), those that are not 0."""
        names = ("records", "datagrams", "bytes", "rewinds", "cpu_seconds", "rejects")
        return {worker.replace("/", "-"): {k: v for k, v in values.items() if v}
                for worker, values in launches.worker_counters(self.run_dir, names).items()}


def link_figures(metrics: dict) -> dict:
    """Datagrams sent and received and reader rewinds, from the metrics of either side."""
    return {
        "rewinds": sum(m.get("rewinds", 0) for m in metrics.values()),
        "datagrams_sent": metrics.get("sender-udp_sender-0", {}).get("datagrams", 0),
        "datagrams_received": metrics.get("receiver-udp_reader-0", {}).get("datagrams", 0),
    }
