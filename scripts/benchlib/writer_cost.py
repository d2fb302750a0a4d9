"""--mode writer [--partitions N] [--busy B]: what a kafka_writer costs per partition it holds,
at N source partitions (1 000 and 10 000 when not given), most of them idle: a writer stage
made in this process (no broker: its clients are never used), its `sources` filled with
PartitionStates written up to an offset and nothing waiting, B of them (--busy) with a run
waiting for its predecessor; then, in CPU time (time.process_time) per call:

- expire: the timer's pass over what waits (stages.kafka_writer, every EXPIRE_SECONDS);
- idle turn: a turn of the loop (Stage.step) with no input, its timers included;
- metrics: sample_metrics, once a second (the source's lag by topic from the reader's last look
  at every partition included: diode.writer.source_view);
- checkpoint: the states taken and the checkpoint file written (diode.writer.recovery).

Printed as a markdown table (a few seconds; no broker, no launch). Not a test: a figure,
compared before and after a change in the same window."""

import socket
import sys
import tempfile
import time

import zmq

from diode.accounting.ordering import PartitionState, SourcePartition
from diode.link import crypto
from diode.link.records import Record
from diode.link.runs import Run, from_records
from diode.runtime.messages import Mark
from diode.runtime.metrics import Metrics
from diode.runtime.topology import from_dict
from diode.runtime.wiring import WorkerSpec
from diode.runtime.worker import Secrets, StageContext, stage_class
from diode.writer.source_view import SourceLook

from .resources import log

DEFAULT_PARTITIONS = (1000, 10000)  # --mode writer without --partitions


def writer(zctx):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = from_dict({
        "link": {"port": port, "bind.address": "127.0.0.1"},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
        "receiver": {"kafka": {"bootstrap.servers": "x:1"},
                     "journal.dir": tempfile.mkdtemp(prefix="diode-writer-partitions-"),
                     "stages": {"unpacker": {"instances": 1},
                                "kafka_writer": {"instances": 1}}}})
    spec = WorkerSpec("receiver", "kafka_writer", 0, ())
    ctx = StageContext(t, spec, "inproc", Secrets(1, crypto.master_key_from_password(b"pw",
                                                                                     b"salt")),
                       zctx, Metrics({"stage": "kafka_writer"}))
    w = stage_class("kafka_writer")(ctx)
    w.open()
    return w


def waiting_run(partition: int) -> Run:
    """A run of t[partition] at offset 1002 whose predecessor (1001) has not come."""
    rec = Record("t", partition, 1002, 0, 1, b"k", b"v", (), 1001)
    return Run.decode(from_records([rec], 1))


def fill(w, partitions: int, busy: int) -> None:
    wait = w.r.reorder_wait_ms / 1000
    for p in range(partitions):
        state = PartitionState(wait, frontier=1000)
        w.sources[("t", p)] = source = SourcePartition()
        source.current = state
        w.recovery.recovered.add(("t", p, state.incarnation))
        w.view.source_state[("t", p)] = SourceLook(state.incarnation, 0, 1001, 0)
        if p < busy:
            run = waiting_run(p)
            run.origin = (1, 0.0, False)
            w._offer(run)
    w.marks = [Mark(1, 0.0)]  # (the reader's clock at 0: what waits stays waiting)


def per_call(fn, seconds: float = 1.0) -> float:
    """CPU seconds per call of fn, over about `seconds` of CPU time."""
    n, start = 0, time.process_time()
    while True:
        fn()
        n += 1
        spent = time.process_time() - start
        if spent >= seconds:
            return spent / n


def measure(partitions: int, busy: int) -> dict:
    zctx = zmq.Context()
    w = writer(zctx)
    try:
        fill(w, partitions, busy)
        w.recovery.next_checkpoint = float("inf")  # (taken by hand below)
        w.step()
        now = time.monotonic()

        def checkpoint():
            w.recovery.checkpoint(now, w.marks, w.heard, lambda wait: None)

        return {"expire": per_call(lambda: w._expire_waiting(now)),
                "idle turn": per_call(w.step),
                "metrics": per_call(w.sample_metrics),
                "checkpoint": per_call(checkpoint, 3.0)}
    finally:
        w.close()
        zctx.destroy(linger=0)


def run(b) -> dict:
    """Per partition count asked: each call's CPU time; the table printed, the figures
    returned for the JSON line."""
    args = b.args
    counts = [args.partitions] if args.partitions else list(DEFAULT_PARTITIONS)
    rows = []
    for n in counts:
        log(f"writer: {n} partitions, {args.busy} with a run waiting")
        rows.append({"partitions": n, "busy": args.busy,
                     "ms": {k: v * 1e3 for k, v in measure(n, args.busy).items()}})
    return {"rows": rows}


def print_table(result: dict, file=sys.stdout) -> None:
    busy = result["rows"][0]["busy"] if result["rows"] else 0
    print(f"| partitions (busy {busy}) | expire | idle turn | metrics | checkpoint |", file=file)
    print("| --- | --- | --- | --- | --- |", file=file)
    for r in result["rows"]:
        print(f"| {r['partitions']} | " + " | ".join(f"{v:.3f} ms" for v in r["ms"].values())
              + " |", file=file)
