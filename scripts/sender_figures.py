"""The sender alone over many partitions (issue 36): how long from `diode launch --side sender`
to the first record sent and to every partition's record sent, and what its workers cost
idle afterwards (% of a core per worker over --window seconds), with py-spy if asked. Several
checkouts' code alternate over the same source (--code DIR ...: `-m diode` with PYTHONPATH=DIR),
so that a before/after is taken in the same window of a shared machine. An embedded broker of
its own (Apache Kafka, or Tansu with --broker tansu) holding TOPICS × PARTITIONS, one record
in every partition before the sender starts; the link goes to a UDP socket that drops what it
gets. Not a test.

    .venv/bin/python scripts/sender_figures.py --topics 200 --partitions 5 \\
        --code /work/main . --runs 2 --window 60 [--set sender.heartbeat.claims.max=100]
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diode.kafka.brokers import free_port, make_broker, start_all  # noqa: E402
from diode.runtime import launches  # noqa: E402

CREATE_BATCH = 500


def make_source(bootstrap: str, topics: list, partitions: int) -> float:
    """The topics in CreateTopics requests of CREATE_BATCH, then one record in every partition
    (a producer's flush waits until every partition's leader has taken it)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    started = time.monotonic()
    for i in range(0, len(topics), CREATE_BATCH):
        futures = admin.create_topics([NewTopic(t, partitions) for t in topics[i:i + CREATE_BATCH]],
                                      operation_timeout=120)
        for f in futures.values():
            f.result(180)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "acks": "all",
                  "enable.idempotence": True, "message.timeout.ms": 900_000})
    failed = []
    for t in topics:
        for n in range(partitions):
            while True:
                try:
                    p.produce(t, value=b"x" * 100, partition=n,
                              on_delivery=lambda err, msg: err and failed.append(err))
                    break
                except BufferError:
                    p.poll(0.05)
    left = p.flush(900)
    if left or failed:
        raise RuntimeError(f"{left} records unconfirmed, {len(failed)} failed")
    return time.monotonic() - started


