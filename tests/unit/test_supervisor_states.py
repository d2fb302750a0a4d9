"""The supervisor's worker states (supervisord's): the transition table, and what an exit means
in each state, driven without forking (a worker's exit is handed to the supervisor as its code)."""

import os
from itertools import product

import pytest

from diode.runtime import topology, worker
from diode.runtime.supervisor import TRANSITIONS, IllegalTransition, State, Supervisor, Worker
from diode.runtime.wiring import WorkerSpec

S = State
SPEC = WorkerSpec("receiver", "kafka_writer", 0, ())


def worker_in(state: State) -> Worker:
    """A worker put in `state` along legal edges."""
    w = Worker(SPEC, 0)
    path = {S.STOPPED: [], S.STARTING: [S.STARTING], S.RUNNING: [S.STARTING, S.RUNNING],
            S.BACKOFF: [S.STARTING, S.BACKOFF], S.EXITED: [S.STARTING, S.RUNNING, S.EXITED],
            S.STOPPING: [S.STARTING, S.RUNNING, S.STOPPING],
            S.FATAL: [S.STARTING, S.BACKOFF, S.FATAL]}[state]
    for step in path:
        w.to(step)
    return w


@pytest.mark.parametrize("before, after", sorted(product(State, State),
                                                 key=lambda e: (e[0].name, e[1].name)))
def test_only_the_tables_edges_are_allowed(before, after):
    w = worker_in(before)
    if (before, after) in TRANSITIONS:
        w.to(after)
        assert w.state is after
    else:
        with pytest.raises(IllegalTransition, match=f"{before.name} -> {after.name}"):
            w.to(after)
        assert w.state is before


def test_the_table_is_supervisords():
    """STARTING is left for RUNNING or BACKOFF, a RUNNING worker's exit is EXITED, FATAL only
    after BACKOFF or EXITED, and nothing leaves FATAL: the launch stops."""
    assert {b for a, b in TRANSITIONS if a is S.STARTING} == {S.RUNNING, S.BACKOFF, S.STOPPING}
    assert {b for a, b in TRANSITIONS if a is S.RUNNING} == {S.EXITED, S.STOPPING}
    assert {a for a, b in TRANSITIONS if b is S.FATAL} == {S.BACKOFF, S.EXITED}
    assert not [b for a, b in TRANSITIONS if a is S.FATAL]
    assert {a for a, b in TRANSITIONS if b is S.RUNNING} == {S.STARTING}


@pytest.fixture
def supervisor(tmp_path, monkeypatch):
    """A receiver's supervisor that forks nothing: `started(w)` stands for a fork."""
    monkeypatch.setenv("DIODE_PASSWORD", "x")
    t = topology.from_dict({
        "security": {"password.env": "DIODE_PASSWORD", "salt": "pepper"},
        "sender": {"kafka": {"bootstrap.servers": "high:9092"}, "topics": ["orders"]},
        "receiver": {"kafka": {"bootstrap.servers": "low:9092"}},
        "supervisor": {"start.retries": 2, "start.backoff.ms": 1000, "restart.max": 5,
                       "restart.backoff.initial.ms": 200}}, cpu_count=4)
    sup = Supervisor(t, ("receiver",), str(tmp_path))
    return sup


def started(sup: Supervisor, w: Worker) -> None:
    sup.heartbeats.begin(w.slot)
    w.pid = os.getpid()  # (a pid no other worker has: what Heartbeats.opened writes here)
    w.to(S.STARTING)


def writer(sup: Supervisor) -> Worker:
    return next(w for w in sup.workers if w.spec.stage == "kafka_writer")


