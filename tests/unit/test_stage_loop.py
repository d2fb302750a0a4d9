"""The loop the runtime runs for every stage (diode.runtime.worker.Stage.step, diode.runtime.loop):
a stage declares its inputs, timers and replay request, and the loop hands it typed messages,
keeps its deadlines, asks for the replay, and stops it the way the supervisor's drain expects."""

import signal
import socket
import tempfile
import time

import pytest
import zmq

from diode.runtime import messages, transport
from diode.runtime.loop import Timer, Timers
from diode.runtime.metrics import Metrics
from diode.runtime.topology import from_dict
from diode.runtime.wiring import WorkerSpec
from diode.runtime.worker import Secrets, Stage, StageContext, Wakeup
from tests.conftest import free_port


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def context(zctx, incarnation=1, wakeup=None):
    t = from_dict({
        "link": {"port": free_port(socket.SOCK_DGRAM), "bind.address": "127.0.0.1"},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
        "receiver": {"kafka": {"bootstrap.servers": "x:1"},
                     "journal.dir": tempfile.mkdtemp(prefix="diode-test-journal-")},
    })
    return StageContext(t, WorkerSpec("receiver", "unpacker", 0, ()), "inproc", Secrets(0, None),
                        zctx, Metrics({"stage": "unpacker"}), incarnation, wakeup=wakeup)


class Recorder(Stage):
    """A stage that only says what the loop made it do."""

    def open(self):
        self.did = []
        self.sock = transport.pull(self.ctx.zmq, "inproc://loop-test-in", 100)
        self.listen(self.sock, {messages.Mark: self._mark, messages.Notice: self._notice},
                    messages.from_udp_reader, limit=2)
        self.every(10.0, lambda now: self.did.append("timer"))
        self.hold = False

    def _mark(self, m, frames):
        self.did.append(("mark", m.position))

    def _notice(self, m, frames):
        self.did.append(("notice", m.started))

    def before_input(self, now):
        self.did.append("before")
        return None if self.hold else 0

    def after_input(self, now):
        self.did.append("after")
        return True

    def finish(self, now):
        self.did.append(("finish", round(self.finish_by - now)))
        return False


def opened(zctx, cls=Recorder, wakeup=None):
    s = cls(context(zctx, wakeup=wakeup))
    s.open()
    return s, transport.push(zctx, ["inproc://loop-test-in"], 100)


def test_a_turn_runs_the_timers_then_hands_each_message_to_the_handler_of_its_kind(zctx):
    s, feed = opened(zctx)
    for frame in (messages.Mark(5, 1.0).encode(), messages.Notice(2.0).encode(),
                  messages.Mark(6, 1.0).encode()):
        feed.send(frame)
    time.sleep(0.05)
    assert s.step()
    # the timer first, then at most `limit` (2) messages a turn, in the order they came
    assert s.did == ["timer", "before", ("mark", 5), ("notice", 2.0), "after"]
    s.did.clear()
    assert s.step()
    assert s.did == ["before", ("mark", 6), "after"]  # the timer is not due again for 10 s


def test_a_stage_held_back_takes_no_input(zctx):
    s, feed = opened(zctx)
    s.hold = True
    feed.send(messages.Mark(5, 1.0).encode())
    time.sleep(0.05)
    assert s.step()
    assert ("mark", 5) not in s.did and "after" not in s.did
    s.hold = False
    s.step()
    assert ("mark", 5) in s.did  # left in the socket, not lost


def test_a_stopping_stage_takes_what_still_comes_then_finishes_within_its_drain_budget(zctx):
    s, feed = opened(zctx)
    s.stop()
    feed.send(messages.Mark(7, 1.0).encode())
    time.sleep(0.05)
    assert s.step()
    assert ("mark", 7) in s.did  # what the stage before it handed on while stopping
    deadline = time.monotonic() + 5
    while s.step():
        assert time.monotonic() < deadline
    budget = s.t.supervisor.drain_timeout_seconds * Stage.DRAIN_SHARE
    assert s.did[-1] == ("finish", round(budget))


def test_a_head_stage_takes_nothing_once_stopping(zctx):
    class Head(Recorder):
        TAKES_INPUT_WHILE_STOPPING = False

    s, feed = opened(zctx, Head)
    feed.send(messages.Mark(8, 1.0).encode())
    time.sleep(0.05)
    s.stop()
    assert not s.step()
    assert ("mark", 8) not in s.did and s.did[-1][0] == "finish"


def test_timers_keep_their_period_from_the_turn_that_ran_them():
    ran = []
    timers = Timers()
    period = timers.add(Timer(1.0, lambda now: ran.append(("period", now)), 0.0))
    later = timers.add(Timer(5.0, lambda now: ran.append(("later", now)), 10.0))
    timers.run(100.0)
    timers.run(100.5)
    timers.run(101.2)  # a slow turn: the next run is a period after it, never two at once
    assert ran == [("period", 100.0), ("later", 100.0), ("period", 101.2)]
    assert period.due == pytest.approx(102.2)
    later.at(101.5)  # moved sooner
    timers.run(101.5)
    assert ran[-1] == ("later", 101.5) and later.due == pytest.approx(106.5)


def test_a_restarted_stage_asks_for_its_replay_again_until_answered(zctx):
    class Replaying(Recorder):
        def open(self):
            super().open()
            self.replays()

    asks = transport.pull(zctx, "inproc://receiver-udp_reader-0.control", 100)
    s = Replaying(context(zctx, incarnation=2))
    s.open()
    assert asks.poll(2000)
    first = messages.ReplayAsk.decode(asks.recv())
    s.replay_request.ask_again = 0.0  # (a second has passed)
    s.step()
    assert asks.poll(2000), "not asked again"
    again = messages.ReplayAsk.decode(asks.recv())
    assert again.who == first.who and again.started >= first.started
    s.replay_request.noticed(time.monotonic())  # a replay begun after it started answers it
    s.replay_request.ask_again = 0.0
    s.step()
    assert not asks.poll(50)


class Idle(Recorder):
    """Waits for input as long as an idle stage may, and longer."""

    def before_input(self, now):
        self.did.append("before")
        return 30_000


def test_a_signal_ends_an_idle_wait_for_input_at_once(zctx):
    """An idle stage waits long for input (Stage.IDLE_WAIT_MS): a signal (the supervisor's
    SIGTERM, SIGUSR1, SIGHUP) must end the wait, through the worker's Wakeup pipe, so the
    worker acts on it at once, not at the end of the wait."""
    got = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    wakeup = Wakeup()
    try:
        s, _ = opened(zctx, Idle, wakeup.fd)
        s.metrics.interval = 3600.0  # (a wait ends when the metrics are due, too: not here)
        s.metrics.maybe_write()
        signal.raise_signal(signal.SIGUSR1)
        began = time.monotonic()
        assert s.step()
        assert got == [signal.SIGUSR1] and time.monotonic() - began < 10  # (not 30 s)
        wakeup.clear()
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGUSR1, before)