def sink() -> tuple:
    """A UDP socket on a free port that reads and drops (so the kernel answers nothing)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))

    def drain():
        while True:
            try:
                s.recv(1 << 17)
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    return s, s.getsockname()[1]


def label(p: psutil.Process) -> str:
    title = " ".join(p.cmdline())
    if title.startswith("diode: supervisor"):
        return "supervisor"
    return title[len("diode: "):].split()[0] if title.startswith("diode: ") else "launch"


def cpu_of(root: psutil.Process) -> dict:
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[(p.pid, label(p))] = t.user + t.system
        except psutil.Error:
            pass
    return out


def records_sent(run_dir: Path) -> float:
    counters = launches.worker_counters(run_dir, ["records"], "kafka_reader")
    return sum(c["records"] for c in counters.values())


def one_run(args, work: Path, code: str, tag: str, bootstrap: str, port: int,
            expected: int) -> dict:
    run_dir = work / f"run-{tag}"
    name = f"figures-{tag}"
    cfg = {
        "name": name, "compression": "zstd",
        "link": {"host": "127.0.0.1", "port": port, "source.addresses": ["127.0.0.1"],
                 "datagram.size.bytes": 65000, "rate.mbps": 400},
        "security": {"cipher": "aes-256-gcm", "password.file": str(work / "password"),
                     "salt": "figures-salt"},
        "sender": {"kafka": {"bootstrap.servers": bootstrap}, "topics.regex": [r"t\d+"],
                   "start.position": "earliest", "dead.letter.topic": "",
                   "stages": {"kafka_reader": {"instances": 1}, "packer": {"instances": 1},
                              "udp_sender": {"instances": 1}}},
        "receiver": {"kafka": {"bootstrap.servers": "127.0.0.1:1"}, "topic.prefix": "d_",
                     "journal.dir": str(run_dir / "journal"),
                     "stages": {"udp_reader": {"instances": 1}, "unpacker": {"instances": 1},
                                "kafka_writer": {"instances": 1}}},
        "supervisor": {"run.dir": str(run_dir), "drain.timeout.seconds": 10},
    }
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, rest = key.partition(".")
        cfg.setdefault(section, {})[rest] = yaml.safe_load(value)
    path = work / f"topology-{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(Path(code).resolve())}
    launch = launches.Launch(path, "sender", run_dir, work / f"diode-{tag}.log", env=env,
                             cwd=str(work), python=str(REPO / ".venv/bin/python"))
    out = {"code": code, "tag": tag}
    started = time.monotonic()
    launch.start()
    try:
        root = psutil.Process(launch.proc.pid)
        first = None
        while time.monotonic() - started < args.timeout:
            sent = records_sent(run_dir)
            if sent and first is None:
                first = out["first_record_s"] = time.monotonic() - started
            if sent >= expected:
                out["all_sent_s"] = time.monotonic() - started
                break
            if launch.proc.poll() is not None:
                raise RuntimeError(f"the launch ended (log: {work}/diode-{tag}.log)")
            time.sleep(0.2)
        out["sent"] = records_sent(run_dir)
        time.sleep(args.settle)
        before = cpu_of(root)
        prof = []
        if args.profile:
            for (pid, name) in before:
                if name.startswith("sender/"):
                    svg = work / f"profile-{tag}-{name.replace('/', '-')}.txt"
                    prof.append(subprocess.Popen(
                        [str(REPO / ".venv/bin/py-spy"), "record", "--pid", str(pid),
                         "--duration", str(int(args.window)), "--rate", "50", "--format",
                         "raw", "--output", str(svg), "--nonblocking"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(args.window)
        after = cpu_of(root)
        per = {}
        for key, sec in after.items():
            per[key[1]] = per.get(key[1], 0.0) + (sec - before.get(key, sec)) / args.window
        out["idle"] = dict(sorted(per.items()))
        out["idle_total"] = sum(per.values())
        out["rss_mib"] = {label(p): p.memory_info().rss / 2**20
                          for p in root.children(recursive=True)}
        for p in prof:
            p.wait()
    finally:
        launch.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=200)
    p.add_argument("--partitions", type=int, default=5)
    p.add_argument("--broker", default="kafka", choices=("kafka", "tansu"))
    p.add_argument("--code", nargs="+", default=["."], help="checkouts whose code runs, in turn")
    p.add_argument("--runs", type=int, default=1, help="runs of each checkout, alternating")
    p.add_argument("--window", type=float, default=60.0, help="idle seconds measured")
    p.add_argument("--settle", type=float, default=15.0, help="seconds after the last record")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--profile", action="store_true", help="py-spy over the idle window")
    p.add_argument("--set", action="append", default=[], help="SECTION.KEY=VALUE")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sender-figures-"))
    (work / "password").write_text("figures-password-0123456789\n")
    broker = make_broker(args.broker, "source", f"127.0.0.1:{free_port()}",
                         str(work / "source.log"))
    start_all([broker], timeout=300)
    s, port = sink()
    topics = [f"t{i:05d}" for i in range(args.topics)]
    n = args.topics * args.partitions
    try:
        print(f"{args.broker}: {args.topics} topics x {args.partitions} partitions ({n}); "
              f"work {work}", flush=True)
        print(f"source made in {make_source(broker.bootstrap, topics, args.partitions):.1f} s",
              flush=True)
        for run in range(args.runs):
            for i, code in enumerate(args.code):
                r = one_run(args, work, code, f"{run}-{i}", broker.bootstrap, port, n)
                idle = ", ".join(f"{k} {100 * v:.2f}" for k, v in r["idle"].items())
                print(f"run {run} {code}: first record {r.get('first_record_s', -1):.1f} s, "
                      f"all {int(r['sent'])} sent {r.get('all_sent_s', -1):.1f} s; idle "
                      f"{100 * r['idle_total']:.2f} % of a core ({idle}); load "
                      f"{os.getloadavg()[0]:.1f}", flush=True)
    finally:
        s.close()
        broker.stop()
        if not args.profile:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
