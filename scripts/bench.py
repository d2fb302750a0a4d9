"""Throughput benchmark: diode end to end versus a one-process Kafka relay.

Run with ./scripts/bench (it installs .venv first). Everything runs on 127.0.0.1:

1. an embedded broker (--broker: Apache Kafka by default, or Tansu) for the source cluster
   per record size, and a fresh one for the destination of each measurement, so that every
   run writes to an empty cluster;
2. per record size, N records pre-produced to a 4-partition source topic, then:
   - diode: a topology written to a temp dir, `diode launch` as a subprocess, timed from launch
     until all N records are in the destination topic (a consumer with assign() counts them,
     distinct by their sourcePartition/sourceOffset headers);
   - baseline: one Python process (this file, `_relay` mode) that consumes the source topic
     and produces every record to the destination with its headers plus the provenance headers,
     timed the same way;
   each system is measured --repeat times, alternating; when an unpaced diode run loses
   records or datagrams, one rerun per size is paced at --paced-mbps;
3. a table (every run, then medians over the complete runs) and, with --json FILE, one JSON
   line with every figure.

Values are random bytes (incompressible) unless --compressible. The topology uses AES-256-GCM
with a password file and salt, compression none (--compression), 65 000-byte datagrams and a
receive buffer of net.core.rmem_max; every other setting keeps its default unless --set.

CPU seconds are read with psutil from every child of the launch process (their titles say
which stage they are) and from the relay process, at the moment the last record arrived; the
brokers and the bench's own counting consumer are reported apart. Datagrams sent and
received come from the workers' metrics files (<run dir>/metrics/*.prom), receive-buffer drops
from /proc/net/udp. Speed is never asserted anywhere: this is a measurement, not a test.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from diode.brokers import KINDS, EmbeddedBroker, free_port, make_broker  # .venv: diode installed
from diode.kafka import producer_config
from diode.metrics import read_counter

REPO = Path(__file__).resolve().parent.parent

PARTITIONS = 4
SIZES = {"small": 100, "large": 10 * 1024}
# Set by the SIGINT/SIGTERM handler. The handler also raises KeyboardInterrupt, but a signal that
# lands inside a librdkafka call can be swallowed there, so the loops check this flag too.
INTERRUPTED = []


def check_interrupted() -> None:
    if INTERRUPTED:
        raise KeyboardInterrupt


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rmem_max() -> int:
    try:
        return int(Path("/proc/sys/net/core/rmem_max").read_text())
    except (OSError, ValueError):
        return 0


def udp_rcvbuf_errors() -> int:
    """Datagrams the kernel dropped because a socket's receive buffer was full (all sockets)."""
    try:
        lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines()
                 if line.startswith("Udp:")]
        return int(lines[1][lines[0].index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        return -1


def udp_socket_drops(port: int) -> int | None:
    """The `drops` column of /proc/net/udp for the socket bound to 127.0.0.1:`port`: datagrams
    the kernel discarded for that socket (receive buffer full)."""
    want = f"0100007F:{port:04X}"
    try:
        for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == want:
                return int(fields[-1])
    except (OSError, ValueError, IndexError):
        pass
    return None


# -- clean-up: everything started is registered here -----------------------------------------

class Resources:
    def __init__(self, broker_kind: str):
        self.broker_kind = broker_kind
        self.brokers: list[EmbeddedBroker] = []
        self.procs: list[subprocess.Popen] = []
        self.dirs: list[str] = []

    def broker(self, name: str, workdir: str) -> EmbeddedBroker:
        b = make_broker(self.broker_kind, name, f"127.0.0.1:{free_port()}",
                        os.path.join(workdir, f"{name}.log"))
        self.brokers.append(b)
        b.start()
        return b

    def stop_broker(self, b: EmbeddedBroker) -> None:
        b.stop()
        if b in self.brokers:
            self.brokers.remove(b)

    def popen(self, *args, **kw) -> subprocess.Popen:
        p = subprocess.Popen(*args, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def stop_proc(self, p: subprocess.Popen, timeout: float = 30.0) -> int:
        """SIGTERM, wait, then SIGKILL what is left of its process group (its own session)."""
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            # Wait without reaping: until it is reaped its pid, and so its group id, cannot be
            # reused, so the killpg below reaches only what we started.
            while True:
                try:
                    if os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                        break
                except ChildProcessError:
                    break
                if time.monotonic() > deadline:
                    log(f"pid {p.pid} did not stop within {timeout:.0f} s: killing its group")
                    break
                time.sleep(0.05)
            try:
                os.killpg(p.pid, signal.SIGKILL)  # any worker left behind
            except (ProcessLookupError, PermissionError):
                pass
        p.wait()
        if p in self.procs:
            self.procs.remove(p)
        return p.returncode

    def close(self) -> None:
        for p in list(self.procs):
            self.stop_proc(p, 10)
        for b in list(self.brokers):
            self.stop_broker(b)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


# -- data ------------------------------------------------------------------------------------

def make_value(size: int, compressible: bool) -> bytes:
    if not compressible:
        return os.urandom(size)
    # About 2:1 under zstd: half random bytes, half a repeated pattern.
    half = size // 2
    return os.urandom(half) + (b"diode-bench-" * (size // 12 + 1))[:size - half]


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions)], operation_timeout=10).values():
        fut.result()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} did not appear on {bootstrap}")


def preproduce(bootstrap: str, topic: str, count: int, size: int, compressible: bool) -> float:
    """Produce `count` records; returns the seconds it took. Fails unless all are acknowledged."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all",
                  "batch.size": 1000000, "queue.buffering.max.kbytes": 262144,
                  "compression.type": "none"})
    failed = []

    def delivered(err, msg):
        if err is not None:
            failed.append(err)

    t0 = time.monotonic()
    for i in range(count):
        if i % 1000 == 0:
            check_interrupted()
        value = make_value(size, compressible)
        while True:
            try:
                p.produce(topic, value=value, key=b"key-%d" % i,
                          headers=[("bench", b"%d" % i)], on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(120)
    if left or failed:
        raise RuntimeError(f"pre-producing {topic}: {left} record(s) unconfirmed, "
                           f"{len(failed)} failed ({failed[:1]})")
    return time.monotonic() - t0


# -- counting what arrived -------------------------------------------------------------------

class Counter:
    """Counts the destination topic's records, distinct by provenance (sourcePartition,
    sourceOffset), reading all partitions with assign() (no group join)."""

    def __init__(self, bootstrap: str, topic: str):
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-counter",
                           "enable.auto.commit": False, "fetch.wait.max.ms": 50})
        self.c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.seen: set = set()
        self.total = 0
        self.value_bytes = 0
        self.first_at = None
        self.last_at = None

    def poll(self, timeout: float = 0.1) -> int:
        got = 0
        for m in self.c.consume(2000, timeout):
            if m.error():
                continue
            h = dict(m.headers() or ())
            self.seen.add((h.get("sourcePartition"), h.get("sourceOffset")))
            self.total += 1
            self.value_bytes += len(m.value() or b"")
            got += 1
        if got:
            now = time.monotonic()
            self.first_at = self.first_at or now
            self.last_at = now
        return got

    @property
    def distinct(self) -> int:
        return len(self.seen)

    def close(self) -> None:
        self.c.close()


class CpuWatch:
    """CPU seconds (user + system) per process of a process tree, sampled on demand; a process
    that exits keeps its last sample."""

    def __init__(self, root_pid: int, label, brokers=()):
        self.root = psutil.Process(root_pid)
        self.label = label
        self.brokers = list(brokers)
        self.procs: dict[int, psutil.Process] = {}
        self.cpu: dict[int, tuple[str, float]] = {}
        self.brokers0 = broker_cpu(self.brokers)
        self.own0 = own_cpu()

    def snapshot(self) -> dict:
        """CPU seconds so far: per process, per broker and of this process (the counter)."""
        self.sample()
        brokers = broker_cpu(self.brokers)
        return {"per_process": self.by_name(),
                "brokers": {k: v - self.brokers0.get(k, 0.0) for k, v in brokers.items()},
                "counter": own_cpu() - self.own0}

    def sample(self) -> None:
        try:
            found = [self.root] + self.root.children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        for p in found:
            self.procs.setdefault(p.pid, p)
        for pid, p in self.procs.items():
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    name = self.label(p)
                self.cpu[pid] = (name, t.user + t.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass

    def by_name(self) -> dict:
        out: dict[str, float] = {}
        for name, sec in self.cpu.values():
            out[name] = out.get(name, 0.0) + sec
        return dict(sorted(out.items()))


def diode_label(p: psutil.Process) -> str:
    title = " ".join(p.cmdline()).strip()
    if title.startswith("diode: supervisor"):
        return "supervisor"
    if title.startswith("diode: "):
        return title[len("diode: "):].split()[0]
    return "launch"


def own_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def broker_cpu(brokers) -> dict:
    out = {}
    for b in brokers:
        try:
            t = psutil.Process(b.proc.pid).cpu_times()
            out[b.name] = t.user + t.system
        except psutil.NoSuchProcess:
            out[b.name] = 0.0
    return out


def wait_for_records(counter: Counter, expected: int, proc: subprocess.Popen, cpu: CpuWatch,
                     first_timeout: float, idle_timeout: float, started: float,
                     udp_port: int = 0) -> dict:
    """Poll until `expected` distinct records arrived, the flow went idle, or `proc` died.

    CPU is snapshot while records keep arriving, so a run that ends idle (records lost) is
    charged the CPU used until its last record, not the idle wait after it."""
    next_sample = 0.0
    out = {"udp_socket_drops": None, "cpu": cpu.snapshot()}
    snapped_at = None

    def sample():
        nonlocal snapped_at
        if counter.last_at != snapped_at:
            out["cpu"] = cpu.snapshot()
            snapped_at = counter.last_at
        if udp_port:
            d = udp_socket_drops(udp_port)
            if d is not None:
                out["udp_socket_drops"] = max(d, out["udp_socket_drops"] or 0)

    while counter.distinct < expected:
        counter.poll(0.1)
        check_interrupted()
        now = time.monotonic()
        if now >= next_sample:
            sample()
            next_sample = now + 0.5
        if proc.poll() is not None:
            return {**out, "ended": f"process exited with {proc.returncode}"}
        if counter.last_at is None and now - started > first_timeout:
            return {**out, "ended": f"no record within {first_timeout:.0f} s"}
        if counter.last_at is not None and now - counter.last_at > idle_timeout:
            return {**out, "ended": f"idle for {idle_timeout:.0f} s"}
    out["cpu"] = cpu.snapshot()
    sample()
    return {**out, "ended": "complete"}


# -- the two systems -------------------------------------------------------------------------

def topology_yaml(args, name, src, dst, topic, prefix, udp_port, run_dir, secret, rate_mbps):
    def stages(**counts):
        return {k: {"instances": v} for k, v in counts.items()}

    return {
        "name": name,
        "compression": args.compression,
        "link": {"host": "127.0.0.1", "port": udp_port, "bind.address": "127.0.0.1",
                 "datagram.size.bytes": args.datagram_bytes, "rate.mbps": rate_mbps,
                 "receive.buffer.bytes": args.receive_buffer},
        "security": {"cipher": "aes-256-gcm", "password.file": secret,
                     "salt": "diode-bench-salt"},
        "sender": {"kafka": {"bootstrap.servers": src}, "topics": [topic],
                   "start.position": "earliest", "dead.letter.topic": "",
                   "stages": stages(kafka_reader=args.readers, packer=args.packers,
                                    udp_sender=1)},
        "receiver": {"kafka": {"bootstrap.servers": dst}, "topic.prefix": prefix,
                     "stages": stages(udp_reader=1, unpacker=args.unpackers,
                                      kafka_writer=args.writers)},
        "supervisor": {"run.dir": run_dir, "drain.timeout.seconds": 10},
    }


def metrics_summary(run_dir: str) -> dict:
    """A few counters from every worker's metrics file."""
    out = {}
    for f in sorted(Path(run_dir, "metrics").glob("*.prom")):
        text = f.read_text()
        stage = f.stem
        row = {}
        for name in ("records", "datagrams", "bytes", "rewinds", "cpu_seconds"):
            v = read_counter(text, name)
            if v:
                row[name] = v
        rejects = read_counter(text, "rejects")
        if rejects:
            row["rejects"] = rejects
        out[stage] = row
    return out


