"""`diode soak`: traffic at a set rate through both sides of a topology for minutes or hours,
faults injected on a schedule, every record verified at the end, and a report.

The soak owns everything it runs, so that it can break any of it: the topology's embedded
brokers (on free ports), `diode link-sim` between the sides (its faults changed through its
control socket), the receiver and the sender as two `diode launch` processes (each restartable
alone), and the traffic, produced from this process to topics of its own (`soak-<id>-<n>`, so
the verdict is about this soak's records only). The faults are applied on their schedule
(diode.soak.schedule) by diode.soak.faults. At the end it drains the pipeline, stops it, asks
diode.soak.audit for the verdict on Spark and writes the report (diode.soak.report).
"""

import contextlib
import copy
import dataclasses
import datetime
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

from diode.kafka import brokers as embedded
from diode.runtime import launches
from diode.runtime import topology as topo
from diode.errors import DiodeError
from diode.soak import schedule as sched
from diode.soak.faults import BROKER_FAULTS, Faults
from diode.soak import traffic

log = logging.getLogger("diode.soak")
ROOT = Path(__file__).resolve().parents[2]
SAMPLE_SECONDS = 1.0
MISSING_TOPIC = "diode-soak-missing"
DIGEST_TOPIC = "diode-soak-digests"
MEMORY_JUDGED_AFTER = 600.0  # seconds of samples before a memory slope means anything
class Counters:
    """Counters summed over every worker incarnation: a restarted worker's metrics file starts
    from 0 again, so each file's drops are new beginnings, not negative progress."""

    def __init__(self, run_dirs: list, stage: str, names: tuple):
        self.run_dirs, self.stage, self.names = run_dirs, stage, names
        self.last: dict = {}
        self.total = dict.fromkeys(names, 0.0)

    def sample(self) -> dict:
        for run_dir in self.run_dirs:
            for worker, values in launches.worker_counters(run_dir, self.names,
                                                           self.stage).items():
                for name, v in values.items():
                    before = self.last.get((worker, name), 0.0)
                    self.total[name] += v - before if v >= before else v
                    self.last[(worker, name)] = v
        return self.total


@dataclasses.dataclass
class Plan:
    """What prepare() decided, before anything starts."""
    topology: topo.Topology
    raw: dict
    faults: list
    records: traffic.Records
    rate: float
    topics: list
    brokers: dict          # "source"/"destination" -> (kind, old listen) of embedded brokers
    run_id: str


