"""The supervisor: forks one process per stage instance, watches them, drains them.

After gunicorn's Arbiter and supervisord's process states. The supervisor creates no ZeroMQ
context and no Kafka client: children make their own after the fork.

A worker is STARTING from its fork until it has run its stage's open() and reported its first
heartbeat (worker.Heartbeats.opened), then RUNNING. An exit before that is a failed start (BACKOFF,
tried again after supervisor.start.backoff.ms times the failed starts in a row; more than
supervisor.start.retries in a row and it is FATAL); an exit while RUNNING is a crash (EXITED,
restarted after restart.backoff.*). More than restart.max exits of either kind within
restart.window.seconds is FATAL too. A FATAL worker stops the launch: the supervisor drains
every stage and exits 1, naming the worker and why. Every state change goes through `Worker.to`,
which refuses an edge missing from TRANSITIONS (a bug, raised).

SIGHUP reloads the receiver's keys without a restart (a key rotation, docs/runbooks.md): the
supervisor reads the topology file again and, if it is valid and its keys can be read, takes its
`security` section, puts the keys where its workers read them (worker.KeySlot) and signals the
unpackers, which rebuild their keyring; otherwise it logs why and keeps the keys it has. The
sender seals with the key it started with until it is restarted (a clean stop loses nothing).
"""

import dataclasses
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from enum import Enum

import setproctitle

from diode.link import crypto
from diode.link import path as link_path
from diode.runtime import exporter, key_material, launches, statedir, worker
from diode.kafka import brokers as embedded
from diode.kafka.clients import client_settings
from diode.errors import DiodeError, SecretError
from diode.runtime import topology as topo
from diode.runtime.topology import PIPELINES, SIDES, Topology
from diode.runtime.wiring import WorkerSpec, plan

log = logging.getLogger("diode.runtime.supervisor")


class State(Enum):
    """supervisord's process states, as a worker goes through them."""
    STOPPED = "stopped"    # not started yet, or stopped by a drain
    STARTING = "starting"  # forked; its stage has not yet opened and beaten
    RUNNING = "running"
    BACKOFF = "backoff"    # its start failed; started again after a wait
    STOPPING = "stopping"  # asked to drain (SIGTERM)
    EXITED = "exited"      # exited while running; restarted after a wait (unless done)
    FATAL = "fatal"        # given up on: the launch stops


S = State
# How often the watch looks at its workers (heartbeats, a worker that has opened its stage)
# with nothing else to wake it: a worker's exit, a signal and a restart due end its wait
# (Supervisor._nap). Each turn looks at every worker: 20 turns a second cost an
# idle launch 0.2-0.3 % of a core.
WATCH_SECONDS = 0.25
TRANSITIONS = {
    (S.STOPPED, S.STARTING),   # forked for its first start
    (S.STARTING, S.RUNNING),   # its stage ran open() and it reported its first heartbeat
    (S.STARTING, S.BACKOFF),   # it exited, or stopped beating, before that: a failed start
    (S.BACKOFF, S.STARTING),   # start.backoff.ms times the failed starts in a row passed
    (S.BACKOFF, S.FATAL),      # more than start.retries failed starts in a row, or more than
    #                            restart.max exits within restart.window.seconds
    (S.RUNNING, S.EXITED),     # it exited or stopped beating (or `diode resend` is done)
    (S.EXITED, S.STARTING),    # its restart backoff passed; forked again
    (S.EXITED, S.FATAL),       # more than restart.max exits within restart.window.seconds
    (S.STARTING, S.STOPPING),  # drain: SIGTERM (it stops once it has opened)
    (S.RUNNING, S.STOPPING),   # drain: SIGTERM
    (S.STOPPING, S.STOPPED),   # it exited (or was killed after drain.timeout.seconds)
    (S.BACKOFF, S.STOPPED),    # drain: not started again
    (S.EXITED, S.STOPPED),     # drain: not restarted
}