def run_diode(args, res, work, src, size_name, topic, count, rate_mbps, tag) -> dict:
    import yaml
    dst = res.broker(f"dest-diode-{size_name}-{tag}", work)
    prefix = f"d{tag}_"
    dest_topic = prefix + topic
    create_topic(dst.bootstrap, dest_topic)
    run_dir = os.path.join(work, f"run-{size_name}-{tag}")
    os.makedirs(run_dir)
    secret = os.path.join(work, "bench.password")
    if not os.path.exists(secret):
        Path(secret).write_text(os.urandom(16).hex() + "\n")
        os.chmod(secret, 0o600)
    udp_port = free_port(socket.SOCK_DGRAM)
    cfg = topology_yaml(args, f"bench-{size_name}-{tag}", src.bootstrap, dst.bootstrap,
                        topic, prefix, udp_port, run_dir, secret, rate_mbps)
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, rest = key.partition(".")
        target = cfg.setdefault(section, {}) if rest else cfg
        target[rest or section] = yaml.safe_load(value)
    path = os.path.join(work, f"topology-{size_name}-{tag}.yaml")
    Path(path).write_text(yaml.safe_dump(cfg, sort_keys=False))
    logfile = os.path.join(work, f"diode-{size_name}-{tag}.log")
    counter = Counter(dst.bootstrap, dest_topic)
    drops0 = udp_rcvbuf_errors()
    log(f"diode {size_name}: launching ({'unpaced' if not rate_mbps else f'{rate_mbps:g} Mbit/s'})")
    with open(logfile, "wb") as out:
        started = time.monotonic()
        proc = res.popen([str(REPO / ".venv/bin/diode"), "launch", path], stdout=out,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work)
    cpu = CpuWatch(proc.pid, diode_label, [src, dst])
    try:
        end = wait_for_records(counter, count, proc, cpu, args.first_timeout, args.idle_timeout,
                               started, udp_port)
        finished = counter.last_at or time.monotonic()
        drops1 = udp_rcvbuf_errors()
        code = res.stop_proc(proc)
        for b in (src, dst):
            if not b.alive():
                log(f"embedded broker {b.name} is not running any more (exit {b.proc.poll()})")
        counter.poll(0.5)  # anything the drain flushed
    finally:
        if proc.returncode is None:  # error or Ctrl-C: stop it while its brokers still run
            res.stop_proc(proc, 15)
        counter.close()
        res.stop_broker(dst)
    if end["ended"] != "complete" or code not in (0, -signal.SIGTERM):
        log(f"diode {size_name}: {end['ended']}, exit {code}; last lines of {logfile}:")
        for line in Path(logfile).read_text(errors="replace").splitlines()[-15:]:
            log("  " + line)
    metrics = metrics_summary(run_dir)
    return {
        **run_result("diode" if not rate_mbps else f"diode@{rate_mbps:g}Mb/s", counter, count,
                     started, finished, end, code),
        "rate_mbps": rate_mbps,
        "kernel_udp_rcvbuf_drops": drops1 - drops0 if drops0 >= 0 <= drops1 else None,
        "udp_socket_drops": end["udp_socket_drops"],
        "metrics": metrics,
        "rewinds": sum(m.get("rewinds", 0) for m in metrics.values()),
        "datagrams_sent": metrics.get("sender-udp_sender-0", {}).get("datagrams", 0),
        "datagrams_received": metrics.get("receiver-udp_reader-0", {}).get("datagrams", 0),
    }