class Soak:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.report).resolve()
        self.stopping = threading.Event()
        self.interrupts = 0
        self.failures: list[str] = []
        self.fault_log: list[dict] = []  # each fault as it was applied (diode.soak.faults)
        self.timeline: list[dict] = []
        self.launches: dict = {}      # side -> its diode.runtime.launches.Launch
        self.restarting: set = set()  # sides a restart fault has down on purpose
        self.brokers: dict = {}
        self.linksim = None
        self.traffic = None
        self.restarts = 0
        self._pids: dict = {}
        self._cpu: dict = {}
        self.faults = Faults(self)

    # -- before anything starts ------------------------------------------------------------

    def prepare(self) -> Plan:
        """Every check that needs nothing running: topology, schedule, rate. Raises
        DiodeError (TopologyError, ScheduleError) with what is wrong."""
        a = self.args
        path = Path(a.topology or ROOT / "topology.yaml")
        if not a.topology and not path.exists():
            raise DiodeError(f"no topology given, and no demo topology at {path} (a source "
                             "checkout has one, an installed wheel not): name one")
        t = topo.load(path) if a.topology else _demo_topology(path)
        raw = yaml.safe_load(path.read_text())
        duration = sched.parse_duration(a.duration)
        if duration < 60:
            raise DiodeError(f"--duration {a.duration}: a soak lasts at least 1m")
        mix = traffic.parse_sizes(a.sizes)
        rate = traffic.Rate.parse(a.rate, traffic.mean_size(mix)).records_per_second
        kinds = {b.side: b for b in t.brokers}
        found = {}
        for role, side in (("source", "sender"), ("destination", "receiver")):
            b = kinds.get(side)
            bootstrap = getattr(t, side).kafka.get("bootstrap.servers", "")
            if b is not None and b.listen == bootstrap:
                found[role] = (a.broker_kind or b.kind, b.listen)
        if a.faults:
            faults = sched.load(a.faults, duration, a.seed)
        else:  # what cannot be injected here is left out, and said
            cannot = {k for k, role in BROKER_FAULTS.items() if role not in found}
            if found.get("destination", ("",))[0] == "tansu":
                cannot.add("destination-stop")
            if cannot:
                self.say("the built-in schedule leaves out " + ", ".join(sorted(cannot))
                          + ": the soak can pause and stop only the topology's embedded "
                          "brokers, and stop only Apache Kafka")
            faults = sched.default_schedule(duration, a.seed, frozenset(cannot))
        problems = []
        for f in faults:
            role = BROKER_FAULTS.get(f.kind)
            if role and role not in found:
                problems.append(f"{f.kind} at {sched.format_duration(f.start)}: the {role} "
                                "cluster is not an embedded broker of the topology, so the soak "
                                "cannot pause or stop it")
            elif f.kind == "destination-stop" and found[role][0] == "tansu":
                problems.append(f"destination-stop at {sched.format_duration(f.start)}: Tansu "
                                "keeps its records in memory and loses them when it stops; "
                                "soak on Apache Kafka (--broker-kind kafka) or pause instead")
        if t.sender.kafka.get("bootstrap.servers") == t.receiver.kafka.get("bootstrap.servers") \
                and not t.receiver.topic_prefix:
            problems.append("the source and the destination are one cluster and "
                            "receiver.topic.prefix is empty: the soak would write its records "
                            "back into the topics it reads")
        if problems:
            raise sched.ScheduleError("\n".join(problems))
        link_mbps = t.link.rate_mbps
        need_mbps = rate * (traffic.mean_size(mix) + 120) * 8 / 1e6
        if link_mbps and need_mbps > link_mbps * 0.9:
            raise DiodeError(f"--rate {a.rate}: the traffic needs about {need_mbps:.1f} Mbit/s "
                             f"and the topology paces the link at {link_mbps:g} Mbit/s "
                             "(link.rate.mbps); ask for less or raise it")
        run_id = time.strftime("%m%d%H%M%S")
        topics = [f"soak-{run_id}-{i}" for i in range(a.topics)]
        records = traffic.Records(topics, a.partitions, mix, a.seed)
        cost = traffic.cost_per_record(records)
        most = 0.5 / cost  # half a core: the pipeline and the brokers need the rest
        if rate > most:
            raise DiodeError(f"--rate {a.rate} ({rate:.0f} records/s): this machine produces "
                             f"at most about {most:.0f} records/s of this mix while leaving "
                             f"the pipeline its cores ({cost * 1e6:.1f} µs each, measured)")
        return Plan(t, raw, faults, records, rate, topics, found, run_id)

    # -- the run ---------------------------------------------------------------------------

    def run(self, plan: Plan) -> int:
        """The soak, from starting the brokers to the report; the exit code."""
        self.plan = plan
        self.out.mkdir(parents=True, exist_ok=True)
        self.duration = sched.parse_duration(self.args.duration)
        handler = logging.FileHandler(self.out / "soak.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        diode_log = logging.getLogger("diode")
        diode_log.addHandler(handler)
        # The terminal gets the soak's own lines (once, through say) and diode's warnings;
        # what the brokers and the clients say at INFO is in soak.log only.
        warnings = logging.StreamHandler(sys.stderr)
        warnings.setLevel(logging.WARNING)
        warnings.setFormatter(logging.Formatter("diode soak: %(levelname)s %(name)s: "
                                                "%(message)s"))
        diode_log.addHandler(warnings)
        diode_log.propagate = False
        log.addHandler(handler)
        log.propagate = False
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT,
                                                                   signal.SIGTERM)}
        self.started_at = time.time()
        verdict = None
        try:
            self._start(plan)
            self._soak(plan)
            self._drain()
            self._stop_pipeline()
            if self.interrupts < 2:
                verdict = self._audit(plan)
        except DiodeError as exc:
            self.failures.append(str(exc))
            self.say(f"error: {exc}")
        finally:
            self._cleanup()
            for s, h in previous.items():
                signal.signal(s, h)
        try:
            return self._report(plan, verdict)
        finally:
            for h in (handler, warnings):
                diode_log.removeHandler(h)
            diode_log.propagate = True
            log.removeHandler(handler)
            log.propagate = True

    def _on_signal(self, signum, frame) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            self.say("stopping: draining, stopping every process, then the audit and the "
                      "report (Ctrl-C again: no audit)")
        self.stopping.set()

    def say(self, text: str) -> None:
        log.info("%s", text)
        print(f"diode soak: {text}", file=sys.stderr, flush=True)

    def _start(self, plan: Plan) -> None:
        a = self.args
        for role, (kind, old) in plan.brokers.items():
            b = embedded.make_broker(kind, role, f"127.0.0.1:{embedded.free_port()}",
                                     str(self.out / f"broker-{role}.log"))
            self.brokers[role] = b
        self.say(f"starting {len(self.brokers)} embedded broker(s)")
        embedded.start_all(list(self.brokers.values()))
        files = self._topologies(plan)
        self._create_topics(plan)
        ports = files.pop("ports")
        self.linksim = subprocess.Popen(
            [sys.executable, "-m", "diode", "link-sim", "--listen",
             f"127.0.0.1:{ports['sim']}", "--forward", f"127.0.0.1:{ports['receiver']}",
             "--control", f"127.0.0.1:{ports['control']}", "--seed", str(a.seed),
             "--report", str(self.out / "link-sim.json")],
            stdout=open(self.out / "link-sim.log", "ab"), stderr=subprocess.STDOUT)
        self.faults.control = ("127.0.0.1", ports["control"])
        # ZeroMQ ipc paths must fit in 107 bytes: the run directories are short temporary ones
        self.run_root = Path(tempfile.mkdtemp(prefix="diode-soak-"))
        self.run_dirs = {}
        for side in ("receiver", "sender"):
            self.run_dirs[side] = self.run_root / side
            self.launches[side] = launches.Launch(files[side], side, self.run_dirs[side],
                                                  self.out / f"launch-{side}.log").start()
            self.launches[side].wait_ready(self.worker_count(side))
        self.writes = Counters(list(self.run_dirs.values()), "kafka_writer",
                               ("records", "missing_records", "late_records"))
        self.say(f"sides up; producing {plan.rate:.0f} records/s to {', '.join(plan.topics)} "
                  f"for {sched.format_duration(self.duration)}, {len(plan.faults)} faults")
        self.traffic = traffic.Traffic(self._source_kafka(plan), plan.records, plan.rate)
        self.traffic.start()

    def worker_count(self, side: str) -> int:
        t = self.plan.topology
        return sum(s.instances for s in getattr(t, side).stages.values())

    def _source_kafka(self, plan: Plan) -> dict:
        b = self.brokers.get("source")
        return b.client_config() if b else {
            "bootstrap.servers": plan.topology.sender.kafka["bootstrap.servers"]}

    def _bootstrap(self, role: str, plan: Plan) -> str:
        b = self.brokers.get(role)
        side = "sender" if role == "source" else "receiver"
        return b.bootstrap if b else getattr(plan.topology, side).kafka["bootstrap.servers"]

    def _topologies(self, plan: Plan) -> dict:
        """The sender's and the receiver's topology files for this soak, in the report
        directory: the link through link-sim, the brokers on their new ports, the soak's
        topics, the missing-records topic, the journal in the report directory."""
        t, raw = plan.topology, copy.deepcopy(plan.raw)
        ports = dict(zip(("sim", "receiver", "control"),
                         embedded.free_ports(3, socket.SOCK_DGRAM)))
        raw.pop("brokers", None)
        raw.setdefault("sender", {})
        raw.setdefault("receiver", {})
        raw.setdefault("supervisor", {})
        raw["sender"].setdefault("kafka", {})["bootstrap.servers"] = \
            self._bootstrap("source", plan)
        raw["receiver"].setdefault("kafka", {})["bootstrap.servers"] = \
            self._bootstrap("destination", plan)
        for side in ("sender", "receiver"):  # each side's Prometheus endpoint on a free port
            raw[side]["metrics.listen"] = f"127.0.0.1:{embedded.free_port()}"
        raw["sender"]["topics"] = plan.topics
        raw["sender"].pop("topics.regex", None)
        raw["sender"]["start.position"] = "earliest"
        r = raw["receiver"]
        r["missing.records.topic"] = t.receiver.missing_records_topic or MISSING_TOPIC
        r["digest.topic"] = t.receiver.digest_topic or DIGEST_TOPIC
        r["journal.dir"] = str(self.out / "journal")
        raw["supervisor"].pop("run.dir", None)
        sec = raw.setdefault("security", {})
        for key in ("password.file", "key.file", "next.password.file", "next.key.file"):
            if sec.get(key):
                sec[key] = t.resolve(sec[key])
        if self.args.topology is None:  # the demo's password is made by ./scripts/demo
            secret = self.out / "password"
            if not secret.exists():
                secret.write_text(secrets.token_urlsafe(24) + "\n")
                secret.chmod(0o600)
            sec["password.file"] = str(secret)
        files = {"ports": ports}
        for side in ("sender", "receiver"):
            data = copy.deepcopy(raw)
            link = data.setdefault("link", {})
            link["host"] = "127.0.0.1"
            link["bind.address"] = "127.0.0.1"
            link["source.addresses"] = ["127.0.0.1"]  # (link-sim's, on this host)
            link["port"] = ports["sim"] if side == "sender" else ports["receiver"]
            files[side] = self.out / f"topology-{side}.yaml"
            files[side].write_text(yaml.safe_dump(data, sort_keys=False))
            topo.load(files[side])  # still valid as rewritten
        return files

    def _create_topics(self, plan: Plan) -> None:
        from confluent_kafka.admin import AdminClient
        from diode.kafka.clients import create_topic
        admin = AdminClient({**self._source_kafka(plan), "logger": traffic.KAFKA_LOG})
        for topic in plan.topics:
            create_topic(admin, topic, self.args.partitions)

    def _soak(self, plan: Plan) -> None:
        """Sample every second, start and end faults on time, until the duration or Ctrl-C."""
        from diode.soak.view import View
        pending = list(plan.faults)
        self.t0 = time.monotonic()
        self.t0_epoch = time.time()  # (what the report's times count from)
        view = View(self, plan, live=not self.args.no_view)
        with view:
            next_sample = self.t0
            while not self.stopping.is_set():
                elapsed = time.monotonic() - self.t0
                if elapsed >= self.duration:
                    break
                while pending and pending[0].start <= elapsed:
                    self.faults.inject(pending.pop(0))
                self._sample(elapsed)
                self._check_alive()
                view.update()
                next_sample += SAMPLE_SECONDS
                while time.monotonic() < next_sample and not self.stopping.is_set():
                    self.faults.run_main_calls()
                    self.stopping.wait(min(0.1, max(0.0, next_sample - time.monotonic())))
            while self.faults.in_progress():  # faults in progress end first
                self.faults.run_main_calls()
                time.sleep(0.1)

    def _check_alive(self) -> None:
        for side, launch in self.launches.items():
            if not launch.alive() and side not in self.restarting:
                self.failures.append(f"the {side} launch exited with {launch.proc.returncode} "
                                     f"(its log: {launch.log_path})")
                self.say(self.failures[-1])
                self.stopping.set()
        if self.linksim.poll() is not None:
            self.failures.append("link-sim exited")
            self.stopping.set()

    # -- samples ---------------------------------------------------------------------------

    def _sample(self, elapsed: float) -> dict:
        w = self.writes.sample()
        workers = {}
        now = time.monotonic()
        for side, launch in self.launches.items():
            for title, proc in launch.workers().items():
                try:
                    rss = proc.memory_info().rss
                    cpu = sum(proc.cpu_times()[:2])
                except psutil.Error:
                    continue
                was = self._pids.get(title)
                if was is not None and was != proc.pid:
                    self.restarts += 1
                self._pids[title] = proc.pid
                last = self._cpu.get(proc.pid)
                self._cpu[proc.pid] = (cpu, now)
                pct = 100 * (cpu - last[0]) / (now - last[1]) if last and now > last[1] else 0.0
                workers[title] = {"pid": proc.pid, "rss": rss, "cpu": round(pct, 1)}
        produced = self.traffic.acked if self.traffic else 0
        delivered = int(w["records"])
        missing = int(w["missing_records"] - w["late_records"])
        s = {"t": round(elapsed, 2), "produced": produced, "delivered": delivered,
             "missing": missing, "backlog": max(0, produced - delivered - missing),
             "restarts": self.restarts, "behind": self.traffic.behind if self.traffic else 0,
             "workers": workers}
        self.timeline.append(s)
        return s

    # -- the end ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """Stop the traffic, then wait until the pipeline has written or reported every record
        (or nothing moved for a while)."""
        if not self.traffic:
            return
        self.say("traffic stopped; draining the pipeline")
        self.traffic.stop(timeout=120)
        t = self.plan.topology
        quiet_for = 10 + 2 * t.receiver.reorder_wait_max_ms / 1000
        deadline = time.monotonic() + (20 if self.interrupts else 300)
        last, still_since = None, time.monotonic()
        while time.monotonic() < deadline and self.interrupts < 2:
            s = self._sample(time.monotonic() - self.t0)
            progress = (s["delivered"], s["missing"])
            if progress != last:
                last, still_since = progress, time.monotonic()
            if s["backlog"] == 0 and time.monotonic() - still_since > 5:
                break
            if time.monotonic() - still_since > quiet_for:
                break
            time.sleep(SAMPLE_SECONDS)

    def _stop_pipeline(self) -> None:
        for side in ("sender", "receiver"):
            launch = self.launches.get(side)
            if launch and launch.alive():
                code = launch.stop()
                if code not in (0, None):
                    self.failures.append(f"the {side} launch stopped with exit code {code} "
                                         f"(its log: {launch.log_path})")

    def _audit(self, plan: Plan):
        from diode.soak import audit
        self.say("auditing record by record on Spark")
        prefix = plan.topology.receiver.topic_prefix
        # Spark's JVM (started now) writes its log and progress bars to the process's own
        # stdout and stderr, which it inherits: off a terminal, they go to spark.log
        quiet = _output_to(self.out / "spark.log") if not sys.stderr.isatty() \
            else contextlib.nullcontext()
        try:
            with quiet:
                return audit.run(
                    source=self._bootstrap("source", plan), topics=plan.topics,
                    destination=self._bootstrap("destination", plan),
                    dest_pattern="|".join(re.escape(prefix + t) for t in plan.topics),
                    missing_topic=plan.topology.receiver.missing_records_topic or MISSING_TOPIC,
                    digest_topic=plan.topology.receiver.digest_topic or DIGEST_TOPIC,
                    started_ms=int(self.started_at * 1000),
                    written_at=plan.topology.receiver.written_at_header,
                    fmt=self.args.format)
        except Exception as exc:  # noqa: BLE001 - Spark wraps its errors: keep the report
            from diode.spark.verify import cause
            self.failures.append(f"the audit failed: {cause(exc)}")
            return None

    def _cleanup(self) -> None:
        self.stopping.set()
        if self.traffic and self.traffic._thread.is_alive():
            self.traffic.stop(timeout=5)
        for launch in self.launches.values():
            if launch.alive():
                launch.stop(signal.SIGKILL, 10)
        if self.linksim and self.linksim.poll() is None:
            self.linksim.terminate()
            try:
                self.linksim.wait(10)
            except subprocess.TimeoutExpired:
                self.linksim.kill()
        for b in self.brokers.values():
            b.stop()
        if getattr(self, "run_root", None):
            shutil.rmtree(self.run_root, ignore_errors=True)

    def _report(self, plan: Plan, verdict: dict | None) -> int:
        from diode.soak import report
        # growth judged while nothing disturbs the pipeline: no fault, no more backlog than
        # five seconds of traffic (report.memory)
        mem = report.memory(self.timeline, self.fault_log,
                            backlog_limit=max(1000.0, 5 * plan.rate))
        judged = self.duration >= MEMORY_JUDGED_AFTER and not self.interrupts
        failures = list(self.failures)
        if judged:
            failures += report.memory_verdict(mem, self.args.max_rss_slope)
        counts = ("produced", "delivered", "missing_reported", "silent_loss", "false_missing",
                  "duplicates", "corrupted", "unexplained_loss")
        missing = None
        if verdict is not None:  # each missing record tied to the fault that caused it
            attributed = report.attribute(verdict["missing_ranges"], self.fault_log,
                                          self.args.fault_margin,
                                          getattr(self, "t0_epoch", self.started_at))
            (self.out / "missing-ranges.json").write_text(json.dumps(attributed))
            missing = report.missing_by_fault(attributed, self.fault_log)
            verdict["unexplained_loss"] = missing["unexplained"]["records"]
        if verdict is None:
            failures.append("not verified: the audit did not run")
        else:
            for name in counts[3:]:
                if verdict[name]:
                    failures.append(f"{name}: {verdict[name]} (must be 0)")
            if (verdict.get("digests") or {}).get("altered"):
                failures.append(f"digests altered: {verdict['digests']['altered']} (must be 0)")
        if self.interrupts:
            failures.append("interrupted (Ctrl-C) before the end of the schedule")
        v = verdict or {}
        rep = {
            "command": " ".join(["diode", *map(shlex.quote, sys.argv[1:])]),
            "started_at": datetime.datetime.fromtimestamp(self.started_at).astimezone()
            .isoformat(timespec="seconds"),
            "duration": self.duration,
            "ran_seconds": self.timeline[-1]["t"] if self.timeline else 0,
            "rate": plan.rate, "sizes": self.args.sizes, "seed": self.args.seed,
            "topics": plan.topics, "partitions": self.args.partitions,
            "brokers": {r: b.kind for r, b in self.brokers.items()},
            **{k: v.get(k) for k in counts},
            **{k: v.get(k) for k in ("late_filled", "reported_twice", "phantom_reports",
                                     "unknown_written", "missing_reasons", "digests",
                                     "latency_overall")},
            "missing": missing, "fault_margin": self.args.fault_margin,
            "faults": self.fault_log,
            "worker_restarts": self.restarts,
            "memory": mem, "memory_judged": judged, "max_rss_slope_mb_per_h":
            self.args.max_rss_slope,
            "latency": report.latency_per_minute(v.get("latency") or []),
            "failures": failures, "passed": not failures,
        }
        (self.out / "timeline.json").write_text(json.dumps(self.timeline))
        (self.out / "report.json").write_text(json.dumps(rep, indent=1, default=str))
        images = report.plot(self.out, self.timeline, v.get("latency") or [], self.fault_log)
        md = report.write_markdown(self.out, rep, images)
        self.say(("PASSED" if rep["passed"] else "FAILED: " + "; ".join(failures))
                  + f" (report: {md})")
        if self.interrupts:
            return 130
        return 0 if rep["passed"] else 1


@contextlib.contextmanager
def _output_to(path: Path):
    """Meanwhile, the process's stdout and stderr (file descriptors 1 and 2, which the processes
    it starts inherit, as Spark's JVM does for its life) go to the file at `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, was in zip((1, 2), saved):
            os.dup2(was, fd)
            os.close(was)


