"""The worker side of a fork: boot one stage, run its loop, exit.

The supervisor calls `run` in the child right after os.fork(); it never returns (os._exit), so no
supervisor state or atexit handler runs twice. Signal handlers only record the signal; the loop
acts on it.

What happens on SIGTERM. An operator's SIGTERM or Ctrl-C goes to the supervisor
(diode.runtime.supervisor), which drains the pipeline stage by stage in data-flow order, the
sender's side first: it sends SIGTERM to every worker of the first stage and waits for them to exit
before it signals the next stage, so what is in flight reaches the next stage (and the link) before
that stage is asked to stop. A worker ignores SIGINT (Ctrl-C reaches the whole process group; the
supervisor orders the stop). In the worker, SIGTERM only sets a flag; the loop below calls the
stage's `stop()` before its next turn (Stage.step), and the turns go on while it drains: a stage
fed by another takes what is still coming until its input has been quiet for Stage.QUIET_SECONDS
(`drained`), a head stage (the kafka_reader, the udp_reader) takes nothing more; then each turn is
a step of the stage's `finish()`, which hands on or writes what it holds and waits for
acknowledgements a step at a time, for at most its `drain_budget()` (three quarters of
supervisor.drain.timeout.seconds: the kafka_reader for what is in flight to be sent, the
kafka_writer for the destination, which then records its last checkpoint), and returns
False once done, and so does `step()`. The loop then calls `close()`, writes the metrics a last time and exits 0. A
worker still running after supervisor.drain.timeout.seconds is killed (SIGKILL, logged): what it
held is replayed from the journal at the next start (the receiver's side) or read again from the
source (the sender's: its offsets are committed only for what was sent). A worker whose supervisor
dies, however it dies, gets SIGTERM itself (PR_SET_PDEATHSIG, diode.runtime.parent) and drains the
same way.
"""

import ctypes
import faulthandler
import gc
import importlib
import logging
import math
import mmap
import os
import signal
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field

import psutil
import setproctitle
import zmq

from diode.errors import DiodeError
from diode.runtime.loop import Input, Inputs, Timer, Timers
from diode.runtime.metrics import Metrics
from diode.runtime.replays import ReplayRequest
from diode.runtime.parent import die_with_parent
from diode.runtime.topology import Topology
from diode.runtime import wiring
from diode.runtime.wiring import WorkerSpec

log = logging.getLogger("diode.runtime.worker")

# Python's cyclic garbage collector, left to itself, was 13-16 % of a kafka_writer's and a
# kafka_reader's CPU (py-spy --native), and still 16 % of the writer's with a young-generation
# threshold of 100 000: every record's header list and produce call allocates containers, and
# collections keep walking the ones alive in the writer's backlog. Reference counting frees the
# data path's objects; the collector only has cycles to find, and finds them on a clock instead:
# the young generation every second, everything every GC_FULL_SECONDS.
GC_FULL_SECONDS = 60.0
SLOW_STEP_SECONDS = 1.0      # a step this long breaks the stage contract: logged
SLOW_STEP_LOG_SECONDS = 60.0  # at most once this often (with how many since, and the longest)


@dataclass
class Secrets:
    """Key material, loaded once by the supervisor and inherited by the children: the current
    master key (the sender seals with it) and, during a rotation, the next one (the receiver
    accepts both)."""

    cipher_id: int
    master_key: bytes | None
    key_id: int = 0
    next_key: bytes | None = None
    next_key_id: int = 1

    def keys(self) -> dict:
        keys = {self.key_id: self.master_key}
        if self.next_key is not None:
            keys[self.next_key_id] = self.next_key
        return keys

    def describe(self) -> str:
        """The key ids, never a key: what a log line may say."""
        if not self.cipher_id:
            return "no key (cipher none)"
        if self.next_key is None:
            return f"key id {self.key_id}"
        return f"key ids {self.key_id} (current) and {self.next_key_id} (next)"