class IllegalTransition(RuntimeError):
    """A state change the table does not allow: a bug in the supervisor."""


class Worker:
    def __init__(self, spec: WorkerSpec, slot: int):
        self.spec = spec
        self.slot = slot
        self.pid = 0
        self.state = State.STOPPED
        self.exits: deque = deque()  # monotonic times of unexpected exits
        self.starts = 0              # forks so far: 1 is its first start, more a restart
        self.failed_starts = 0       # failed starts in a row
        self.restart_at: float | None = 0.0  # None: not to be started again
        self.message = ""            # why it is in BACKOFF, EXITED or FATAL (diode status)
        self.killed_for = ""         # why the supervisor killed it, for its exit's message

    def to(self, state: State, why: str = "") -> None:
        if (self.state, state) not in TRANSITIONS:
            raise IllegalTransition(f"{self.spec.name}: {self.state.name} -> {state.name} "
                                    f"({why})")
        log.info("%s: %s -> %s%s", self.spec.name, self.state.name, state.name,
                 f" ({why})" if why else "")
        self.state = state


def load_secrets(t: Topology) -> worker.Secrets:
    """Key material, derived once here and inherited by every child (read by
    diode.runtime.key_material, a file other users can read warned about)."""
    sec = t.security
    cipher_id = crypto.CIPHER_IDS[sec.cipher]
    if not cipher_id:
        log.warning("security.cipher is none: datagrams are NOT encrypted or authenticated; "
                    "anyone who can reach the receiver's port can write records")
        return worker.Secrets(0, None)
    current = _master_key(t, key_material.CURRENT)
    if current is None:
        raise SecretError("security: no key.file, password.file or password.env given")
    following = _master_key(t, key_material.NEXT)
    return worker.Secrets(cipher_id, current, sec.key_id, following, sec.next_key_id)


def _master_key(t: Topology, which: tuple) -> bytes | None:
    material = key_material.read(t, which)
    if material is None:
        return None
    if material.warning:
        log.warning("%s", material.warning)
    return material.master_key(t.security.salt.encode())