def test_a_stage_whose_open_fails_backs_off_then_is_fatal_with_its_reason(supervisor):
    w = writer(supervisor)
    delays = []
    for attempt in range(3):
        started(supervisor, w)
        worker._write_start_failure(supervisor.run_dir, w.spec,
                                    "ssl.ca.location failed:\n no such file")
        supervisor._exited(w, 1)
        delays.append(round(w.restart_at - w.exits[-1], 3))
        if attempt < 2:
            assert w.state is S.BACKOFF
            assert w.message == "failed to start: ssl.ca.location failed: no such file " \
                                "(exit code 1)"
    assert delays[:2] == [1.0, 2.0]  # start.backoff.ms times the failed starts in a row
    assert w.state is S.FATAL
    assert w.message == ("failed to start 3 times in a row (supervisor.start.retries 2), the "
                         "last: ssl.ca.location failed: no such file (exit code 1)")


def test_a_start_that_succeeds_forgets_the_failed_ones(supervisor):
    w = writer(supervisor)
    for _ in range(2):
        started(supervisor, w)
        supervisor._exited(w, 1)
    assert (w.state, w.message) == (S.BACKOFF, "failed to start: exit code 1")
    started(supervisor, w)
    supervisor._notice_opened()
    assert w.state is S.STARTING  # it has not opened yet
    supervisor.heartbeats.opened(w.slot)
    supervisor._notice_opened()
    assert (w.state, w.failed_starts, w.message) == (S.RUNNING, 0, "")


def test_a_worker_that_opened_and_then_exits_crashed_it_did_not_fail_to_start(supervisor):
    """Even when it exits before the supervisor has seen it running."""
    w = writer(supervisor)
    started(supervisor, w)
    supervisor.heartbeats.opened(w.slot)
    supervisor._exited(w, -9)
    assert (w.state, w.message, w.failed_starts) == (S.EXITED, "killed by SIGKILL", 0)
    assert round(w.restart_at - w.exits[-1], 3) == 0.2  # restart.backoff.initial.ms


def test_exits_of_either_kind_count_against_the_restart_budget(supervisor):
    w = writer(supervisor)
    for i in range(6):
        started(supervisor, w)
        if i % 2:
            supervisor.heartbeats.opened(w.slot)
            supervisor._notice_opened()
        supervisor._exited(w, 1)
    assert w.state is S.FATAL  # 6 exits within the minute: more than restart.max 5
    assert w.message.startswith("keeps dying (6 exits within 60 s, the last: exit code 1")


def test_a_silent_starting_worker_is_killed_and_that_is_a_failed_start(supervisor):
    w = writer(supervisor)
    started(supervisor, w)
    supervisor.heartbeats.slots[w.slot] -= 60  # its last beat a minute ago: open() hangs
    w.pid = 0  # (nothing to kill here)
    supervisor._check_heartbeats()
    assert w.killed_for == "no heartbeat for 60 s while starting"
    supervisor._exited(w, -9)
    assert (w.state, w.message) == (S.BACKOFF, "failed to start: no heartbeat for 60 s while "
                                               "starting")


def test_a_fatal_worker_is_served_as_fatal_by_the_metrics_endpoint_while_the_launch_drains(
        supervisor):
    """The supervisor's loop gives up on a FATAL worker at once; the status it leaves for the
    drain names that worker fatal, and the side's endpoint serves it as diode_worker_state
    (what the DiodeWorkerFatal alert reads)."""
    from diode.runtime.exporter import STATES, SupervisorCollector
    from diode.runtime.launches import STATUS_FILE
    assert STATES == tuple(s.value for s in State)  # every state has its series
    w = writer(supervisor)
    for _ in range(3):  # start.retries 2: the third failed start is FATAL
        started(supervisor, w)
        supervisor._exited(w, 1)
    w.pid = 0  # (reaped)
    assert supervisor._watch() == 1
    served = {(s.labels["stage"], s.labels["state"]): s.value
              for family in SupervisorCollector(os.path.join(supervisor.run_dir, STATUS_FILE),
                                                "receiver").collect()
              if family.name == "diode_worker_state" for s in family.samples}
    assert served[("kafka_writer", "fatal")] == 1
    assert served[("kafka_writer", "running")] == 0
    assert sum(v for (stage, _), v in served.items() if stage == "kafka_writer") == 1
    assert served[("unpacker", "stopped")] == 1  # (never started here)