class KeySlot:
    """The supervisor's Secrets as its workers can read them after a reload (SIGHUP): a shared
    anonymous mmap made before forking, as Heartbeats. The supervisor writes (one writer);
    a worker reads it when the supervisor signals it. A generation count, odd while a write
    is under way and read before and after, makes a reader never take half of a write."""

    LAYOUT = struct.Struct("=QBBBB32s32s")  # generation, cipher, key id, has next, next id, keys

    def __init__(self, secrets: Secrets | None = None):
        self.mem = mmap.mmap(-1, self.LAYOUT.size)
        self.generation = 0
        if secrets is not None:
            self.write(secrets)

    def write(self, s: Secrets) -> None:
        self.generation += 1  # odd: a write under way
        self.mem[:8] = struct.pack("=Q", self.generation)
        self.mem[8:] = self.LAYOUT.pack(0, s.cipher_id, s.key_id, s.next_key is not None,
                                        s.next_key_id, s.master_key or b"",
                                        s.next_key or b"")[8:]
        self.generation += 1
        self.mem[:8] = struct.pack("=Q", self.generation)

    def read(self) -> Secrets:
        while True:
            before = struct.unpack_from("=Q", self.mem)[0]
            _, cipher_id, key_id, has_next, next_id, master, following = \
                self.LAYOUT.unpack(self.mem[:])
            if before % 2 == 0 and struct.unpack_from("=Q", self.mem)[0] == before:
                return Secrets(cipher_id, master if cipher_id else None, key_id,
                               following if has_next else None, next_id)
            time.sleep(0.001)


@dataclass
class StageContext:
    """Everything a stage needs; nothing live crosses the fork."""

    topology: Topology
    spec: WorkerSpec
    run_dir: str
    secrets: Secrets
    zmq: zmq.Context
    metrics: Metrics
    incarnation: int = 1  # how many times the supervisor has started this worker
    # what the stage's `prepare` made in the supervisor (a socket)
    inherited: dict = field(default_factory=dict)
    # a file descriptor readable once a signal came (Wakeup.fd): a stage's waits for input
    # end on it, so a stop, a rewind or a reload is acted on at once however long they are
    wakeup: int | None = None

    @property
    def hwm(self) -> int:
        return self.topology.supervisor.queue_max_messages

    def bound(self, purpose: str = "in") -> str:
        """The endpoint this worker binds for `purpose` (diode.runtime.wiring)."""
        return wiring.bound(self.run_dir, self.spec, purpose)

    def peers(self, name: str) -> list[str]:
        """The endpoints of every instance this worker's `name` queue reaches."""
        return wiring.peers(self.topology, self.run_dir, self.spec, name)

    def instances(self, stage: str) -> int:
        return self.topology.stage(self.spec.side, stage).instances