def run_result(system, counter, count, started, finished, end, code) -> dict:
    """What every measured run reports, diode or baseline."""
    per_process = end["cpu"]["per_process"]
    return {
        "system": system,
        "expected": count,
        "received": counter.distinct,
        "duplicates": counter.total - counter.distinct,
        "missing": count - counter.distinct,
        "seconds": finished - started,
        "seconds_first_to_last": (counter.last_at - counter.first_at)
        if counter.first_at else None,
        "value_bytes": counter.value_bytes,
        "cpu_seconds": sum(per_process.values()),
        "cpu_per_process": per_process,
        "broker_cpu_seconds": end["cpu"]["brokers"],
        "counter_cpu_seconds": end["cpu"]["counter"],
        "ended": end["ended"],
        "exit_code": code,
    }


def run_baseline(args, res, work, src, size_name, topic, count, tag) -> dict:
    dst = res.broker(f"dest-relay-{size_name}-{tag}", work)
    dest_topic = f"relay{tag}_" + topic
    create_topic(dst.bootstrap, dest_topic)
    logfile = os.path.join(work, f"relay-{size_name}-{tag}.log")
    counter = Counter(dst.bootstrap, dest_topic)
    log(f"baseline {size_name}: starting the relay")
    with open(logfile, "wb") as out:
        started = time.monotonic()
        proc = res.popen([sys.executable, __file__, "_relay", src.bootstrap, dst.bootstrap,
                          topic, dest_topic, str(count)], stdout=out, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL)
    cpu = CpuWatch(proc.pid, lambda p: "relay", [src, dst])
    try:
        end = wait_for_records(counter, count, proc, cpu, args.first_timeout, args.idle_timeout,
                               started)
        if end["ended"].startswith("process exited with 0"):
            while counter.poll(0.5):  # it flushed and left before we counted the tail
                pass
            end["ended"] = "complete" if counter.distinct >= count else "relay finished short"
        finished = counter.last_at or time.monotonic()
        code = res.stop_proc(proc)
    finally:
        if proc.returncode is None:  # error or Ctrl-C: stop it while its brokers still run
            res.stop_proc(proc, 15)
        counter.close()
        res.stop_broker(dst)
    if end["ended"] != "complete":
        log(f"baseline {size_name}: {end['ended']}; log: "
            + Path(logfile).read_text(errors="replace")[-2000:])
    return run_result("baseline", counter, count, started, finished, end, code)