def _demo_topology(path: Path) -> topo.Topology:
    """The demo topology, loaded without its password file (./scripts/demo makes it; the soak
    makes its own)."""
    data = yaml.safe_load(path.read_text())
    data.setdefault("security", {})["password.file"] = os.devnull
    return topo.from_dict(data, str(path))


def main(args) -> int:
    """Bad input (topology, schedule, rate) exits 2 before anything starts."""
    import importlib.util
    missing = [m for m in ("pyspark", "rich", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"diode soak needs the `soak` extra ({', '.join(missing)} missing): "
              "pip install 'diode[soak]'", file=sys.stderr)
        return 2
    soak = Soak(args)
    try:
        plan = soak.prepare()
    except DiodeError as exc:
        print(f"diode soak: {exc}", file=sys.stderr)
        return 2
    return soak.run(plan)


def add_parser(sub) -> None:
    p = sub.add_parser("soak", help="run traffic through both sides for a while, inject faults "
                       "on a schedule, verify every record and write a report (exit 0: passed)")
    p.add_argument("topology", nargs="?", help="the topology to soak (default: the demo "
                   "topology, on embedded brokers)")
    p.add_argument("--duration", default="10m", help="how long the traffic runs: 120, 2m, "
                   "1h30m (default 10m; at least 1m)")
    p.add_argument("--rate", default="1000", help="records per second (5000) or Mbit/s "
                   "(20mbps) (default 1000)")
    p.add_argument("--sizes", default=traffic.DEFAULT_SIZES,
                   help=f"value sizes and weights (default {traffic.DEFAULT_SIZES})")
    p.add_argument("--topics", type=int, default=3, help="source topics (default 3)")
    p.add_argument("--partitions", type=int, default=4, help="partitions each (default 4)")
    p.add_argument("--faults", help="the fault schedule (YAML; docs/soak.md); default: the "
                   "built-in schedule, every kind of fault at least once")
    p.add_argument("--report", default="soak-report", help="report directory (default "
                   "soak-report)")
    p.add_argument("--seed", type=int, default=1, help="seed of the traffic and the faults")
    p.add_argument("--broker-kind", choices=("kafka", "tansu"), default="kafka",
                   help="kind of the topology's embedded brokers (default kafka: Tansu cannot "
                   "be stopped without losing its records)")
    p.add_argument("--max-rss-slope", type=float, default=20.0, metavar="MB_PER_H",
                   help="fail when a worker's memory grows faster (judged on soaks of 10 "
                   "minutes or more; default 20)")
    p.add_argument("--fault-margin", type=float, default=10.0, metavar="SECONDS",
                   help="records produced this close to a fault that may lose records may be "
                   "lost by it (default 10)")
    p.add_argument("--format", choices=("auto", "native", "python"), default="auto",
                   help="the audit's Kafka source (as diode verify --format)")
    p.add_argument("--no-view", action="store_true", help="a line every 10 s instead of the "
                   "live view")
    p.set_defaults(func=main)