class Stage:
    """The stage contract (after Kafka Connect's SourceTask and bytewax's operators): a stage is
    what it does to a message and at its deadlines; the loop is the runtime's (`step`).

    - __init__ stores settings only; `open()` makes sockets and clients, in the child, and
      declares what the loop is to do for it: its inputs (`listen`: a socket, how its messages
      decode, who handles each kind), its timers (`every`), and, for a stage that loses what
      it held when it restarts, its replay request (`replays`: diode.runtime.replays);
    - the hooks `step` calls, each defaulting to nothing: `before_input(now)`, `poll_input`
      and `take_input` (the declared inputs; a stage with another kind of input, a UDP socket,
      a Kafka consumer, or one that takes its frames without copying them, overrides them),
      `idle()`, `after_input(now)`, `finish(now)`;
    - `stop()` only asks; `rewind()` is called when a worker downstream died (SIGUSR1);
      `reload()` when the supervisor has reloaded the keys (SIGHUP: ctx.secrets holds them);
    - `close()` releases what `open()` made;
    - `prepare(topology, log)`, a classmethod, runs in the supervisor before any fork and
      returns what must outlive a worker of the stage (the receiver's UDP socket): it reaches
      every incarnation as `ctx.inherited`.

    No hook blocks for more than ~100 ms: the worker beats its heartbeat between turns.
    """

    # Stages stop in data-flow order, so once a stopping stage's input has been quiet this
    # long, nothing more is coming.
    QUIET_SECONDS = 0.3
    # The share of supervisor.drain.timeout.seconds a stopping stage may spend waiting for what
    # it handed on (acknowledgements, a flush): the rest is for close() and the exit, before the
    # supervisor kills it.
    DRAIN_SHARE = 0.75
    # The work of a stage whose work ends, for the log ("resend": stages.kafka_resender); empty
    # for the others. Its `after_input` returns False once done and the worker exits 0; the
    # supervisor does not restart it, and drains the launch once every worker of the stage is
    # done.
    FINISHES = ""
    # A stage fed by another stage takes its input after stop() until it has been quiet for
    # QUIET_SECONDS (what the stage before it handed on while stopping still comes); a head
    # stage, whose input is the outside world (the source cluster, the link), takes none after
    # stop() and goes straight to `finish`.
    TAKES_INPUT_WHILE_STOPPING = True
    POLL_MS = 50  # the longest a turn waits for input (before_input's default)
    # The longest a turn of a stage with nothing to do (nothing held, no timer with work)
    # waits for input: its heartbeat to the supervisor and its metrics (about once a second:
    # the wait ends when they are due) come between turns, and a signal ends it at once
    # (Wakeup), so a stop, rewind or reload is not delayed.
    IDLE_WAIT_MS = 1000

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.t = ctx.topology
        self.metrics = ctx.metrics
        self.log = logging.getLogger(f"diode.{ctx.spec.name}")
        self.stopping = False
        self.finish_by = None  # stopping: when its drain_budget() is spent (set by `step`)
        self.replay_request = None
        self.inputs = Inputs(ctx.wakeup)
        self.timers = Timers()
        self._ready: list = []  # the declared inputs poll_input found ready, for take_input
        self._quiet_since = None
        self._outboxes: list = []

    # -- what a stage declares in open() -----------------------------------------------------

    def listen(self, sock, handle, decode=None, limit: int = 16) -> Input:
        """Declare an input: the loop polls `sock`, takes at most `limit` messages a turn,
        decodes each one's first frame with `decode` (a message class's `decode`, or a function
        choosing among kinds, diode.runtime.messages; None: the frames as they came) and calls
        `handle(message, frames)`, or with a dict of handlers, the one for the message's type."""
        return self.inputs.add(Input(sock, handle, decode, limit))

    def every(self, seconds: float, fn, first: float | None = None) -> Timer:
        """Declare a timer: `fn(now)` at the first turn at or after `first` (default: the
        first turn), then every `seconds` (diode.runtime.loop.Timer)."""
        return self.timers.add(Timer(seconds, fn, 0.0 if first is None else first))

    def replays(self, streams: int = 1) -> ReplayRequest:
        """Declare that this stage loses what it holds when it restarts, and so asks the
        udp_reader to replay its journal after a restart, over `streams` input streams (each
        with its own notices and marks); the loop asks again until answered. The stage tells
        the request what it hears (`noticed`) and asks it which marks to trust (`trusts`)."""
        self.replay_request = ReplayRequest(self.ctx, streams)
        return self.replay_request

    # -- the loop: the runtime's, the same for every stage -----------------------------------

    def step(self) -> bool:
        """One turn of the loop (the worker calls it until it returns False):

        1. the timers that are due (`every`), the replay request asked again if it is time;
        2. `before_input(now)`, what comes first at every turn; it returns how long input may
           be waited for (ms), or None to take none this turn (what the stage hands on to is
           behind; it has waited a moment for it itself);
        3. a head stage that is stopping (TAKES_INPUT_WHILE_STOPPING False) finishes;
        4. the input: `poll_input(wait)`, then `take_input()`;
           a stopping stage whose input has been quiet for QUIET_SECONDS while `idle()`
           finishes instead;
        5. `after_input(now)`: what the turn's input leaves to do; False once the stage's work
           is done (FINISHES).

        Finishing is `finish(now)`, one step of it per turn, with `finish_by` set at the first
        (its drain_budget() from then): False once done."""
        now = time.monotonic()
        self.timers.run(now)
        if self.replay_request is not None:
            self.replay_request.tick(now)
        wait = self.before_input(now)
        if self.stopping and not self.TAKES_INPUT_WHILE_STOPPING:
            return self._finish(now)
        if wait is None:
            return True
        if self.stopping:  # (its input is watched for QUIET_SECONDS of quiet: turns go on)
            wait = min(wait, Stage.POLL_MS)
        elif wait > Stage.POLL_MS:  # (a long idle wait ends when the metrics are due)
            due = math.ceil(self.metrics.due_in(now) * 1000)
            if 0 < due < wait:
                wait = due
        got = self.poll_input(wait)
        if self.drained(idle=not got and self.idle()):
            return self._finish(now)
        if got:
            self.take_input()
        return self.after_input(now)

    def _finish(self, now: float) -> bool:
        if self.finish_by is None:
            self.finish_by = now + self.drain_budget()
        return self.finish(now)

    def before_input(self, now: float) -> int | None:
        """At every turn, before input: how long input may be waited for (ms), or None to take
        none this turn."""
        return self.POLL_MS

    def poll_input(self, wait_ms: int):
        """Wait up to `wait_ms` for input; what `take_input` needs to take it (true if any).
        A stage with no input declared (and no override) waits out the time."""
        if not self.inputs:
            time.sleep(wait_ms / 1000)
            return []
        self._ready = self.inputs.poll(wait_ms)
        return self._ready

    def take_input(self) -> None:
        """Take what `poll_input` found: each ready declared input's messages, decoded and
        handed to their handlers."""
        self.inputs.take(self._ready)

    def idle(self) -> bool:
        """Whether the stage holds nothing it would still hand on by itself (a stopping stage
        finishes only once its input is quiet and it is idle)."""
        return True

    def after_input(self, now: float) -> bool:
        """After the turn's input; False when the stage's work is done (FINISHES)."""
        return True

    def finish(self, now: float) -> bool:
        """Stopping, and nothing more is coming: one step of handing on what is held, waiting
        for it to be acknowledged until `finish_by`; False once done."""
        return False

    def outbox(self, sock, limit: int = 4):
        """A transport.Outbox whose backpressure the stage's metrics report
        (output_blocked_seconds: `diode tune --live` reads it)."""
        from diode.runtime.transport import Outbox
        box = Outbox(sock, limit)
        self._outboxes.append(box)
        return box

    def sample_metrics(self) -> None:
        """About once a second, before the metrics are written: gauges that cost a look to read.
        A stage that overrides it calls this too."""
        if self._outboxes:
            self.metrics.set("output_blocked_seconds",
                             round(sum(b.blocked_seconds for b in self._outboxes), 3))
            self.metrics.set("output_queue_messages", sum(len(b) for b in self._outboxes))

    @classmethod
    def prepare(cls, topology, log) -> dict:
        return {}

    def open(self) -> None:
        pass

    def stop(self) -> None:
        self.stopping = True

    def rewind(self) -> None:
        pass

    def reload(self) -> None:
        pass

    def drain_budget(self) -> float:
        """Seconds a stopping stage may wait for what it handed on, from when it starts to
        (DRAIN_SHARE of supervisor.drain.timeout.seconds)."""
        return self.t.supervisor.drain_timeout_seconds * self.DRAIN_SHARE

    def drained(self, idle: bool) -> bool:
        """The loop's question at each turn (`step`), given whether the input was quiet and the
        stage idle: True when the stage is stopping and that has held for QUIET_SECONDS."""
        if not idle or not self.stopping:
            self._quiet_since = None
            return False
        now = time.monotonic()
        self._quiet_since = self._quiet_since or now
        return now - self._quiet_since >= self.QUIET_SECONDS

    def close(self) -> None:
        pass


