"""What the receiving side costs idle, by worker, at 1 000 and 10 000 source partitions (issue
36): a udp_reader, two unpackers and a kafka_writer holding N source partitions (written up to an
offset, nothing waiting; no broker: the writer's producer is a stand-in), each in a process of
its own joined by ipc queues as a launch joins them, nothing sent over the link; each one's CPU
over 10 s after 3 s of warm-up, in % of a core, and its loop's turns a second. The metrics are
sampled every second as a worker does; the writer's checkpoints are left out (they are the
recovery's: ./scripts/bench --mode writer measures them).

Run by `.venv/bin/python scripts/receiver_idle.py [PARTITIONS...]`. Not a test: a figure,
compared before and after a change in the same window."""

import argparse
import os
import socket
import sys
import tempfile
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.writer_cost import fill  # noqa: E402 (as scripts/bench --mode writer fills it)
from writer_flow import Producer  # noqa: E402

from diode.link import crypto  # noqa: E402
from diode.runtime.metrics import Metrics  # noqa: E402
from diode.runtime.topology import from_dict  # noqa: E402
from diode.runtime.wiring import WorkerSpec  # noqa: E402
from diode.runtime.worker import Secrets, StageContext, stage_class  # noqa: E402

WARM_SECONDS, SECONDS = 3.0, 10.0
WORKERS = (("kafka_writer", 0), ("unpacker", 0), ("unpacker", 1), ("udp_reader", 0))


def topology(run_dir: str):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return from_dict({
        "link": {"port": port, "bind.address": "127.0.0.1"},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
        "receiver": {"kafka": {"bootstrap.servers": "x:1"},
                     "journal.dir": os.path.join(run_dir, "journal"),
                     "stages": {"unpacker": {"instances": 2},
                                "kafka_writer": {"instances": 1}}}})


def worker(t, run_dir: str, stage: str, index: int, partitions: int) -> str:
    ctx = StageContext(t, WorkerSpec("receiver", stage, index, ()), run_dir,
                       Secrets(1, crypto.master_key_from_password(b"pw", b"salt")),
                       zmq.Context(), Metrics({"stage": stage}))
    s = stage_class(stage)(ctx)
    s.open()
    if stage == "kafka_writer":
        s.dest.producer.flush(0)
        s.dest.producer = Producer(10**9)
        fill(s, partitions, 0)
        s.marks = [None, None]  # (the reader's marks, from each unpacker, come from now on)
        s.recovery.next_checkpoint = float("inf")
    warm = time.monotonic() + WARM_SECONDS
    end, cpu, turns, metrics_due = warm + SECONDS, None, 0, 0.0
    while time.monotonic() < end:
        s.step()
        now = time.monotonic()
        if now >= metrics_due:
            s.sample_metrics()
            metrics_due = now + 1.0
        if cpu is None and now >= warm:
            cpu = time.process_time()
        elif cpu is not None:
            turns += 1
    share = (time.process_time() - cpu) / SECONDS * 100
    return f"| {partitions} | {stage}-{index} | {share:.2f} % | {turns / SECONDS:.0f} |"


def measure(partitions: int) -> list[str]:
    run_dir = tempfile.mkdtemp(prefix="diode-receiver-idle-")
    t = topology(run_dir)
    r, w = os.pipe()
    pids = []
    for stage, index in WORKERS:
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                os.write(w, (worker(t, run_dir, stage, index, partitions) + "\n").encode())
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        return sorted(f.read().splitlines())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("partitions", type=int, nargs="*", default=[1000, 10000])
    args = ap.parse_args()
    print("| partitions | worker | CPU, % of a core | turns/s |")
    print("| --- | --- | --- | --- |")
    for n in args.partitions:
        print("\n".join(measure(n)))


if __name__ == "__main__":
    main()