def relay_main(argv) -> int:
    """The baseline: one process, consume -> produce, the same headers plus provenance."""
    src, dst, topic, dest_topic, count = argv[0], argv[1], argv[2], argv[3], int(argv[4])
    c = Consumer({"bootstrap.servers": src, "group.id": "bench-relay",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    p = Producer(producer_config({"bootstrap.servers": dst}))  # the kafka_writer's settings
    done = 0
    idle_since = time.monotonic()
    while done < count and time.monotonic() - idle_since < 30:
        msgs = c.consume(1000, 0.1)
        for m in msgs:
            if m.error():
                continue
            headers = list(m.headers() or ())
            headers += [("sourceTopic", m.topic().encode()),
                        ("sourcePartition", str(m.partition()).encode()),
                        ("sourceOffset", str(m.offset()).encode())]
            ts_type, ts = m.timestamp()
            kw = {"timestamp": ts} if ts_type else {}
            while True:
                try:
                    p.produce(dest_topic, value=m.value(), key=m.key(), headers=headers,
                              partition=m.partition(), **kw)
                    break
                except BufferError:
                    p.poll(0.05)
            done += 1
        if msgs:
            idle_since = time.monotonic()
        p.poll(0)
    left = p.flush(60)
    c.close()
    print(f"relayed {done} record(s), {left} unconfirmed", flush=True)
    # Stay until the bench has counted the records and read our CPU time, as with diode.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0 if done >= count and not left else 1))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return 0 if done >= count and not left else 1


# -- report ----------------------------------------------------------------------------------

def rate(r) -> tuple[float, float]:
    if not r["seconds"]:
        return 0.0, 0.0
    return r["received"] / r["seconds"], r["value_bytes"] / r["seconds"] / 1e6


def summarise(results) -> dict:
    """Per size and system: median records/s and MB/s over the complete runs (over every run
    when none was complete)."""
    out = {}
    for size_name, rows in results["sizes"].items():
        by_system: dict = {}
        for r in rows:
            by_system.setdefault(r["system"], []).append(r)
        out[size_name] = {}
        for system, runs in by_system.items():
            complete = [r for r in runs if not r["missing"]] or runs
            out[size_name][system] = {
                "records_per_second": statistics.median(rate(r)[0] for r in complete),
                "mb_per_second": statistics.median(rate(r)[1] for r in complete),
                "runs": [rate(r)[0] for r in runs],
                "incomplete_runs": sum(1 for r in runs if r["missing"]),
            }
    return out


def print_table(results, file=sys.stdout) -> None:
    def p(line=""):
        print(line, file=file)

    p()
    p("records/s and MB/s (value bytes): from start (launch) until the last record was in the "
      "destination topic;")
    p("steady: from the first record in the destination to the last; ratio: records/s "
      "diode / baseline.")
    p()
    p(f"{'size':<12} {'system':<17} {'records':>8} {'missing':>7} {'seconds':>7} "
      f"{'records/s':>10} {'MB/s':>6} {'steady/s':>9} {'CPU s':>6} {'µs/rec':>6} {'ratio':>5}")
    for size_name, rows in results["sizes"].items():
        for r in rows:
            base = next((b for b in rows if b["system"] == "baseline"
                         and b.get("run") == r.get("run")), None)
            rps, mbps = rate(r)
            ratio = ""
            if base and r is not base and rate(base)[0]:
                ratio = f"{rps / rate(base)[0]:.2f}"
            steady = r["seconds_first_to_last"]
            steady = f"{r['received'] / steady:,.0f}" if steady else "-"
            per_rec = 1e6 * r["cpu_seconds"] / r["received"] if r["received"] else 0.0
            label = f"{size_name} {results['value_bytes'][size_name]} B"
            p(f"{label:<12} {r['system']:<17} {r['received']:>8} {r['missing']:>7} "
              f"{r['seconds']:>7.1f} {rps:>10,.0f} {mbps:>6.1f} {steady:>9} "
              f"{r['cpu_seconds']:>6.1f} {per_rec:>6.0f} {ratio:>5}")
    summary = results.get("summary", {})
    if any(len(m["runs"]) > 1 for by_system in summary.values() for m in by_system.values()):
        p()
        p("medians over the complete runs (records/s end to end, MB/s, ratio of medians):")
        for size_name, by_system in summary.items():
            base = by_system.get("baseline", {}).get("records_per_second")
            for system, m in by_system.items():
                ratio = (f"  ratio {m['records_per_second'] / base:.2f}"
                         if base and system != "baseline" else "")
                p(f"  {size_name:<6} {system:<17} {m['records_per_second']:>10,.0f} records/s "
                  f"{m['mb_per_second']:>6.1f} MB/s  (runs: "
                  + ", ".join(f"{x:,.0f}" for x in m["runs"]) + ")"
                  + (f" {m['incomplete_runs']} incomplete" if m["incomplete_runs"] else "")
                  + ratio)
    p()
    p("CPU seconds per process (% of one core over the run), until the last record arrived:")
    for size_name, rows in results["sizes"].items():
        for r in rows:
            parts = ", ".join(f"{k} {v:.1f} ({100 * v / r['seconds']:.0f}%)"
                              for k, v in r["cpu_per_process"].items() if r["seconds"])
            brokers = ", ".join(f"{k} {v:.1f}" for k, v in r["broker_cpu_seconds"].items())
            p(f"  {size_name:<5} {r['system']:<17} {parts}")
            notes = [f"{results['broker']} brokers: {brokers}",
                     f"bench counter: {r['counter_cpu_seconds']:.1f}"]
            if "datagrams_sent" in r:
                notes.append(f"datagrams sent {r['datagrams_sent']:.0f}, received "
                             f"{r['datagrams_received']:.0f}")
                drops = r.get("udp_socket_drops")
                notes.append("receive-buffer drops: "
                             + (f"{drops}" if drops is not None else "?")
                             + f" (machine-wide {r['kernel_udp_rcvbuf_drops']})")
                notes.append(f"reader rewinds: {r['rewinds']:.0f}")
            if r["duplicates"]:
                notes.append(f"duplicates: {r['duplicates']}")
            if r["ended"] != "complete":
                notes.append(f"ended: {r['ended']}")
            p(f"  {'':<5} {'':<17} " + "; ".join(notes))
    p()


# -- main ------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n")[0])
    ap.add_argument("--records-small", type=int, default=200000,
                    help="records of 100-byte values (default 200000)")
    ap.add_argument("--records-large", type=int, default=20000,
                    help="records of 10 KiB values (default 20000)")
    ap.add_argument("--sizes", default="small,large", help="which sizes to run: small,large")
    ap.add_argument("--broker", default="kafka", choices=KINDS,
                    help="embedded broker kind for both clusters (default kafka: Apache Kafka)")
    ap.add_argument("--compression", default="none", choices=("none", "gzip", "zstd", "lz4"))
    ap.add_argument("--compressible", action="store_true",
                    help="values half random, half a repeated pattern (about 2:1), instead of "
                         "random bytes (incompressible)")
    ap.add_argument("--datagram-bytes", type=int, default=65000)
    ap.add_argument("--rate-mbps", type=float, default=0.0,
                    help="link.rate.mbps of the first diode run (0: unpaced)")
    ap.add_argument("--paced-mbps", type=float, default=400.0,
                    help="link.rate.mbps of the rerun (once per size) when an unpaced run lost "
                         "records or datagrams (default 400; 0: no rerun)")
    ap.add_argument("--receive-buffer", type=int, default=0,
                    help="link.receive.buffer.bytes (default: net.core.rmem_max)")
    ap.add_argument("--readers", type=int, default=1)
    ap.add_argument("--packers", type=int, default=2)
    ap.add_argument("--unpackers", type=int, default=2)
    ap.add_argument("--writers", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a topology setting, e.g. --set sender.max.inflight.records=5000 "
                         "or --set supervisor.queue.max.messages=256 (repeatable)")
    ap.add_argument("--repeat", type=int, default=2,
                    help="measure each system this many times, alternating (default 2); the "
                         "summary gives medians")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--first-timeout", type=float, default=60.0,
                    help="seconds the first record may take to arrive")
    ap.add_argument("--idle-timeout", type=float, default=35.0,
                    help="seconds without a new record before a run counts as ended (lossy); "
                         "longer than sender.inflight.timeout.seconds (30) so a reader's rewind "
                         "can still complete the run (default 35)")
    ap.add_argument("--json", metavar="FILE", help="append one JSON line with every figure")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs, metrics)")
    args = ap.parse_args(argv)
    if not args.receive_buffer:
        args.receive_buffer = rmem_max() or 4 * 1024 * 1024
    return args