class Heartbeats:
    """A shared anonymous mmap made before forking: slot i holds worker i's last beat
    (CLOCK_MONOTONIC is the same clock in every process) and the pid of the worker that has
    opened its stage there (the supervisor's STARTING -> RUNNING). Values are aligned 8-byte C
    numbers, written and read in one access, so a reader never sees half a value."""

    def __init__(self, slots: int):
        n = max(slots, 1)
        self.mem = mmap.mmap(-1, 16 * n)
        self.slots = (ctypes.c_double * n).from_buffer(self.mem)
        self.opened_pids = (ctypes.c_int64 * n).from_buffer(self.mem, 8 * n)

    def begin(self, slot: int) -> None:
        """A worker is forked into `slot`: its clock starts now, and it has opened nothing."""
        self.opened_pids[slot] = 0
        self.beat(slot)

    def beat(self, slot: int) -> None:
        self.slots[slot] = time.monotonic()

    def last(self, slot: int) -> float:
        return self.slots[slot]

    def opened(self, slot: int) -> None:
        """In the worker, once its stage's open() has returned: its first heartbeat."""
        self.beat(slot)
        self.opened_pids[slot] = os.getpid()

    def opened_by(self, slot: int, pid: int) -> bool:
        return pid != 0 and self.opened_pids[slot] == pid