class Supervisor:
    def __init__(self, topology: Topology, sides=SIDES, run_dir: str | None = None,
                 stages: dict | None = None):
        """`stages`: stage type -> the Stage class that runs its workers, where it is not
        stages.<type>.Stage (`diode resend` runs kafka_reader's as stages.kafka_resender)."""
        self.t = topo.for_this_host(topology)  # (the datagram size and bind address, if auto)
        self.sides = tuple(s for s in SIDES if s in sides)
        self.stages = {stage: (stages or {}).get(stage) or worker.stage_class(stage)
                       for side in self.sides for stage in PIPELINES[side]}
        self.cfg = topology.supervisor
        self._own_run_dir = not (run_dir or self.cfg.run_dir)
        self.run_dir = run_dir or self.cfg.run_dir or tempfile.mkdtemp(prefix="diode-")
        os.makedirs(self.run_dir, exist_ok=True)
        specs = plan(topology, self.sides)
        self.workers = [Worker(s, i) for i, s in enumerate(specs)]
        self.heartbeats = worker.Heartbeats(len(specs))
        self.brokers = [self._broker(b) for b in topology.brokers if b.side in self.sides]
        self.secrets: worker.Secrets | None = None
        self.keys = worker.KeySlot()  # what the workers read of self.secrets (made before forks)
        self.inherited: dict = {}  # stage type -> what its prepare() made (outlives workers)
        self._signals: deque = deque()
        self._next_status = 0.0
        self.exporters: dict = {}  # side -> Popen of its Prometheus endpoint
        self.started = time.time()  # (of run(): in its status file)

    def _broker(self, b) -> embedded.EmbeddedBroker:
        name = b.name or b.listen.replace(":", "-")
        options = {}
        if b.kind == "kafka":
            options = {"config": b.config, "data_dir": self.t.resolve(b.data_dir) or
                       os.path.join(self.run_dir, f"broker-{name}")}
        return embedded.make_broker(b.kind, name, b.listen,
                                    os.path.join(self.run_dir, f"broker-{name}.log"), **options)

    # -- signals: handlers only record ---------------------------------------------------------

    def _on_signal(self, signum, frame):
        self._signals.append(signum)

    # -- life cycle ------------------------------------------------------------------------------

    def run(self) -> int:
        """Start everything, watch until SIGTERM/SIGINT (exit 0) or a FATAL worker (exit 1)."""
        # what `diode status` finds the launch by, whoever runs it from wherever: its title
        # names its run directory, where its status file says the rest
        setproctitle.setproctitle(launches.supervisor_title(self.sides, self.t.path,
                                                            self.run_dir))
        self.started = time.time()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        # A signal (a worker's exit: SIGCHLD; a stop, a reload) ends the watch's wait at once
        # (_nap): the watch need not turn often to see them.
        self._wakeup = worker.Wakeup()
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        code = 0
        launches.write_status(self.run_dir, self.status())
        try:
            self.secrets = load_secrets(self.t)
            self.keys.write(self.secrets)
            if "receiver" in self.sides:
                log.info("the receiver accepts %s", self.secrets.describe())
            for side in self.sides:  # a Kafka secret that cannot be read: say so now, once
                client_settings(self.t, side)
            if "sender" in self.sides and (fragmented := link_path.fragmentation(self.t.link)):
                log.warning("%s", fragmented)
            r = self.t.receiver
            if "receiver" in self.sides and r.journal_enabled:
                # another flow's journal and checkpoints: refused before anything starts
                statedir.claim(self.t, self.t.resolve(r.journal_dir), r.reset_state, log)
            embedded.start_all(self.brokers)
            for stage in dict.fromkeys(w.spec.stage for w in self.workers):
                self.inherited[stage] = self.stages[stage].prepare(self.t, log)
            launches.write_status(self.run_dir, self.status())
            for side in self.sides:
                self._start_exporter(side)
            for w in self.workers:
                self._spawn(w)
            log.info("%s running: %d processes, run dir %s", "+".join(self.sides),
                     len(self.workers), self.run_dir)
            code = self._watch()
        finally:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self._wakeup.close()
            self._drain()
            for proc in self.exporters.values():
                proc.terminate()
                proc.wait()
            for resources in self.inherited.values():
                for resource in resources.values():
                    resource.close()
            for b in reversed(self.brokers):
                b.stop()
            if self._own_run_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)
        log.info("stopped (exit %d)", code)
        return code

    def _watch(self) -> int:
        while True:
            while self._signals:
                signum = self._signals.popleft()
                if signum == signal.SIGHUP:
                    self._reload()
                    continue
                log.info("%s: draining", signal.Signals(signum).name)
                return 0
            self._reap()
            self._notice_opened()
            self._check_heartbeats()
            now = time.monotonic()
            for w in self.workers:
                if w.state is State.FATAL:
                    log.error("%s %s: giving up; stopping the launch. Its log lines above say "
                              "more.", w.spec.name, w.message)
                    # (the metrics endpoint serves it while the launch drains: an alert's)
                    launches.write_status(self.run_dir, self.status())
                    return 1
                if w.state in (State.BACKOFF, State.EXITED) and w.restart_at is not None \
                        and now >= w.restart_at:
                    self._spawn(w)  # BACKOFF -> STARTING, EXITED -> STARTING
            finishing = [w for w in self.workers if self.stages[w.spec.stage].FINISHES]
            if finishing and all(w.state is State.EXITED and w.restart_at is None
                                 for w in finishing):
                log.info("%s finished: draining",
                         self.stages[finishing[0].spec.stage].FINISHES)
                return 0
            for b in self.brokers:
                if not b.alive():
                    log.error("embedded %s broker %s exited (its log: %s). Stopping.",
                              b.kind, b.name, b.log_path)
                    return 1
            if now >= self._next_status:
                self._next_status = now + 1.0
                launches.write_status(self.run_dir, self.status())
                for side, proc in list(self.exporters.items()):
                    if proc.poll() is not None:
                        log.warning("the %s metrics endpoint exited (%s): starting it again",
                                    side, proc.returncode)
                        self._start_exporter(side)
            self._nap(now)

    def _nap(self, now: float) -> None:
        """The watch's wait between turns: WATCH_SECONDS, or until the next restart or status
        is due; a signal ends it at once (a worker's exit, a stop, a reload: the wakeup pipe
        made in `run`), which the wait empties."""
        until = min([self._next_status, now + WATCH_SECONDS] +
                    [w.restart_at for w in self.workers
                     if w.restart_at is not None and w.state in (State.BACKOFF, State.EXITED)])
        if until > now and select.select([self._wakeup.fd], [], [], until - now)[0]:
            self._wakeup.clear()

    def _reload(self) -> None:
        """SIGHUP: the receiver's keys from the topology file's `security` section, as it is
        now; a file that is not valid, or keys that cannot be read, change nothing."""
        if "receiver" not in self.sides:
            log.info("SIGHUP: the sender takes a new key when it starts: restart it (a clean "
                     "stop loses nothing); nothing reloaded")
            return
        try:
            security = topo.load(self.t.path).security
            if security.cipher != self.t.security.cipher:
                raise DiodeError(f"security.cipher changed from {self.t.security.cipher} to "
                                 f"{security.cipher}: a restart applies that")
            t = dataclasses.replace(self.t, security=security)
            secrets = load_secrets(t)
        except DiodeError as exc:
            log.error("SIGHUP: keys not reloaded, the receiver still accepts %s: %s",
                      self.secrets.describe(), exc)
            return
        except Exception:  # (whatever else: reported, and the launch goes on as it was)
            log.exception("SIGHUP: keys not reloaded, the receiver still accepts %s",
                          self.secrets.describe())
            return
        self.t, self.secrets = t, secrets
        self.keys.write(secrets)
        told = [w for w in self.workers if w.spec.side == "receiver" and
                w.spec.stage == "unpacker" and w.state in (State.STARTING, State.RUNNING)]
        for w in told:
            _signal(w.pid, signal.SIGHUP)
        log.info("SIGHUP: keys reloaded from %s (only its security section; the rest applies "
                 "at the next start): the receiver accepts %s", self.t.path, secrets.describe())

    def _start_exporter(self, side: str, timeout: float = 10.0) -> None:
        """The side's Prometheus endpoint (metrics.listen), a process of its own serving what
        the workers mirror into run_dir/prometheus/<side>; DiodeError when it cannot listen."""
        listen = getattr(self.t, side).metrics_listen
        if not listen:
            return
        directory = worker.prometheus_dir(self.run_dir, side)
        if side not in self.exporters:  # first start: nothing from an earlier launch
            shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)
        log_path = os.path.join(self.run_dir, f"exporter-{side}.log")
        with open(log_path, "wb") as out:  # (its last line says whether it serves)
            proc = subprocess.Popen(
                [sys.executable, "-m", "diode.runtime.exporter", "--listen", listen, "--dir",
                 directory, "--status", os.path.join(self.run_dir, launches.STATUS_FILE),
                 "--side", side], stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self.exporters[side] = proc
        deadline = time.monotonic() + timeout
        while True:  # until it says it listens (a port taken by another would also accept)
            with open(log_path) as f:
                said = f.read().strip().splitlines()
            if said and said[-1] == f"{exporter.READY} {listen}":
                break
            if proc.poll() is not None:
                raise DiodeError(said[-1] if said else
                                 f"{side}.metrics.listen {listen}: the endpoint exited")
            if time.monotonic() > deadline:
                raise DiodeError(f"{side}.metrics.listen {listen}: not listening within "
                                 f"{timeout:.0f} s")
            time.sleep(0.05)
        log.info("%s metrics: http://%s/metrics", side, listen)

    def status(self) -> dict:
        """What `diode tune --live` (and an operator) reads of this launch: every worker's
        state, pid, CPUs and restarts."""
        keys = self.secrets
        return {"pid": os.getpid(), "topology": os.path.abspath(self.t.path),
                "name": self.t.name, "sides": list(self.sides),
                "run_dir": os.path.abspath(self.run_dir), "started": self.started,
                "keys": None if keys is None or not keys.cipher_id else
                {"current": keys.key_id,
                 "accepted": sorted(keys.keys()) if "receiver" in self.sides else None},
                "workers": [{"name": w.spec.name, "side": w.spec.side, "stage": w.spec.stage,
                             "index": w.spec.index, "state": w.state.value, "pid": w.pid,
                             "cpus": list(w.spec.cpus), "restarts": max(0, w.starts - 1),
                             "message": w.message}
                            for w in self.workers]}

    def _spawn(self, w: Worker) -> None:
        self.heartbeats.begin(w.slot)
        w.starts += 1
        w.killed_for = ""
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            worker.run(w.spec, self.t, self.run_dir, self.keys, self.heartbeats, w.slot,
                       parent, self.inherited, w.starts,
                       self.stages[w.spec.stage])  # never returns
        w.pid = pid
        w.to(State.STARTING, f"pid {pid}")  # STOPPED, BACKOFF or EXITED -> STARTING

    def _notice_opened(self) -> None:
        for w in self.workers:
            if w.state is State.STARTING and self.heartbeats.opened_by(w.slot, w.pid):
                w.failed_starts = 0
                w.message = ""
                w.to(State.RUNNING, f"pid {w.pid}")  # STARTING -> RUNNING

    def _reap(self) -> None:
        # Wait for our workers by pid: waitpid(-1) would also reap the embedded brokers, whose
        # Popen objects must see their own exit status.
        for w in self.workers:
            if not w.pid:
                continue
            try:
                pid, status = os.waitpid(w.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = w.pid, 0
            if pid:
                self._exited(w, os.waitstatus_to_exitcode(status))
                w.pid = 0

    def _exited(self, w: Worker, code: int) -> None:
        if w.state is State.STOPPING:
            w.to(State.STOPPED, f"exit {code}")  # STOPPING -> STOPPED
            return
        self._notice_opened()  # it may have opened since last looked at, and exited since
        if code == 0 and self.stages[w.spec.stage].FINISHES and w.state is State.RUNNING:
            w.restart_at = None
            # RUNNING -> EXITED: its work is done
            w.to(State.EXITED, f"{self.stages[w.spec.stage].FINISHES} finished")
            return
        how = w.killed_for or (f"killed by {signal.Signals(-code).name}" if code < 0 else
                               f"exit code {code}")
        now = time.monotonic()
        w.exits.append(now)
        while w.exits and w.exits[0] < now - self.cfg.restart_window_seconds:
            w.exits.popleft()
        if w.state is State.STARTING:
            self._start_failed(w, how, now)
        else:
            self._crashed(w, how, now)
        self._tell_upstream(w)

    def _start_failed(self, w: Worker, how: str, now: float) -> None:
        """A worker that exited before it was RUNNING: tried again after a wait that grows
        with the failed starts in a row, until there are more than start.retries of them."""
        w.failed_starts += 1
        reason = worker.start_failure(self.run_dir, w.spec)
        detail = f"{reason} ({how})" if reason else how
        w.message = f"failed to start: {detail}"
        w.restart_at = now + w.failed_starts * self.cfg.start_backoff_ms / 1000
        w.to(State.BACKOFF, how)  # STARTING -> BACKOFF
        if w.failed_starts > self.cfg.start_retries:
            w.message = (f"failed to start {w.failed_starts} times in a row (supervisor."
                         f"start.retries {self.cfg.start_retries}), the last: {detail}")
            w.to(State.FATAL, "start retries spent")  # BACKOFF -> FATAL
        elif len(w.exits) > self.cfg.restart_max:
            w.message = self._keeps_dying(w)
            w.to(State.FATAL, "restart budget spent")  # BACKOFF -> FATAL
        else:
            log.warning("%s %s; start %d of %d again in %.1f s", w.spec.name, w.message,
                        w.failed_starts + 1, self.cfg.start_retries + 1, w.restart_at - now)

    def _crashed(self, w: Worker, how: str, now: float) -> None:
        """A RUNNING worker that exited: restarted after restart.backoff.*, until more than
        restart.max exits within restart.window.seconds."""
        w.message = how
        w.to(State.EXITED, how)  # RUNNING -> EXITED
        if len(w.exits) > self.cfg.restart_max:
            w.message = self._keeps_dying(w)
            w.to(State.FATAL, "restart budget spent")  # EXITED -> FATAL
            return
        delay = min(self.cfg.restart_backoff_initial_ms * 2 ** (len(w.exits) - 1),
                    self.cfg.restart_backoff_max_ms) / 1000
        w.restart_at = now + delay
        log.warning("%s %s; restart %d of %d in %.1f s", w.spec.name, how, len(w.exits),
                    self.cfg.restart_max, delay)

    def _keeps_dying(self, w: Worker) -> str:
        return (f"keeps dying ({len(w.exits)} exits within "
                f"{self.cfg.restart_window_seconds:.0f} s, the last: {w.message})")

    def _tell_upstream(self, dead: Worker) -> None:
        """What a dead worker held is lost: stages upstream on its side re-send (SIGUSR1)."""
        order = PIPELINES[dead.spec.side]
        for w in self.workers:
            if (w.spec.side == dead.spec.side and w.state is State.RUNNING
                    and order.index(w.spec.stage) < order.index(dead.spec.stage)):
                _signal(w.pid, signal.SIGUSR1)

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for w in self.workers:
            silent = now - self.heartbeats.last(w.slot)
            if w.state in (State.STARTING, State.RUNNING) and not w.killed_for and \
                    silent > self.cfg.heartbeat_timeout_seconds:
                w.killed_for = (f"no heartbeat for {silent:.0f} s" +
                                (" while starting" if w.state is State.STARTING else ""))
                log.error("%s (pid %d) sent %s: killing it", w.spec.name, w.pid, w.killed_for)
                _signal(w.pid, signal.SIGKILL)  # reaped as an unexpected exit

    def _drain(self) -> None:
        """Stop stage by stage in data-flow order, sender side first, so what is in flight
        reaches the next stage (and the link) before that stage is asked to stop."""
        for side in self.sides:
            for stage in PIPELINES[side]:
                group = [w for w in self.workers
                         if w.spec.side == side and w.spec.stage == stage]
                deadline = time.monotonic() + self.cfg.drain_timeout_seconds
                for w in group:
                    if w.state in (State.STARTING, State.RUNNING):
                        w.to(State.STOPPING, "SIGTERM")  # STARTING or RUNNING -> STOPPING
                        _signal(w.pid, signal.SIGTERM)
                    elif w.state in (State.BACKOFF, State.EXITED):
                        w.to(State.STOPPED, "not started again")  # BACKOFF or EXITED -> STOPPED
                while any(w.state is State.STOPPING for w in group):
                    self._reap()
                    if time.monotonic() > deadline:
                        for w in group:
                            if w.state is State.STOPPING:
                                log.error("%s did not drain within %.0f s: killing it",
                                          w.spec.name, self.cfg.drain_timeout_seconds)
                                _signal(w.pid, signal.SIGKILL)
                        deadline = float("inf")
                    time.sleep(0.02)


def _signal(pid: int, sig) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