def main(argv) -> int:
    if argv and argv[0] == "_relay":
        return relay_main(argv[1:])
    args = parse_args(argv)
    res = Resources(args.broker)
    work = tempfile.mkdtemp(prefix="diode-bench-")
    if not args.keep:
        res.dirs.append(work)

    def on_signal(signum, frame):
        INTERRUPTED.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    counts = {"small": args.records_small, "large": args.records_large}
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    results = {
        "broker": args.broker,
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "rmem_max": rmem_max()},
        "settings": {"compression": args.compression, "compressible": args.compressible,
                     "cipher": "aes-256-gcm", "datagram_bytes": args.datagram_bytes,
                     "receive_buffer_bytes": args.receive_buffer,
                     "workers": {"kafka_reader": args.readers, "packer": args.packers,
                                 "udp_sender": 1, "udp_reader": 1,
                                 "unpacker": args.unpackers, "kafka_writer": args.writers}},
        "value_bytes": {s: SIZES[s] for s in sizes},
        "sizes": {},
    }
    log(f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {args.broker} brokers, "
        f"work dir {work}")
    log("diode workers: " + ", ".join(f"{k}×{v}" for k, v in
                                      results["settings"]["workers"].items())
        + f"; aes-256-gcm, compression {args.compression}, datagrams {args.datagram_bytes} B, "
          f"receive buffer {args.receive_buffer} B")
    try:
        for size_name in sizes:
            n, size = counts[size_name], SIZES[size_name]
            src = res.broker(f"source-{size_name}", work)  # fresh per size
            topic = f"bench-{size_name}"
            create_topic(src.bootstrap, topic)
            secs = preproduce(src.bootstrap, topic, n, size, args.compressible)
            log(f"pre-produced {n} records of {size} B to {topic} in {secs:.1f} s")
            rows = results["sizes"].setdefault(size_name, [])
            paced_done = False
            for run in range(1, args.repeat + 1):
                check_interrupted()
                if not args.skip_baseline:
                    b = run_baseline(args, res, work, src, size_name, topic, n, str(run))
                    b["run"] = run
                    rows.append(b)
                    log(f"baseline {size_name}: {rate(b)[0]:,.0f} records/s")
                check_interrupted()
                r = run_diode(args, res, work, src, size_name, topic, n, args.rate_mbps,
                              str(run))
                r["run"] = run
                rows.append(r)
                log(f"diode {size_name}: {rate(r)[0]:,.0f} records/s, {r['missing']} missing")
                link_loss = r["datagrams_sent"] - r["datagrams_received"]
                if (r["missing"] > 0 or link_loss > 0) and args.paced_mbps \
                        and not args.rate_mbps and not paced_done:
                    paced_done = True  # once per size: enough to show what pacing changes
                    paced = args.paced_mbps
                    log(f"diode {size_name}: {r['missing']} records missing, {link_loss:.0f} "
                        f"datagrams lost on the link: rerunning paced at {paced:g} Mbit/s")
                    r = run_diode(args, res, work, src, size_name, topic, n, paced,
                                  f"{run}paced")
                    r["run"] = run
                    rows.append(r)
                    log(f"diode {size_name} paced: {rate(r)[0]:,.0f} records/s, "
                        f"{r['missing']} missing")
            res.stop_broker(src)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        # A second Ctrl-C must not leave brokers or diode processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        res.close()
    results["summary"] = summarise(results)
    print_table(results)
    line = json.dumps(results, sort_keys=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(line + "\n")
        log(f"JSON line appended to {args.json}")
    if args.keep:
        log(f"work dir kept: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