class Wakeup:
    """A pipe the kernel's side of Python's signal handling writes to when a signal with a
    handler comes (signal.set_wakeup_fd): its read end, polled with a stage's input, ends a
    wait for input at once, so a stage may wait long while idle and still stop, rewind or
    reload as soon as asked. `clear` empties it once the flags the handlers set are read."""

    def __init__(self):
        self.fd, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def clear(self) -> None:
        try:
            while os.read(self.fd, 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """No more wake-ups (the supervisor's, as its watch ends)."""
        signal.set_wakeup_fd(-1)
        os.close(self.fd)
        os.close(self._write)


def stage_class(stage_type: str):
    """The class that runs a stage type of the topology: stages.<type>.Stage."""
    return importlib.import_module(f"stages.{stage_type}").Stage


def run(spec: WorkerSpec, topology: Topology, run_dir: str, keys: KeySlot,
        heartbeats: Heartbeats, slot: int, parent_pid: int, inherited: dict,
        incarnation: int = 1, cls: type | None = None) -> None:
    """Child process entry point. Never returns. `inherited`: per stage type, what its
    `prepare` made; this worker keeps its own stage's and closes the rest. `keys`: where the
    supervisor puts its keys, read at start and again on SIGHUP. `cls`: the Stage class to
    run (default: stage_class(spec.stage))."""
    code = 1
    try:
        mine = {}
        for stage, resources in inherited.items():
            for name, resource in resources.items():
                if stage == spec.stage:
                    mine[name] = resource
                else:
                    resource.close()
        code = _run(spec, topology, run_dir, keys, heartbeats, slot, parent_pid, mine,
                    incarnation, cls or stage_class(spec.stage))
    except BaseException as exc:
        known = isinstance(exc, DiodeError)  # a condition we explain, not a bug: no traceback
        # (a traceback for anything else)
        said = str(exc) if known else "\n" + traceback.format_exc()
        log = logging.getLogger(f"diode.{spec.name}")
        if heartbeats.opened_by(slot, os.getpid()):
            log.error("%s" if known else "crashed:%s", said)
        else:  # before its stage was open: the supervisor names the reason (start_failure)
            _write_start_failure(run_dir, spec, str(exc) if known else
                                 f"{type(exc).__name__}: {exc}")
            log.error("failed to start: %s" if known else "failed to start:%s", said)
    finally:
        logging.shutdown()
        os._exit(code)


def _start_failure_path(run_dir: str, spec: WorkerSpec) -> str:
    return os.path.join(run_dir, "start-failures", f"{spec.side}-{spec.stage}-{spec.index}")


def _write_start_failure(run_dir: str, spec: WorkerSpec, reason: str) -> None:
    try:
        os.makedirs(os.path.dirname(_start_failure_path(run_dir, spec)), exist_ok=True)
        with open(_start_failure_path(run_dir, spec), "w") as f:
            f.write(" ".join(reason.split()))  # one line
    except OSError:
        pass  # the supervisor names the exit code instead


def start_failure(run_dir: str, spec: WorkerSpec) -> str:
    """In the supervisor, after a worker exited before it had opened its stage: the one-line
    reason it gave (and forget it), or "" when it gave none."""
    try:
        with open(_start_failure_path(run_dir, spec)) as f:
            reason = f.read().strip()
        os.unlink(_start_failure_path(run_dir, spec))
    except OSError:
        return ""
    return reason


def _run(spec, topology, run_dir, keys, heartbeats, slot, parent_pid, inherited,
         incarnation, cls) -> int:
    # (woken: a signal wrote to the Wakeup pipe, emptied by the loop before it acts)
    flags = {"stop": False, "rewind": False, "reload": False, "woken": False}

    def on_stop(signum, frame):
        flags["stop"] = flags["woken"] = True

    def on_rewind(signum, frame):
        flags["rewind"] = flags["woken"] = True

    def on_reload(signum, frame):
        flags["reload"] = flags["woken"] = True

    signal.signal(signal.SIGTERM, on_stop)
    # A crash in a C extension (librdkafka, zfec) leaves its Python stacks in the log.
    faulthandler.enable(all_threads=True)
    # Ctrl-C reaches the whole process group; the supervisor drains the stages in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, on_rewind)
    signal.signal(signal.SIGHUP, on_reload)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    wakeup = Wakeup()
    die_with_parent()
    if os.getppid() != parent_pid:
        return 1  # the supervisor died before we could ask to follow it
    setproctitle.setproctitle(f"diode: {spec.name}")
    if spec.cpus:
        psutil.Process().cpu_affinity(list(spec.cpus))
    heartbeats.beat(slot)

    exported = getattr(topology, spec.side).metrics_listen
    metrics = Metrics({"side": spec.side, "stage": spec.stage, "index": spec.index},
                      f"{run_dir}/metrics/{spec.side}-{spec.stage}-{spec.index}.prom"
                      if topology.supervisor.metrics_textfile else None,
                      prometheus_dir=prometheus_dir(run_dir, spec.side) if exported else None)
    ctx = zmq.Context()
    context = StageContext(topology, spec, run_dir, keys.read(), ctx, metrics, incarnation,
                           inherited, wakeup.fd)
    stage = cls(context)
    proc = psutil.Process()
    try:
        stage.open()  # on failure the process exits: what it opened goes with it
    except BaseException:
        ctx.destroy(linger=0)
        raise
    heartbeats.opened(slot)  # the supervisor's STARTING -> RUNNING
    # What exists now (modules, clients, the topology) lives as long as the worker: the
    # collector never needs to walk it again; and it runs on a clock (GC_FULL_SECONDS).
    gc.collect()
    gc.freeze()
    gc.disable()
    next_full_gc = time.monotonic() + GC_FULL_SECONDS
    steps = metrics.histogram("step_seconds")
    slow = SlowSteps(spec, topology.supervisor.heartbeat_timeout_seconds)
    try:
        while True:
            if flags["woken"]:
                flags["woken"] = False
                wakeup.clear()
            if flags["stop"] and not stage.stopping:
                stage.stop()
            if flags["rewind"]:
                flags["rewind"] = False
                stage.rewind()
            if flags["reload"]:
                flags["reload"] = False
                context.secrets = keys.read()
                stage.reload()
            began = time.monotonic()
            if not stage.step():
                break
            took = time.monotonic() - began
            heartbeats.beat(slot)
            steps.observe(took)
            if took > SLOW_STEP_SECONDS:
                slow.saw(took)
            if metrics.due():  # about once a second
                metrics.set("cpu_seconds", sum(proc.cpu_times()[:2]))
                stage.sample_metrics()
                metrics.maybe_write()
                now = time.monotonic()
                if now >= next_full_gc:
                    gc.collect()
                    next_full_gc = now + GC_FULL_SECONDS
                else:
                    gc.collect(0)
    finally:
        stage.close()
        metrics.maybe_write(force=True)
        ctx.destroy(linger=0)
    return 0


class SlowSteps:
    """Steps that broke the stage contract, logged at most once per SLOW_STEP_LOG_SECONDS:
    the first at once, then how many there were since and the longest."""

    def __init__(self, spec: WorkerSpec, timeout: float):
        self.log = logging.getLogger(f"diode.{spec.name}")
        self.spec, self.timeout = spec, timeout
        self.count, self.longest, self.next_log = 0, 0.0, 0.0

    def saw(self, took: float) -> None:
        self.count += 1
        self.longest = max(self.longest, took)
        now = time.monotonic()
        if now < self.next_log:
            return
        self.log.warning("%s: %d step(s) of the %s stage's loop took more than %.0f s (the "
                         "longest %.1f s) since the last warning; a step should never block "
                         "for more than ~0.1 s, and the supervisor kills a worker silent for "
                         "%.0f s: a call in the stage waits on something (a cluster, a disk)",
                         self.spec.name, self.count, self.spec.stage, SLOW_STEP_SECONDS,
                         self.longest, self.timeout)
        self.count, self.longest = 0, 0.0
        self.next_log = now + SLOW_STEP_LOG_SECONDS


def prometheus_dir(run_dir: str, side: str) -> str:
    """Where a side's workers mirror their metrics for its exporter (diode.runtime.exporter)."""
    return os.path.join(run_dir, "prometheus", side)


def configure_logging(level=logging.INFO) -> None:
    logging.basicConfig(
        level=level, stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s[%(process)d] %(message)s")
