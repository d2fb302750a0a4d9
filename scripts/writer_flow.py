"""What a kafka_writer costs while its destination holds it back, and per record when records
are spread thin, at 1 000 and 10 000 source partitions (issue 36): a writer stage made in this
process (no broker: its producer is a stand-in that takes or refuses what it is handed), in CPU
time (time.process_time):

- blocked, queue full: MAX_BACKLOG_RECORDS records waiting, runs of one record spread over the
  partitions (200 topics), the producer's queue full and nothing acknowledged: % of a core
  over 3 s of the loop's turns (Stage.step), and the turns a second;
- blocked, topics: the same backlog, its destination topics not answered yet (the Preparer
  silent);
- thin: batches as an unpacker sends them, runs of 1 or 2 records each of consecutive
  partitions, offered, queued and produced by the loop: µs of CPU per record, over 60 000
  records; a batch of 12 runs (a 1472-byte datagram's worth at 100-byte values: a light load)
  or of 6 144 (512 datagrams, what an unpacker's turn hands on under load).

Run by `.venv/bin/python scripts/writer_flow.py [blocked|thin] [PARTITIONS...]`. Not a test: a
figure, compared before and after a change in the same window."""

import argparse
import os
import sys
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib.writer_cost import writer  # noqa: E402 (the stage of scripts/bench --mode writer)

from diode.accounting.ordering import PartitionState, SourcePartition  # noqa: E402
from diode.link.records import Record  # noqa: E402
from diode.link.runs import Run, from_records  # noqa: E402
from diode.runtime import transport  # noqa: E402
from diode.runtime.messages import Batch, Mark, as_origin  # noqa: E402
from stages.kafka_writer import MAX_BACKLOG_RECORDS  # noqa: E402

TOPICS = 200
BATCH_RUNS = (12, 6144)


class Producer:
    """Takes `room` records, then refuses (BufferError) until they are acknowledged (never
    here); poll waits its timeout, as librdkafka's does with nothing to report."""

    def __init__(self, room: int):
        self.room, self.held = room, 0

    def produce(self, *args, **kwargs):
        if self.held >= self.room:
            raise BufferError("Local: Queue full")
        self.held += 1

    def poll(self, timeout=0):
        if timeout:
            time.sleep(timeout)
        return 0

    def flush(self, timeout=None):
        return self.held

    def __len__(self):
        return self.held

    def list_topics(self, **kwargs):
        pass


def source_of(p: int) -> tuple:
    """Partition p of the N as (topic, partition): 200 topics, the partitions spread over them."""
    return "t%d" % (p % TOPICS), p // TOPICS


def encoded(p: int, offset: int, n: int) -> bytes:
    topic, partition = source_of(p)
    return from_records([Record(topic, partition, o, 1000 + o, 1, b"k", b"v" * 100, (), o - 1)
                         for o in range(offset, offset + n)], 10000)


def started(room: int):
    zctx = zmq.Context()
    w = writer(zctx)
    w.dest.producer.flush(0)
    w.dest.producer = Producer(room)
    w.recovery.next_checkpoint = float("inf")
    return zctx, w


def blocked(partitions: int, why: str, seconds: float = 3.0) -> tuple:
    """(turns a second, % of a core) of a writer held back with a full backlog."""
    zctx, w = started(0)
    try:
        for i in range(MAX_BACKLOG_RECORDS):
            w.dest.add(Run.decode(encoded(i % partitions, 1000 + i // partitions, 1)))
        if why == "queue":
            for t in range(TOPICS):
                w.dest.dest_partitions[w.destination("t%d" % t)] = 10000
        else:
            w.dest.ask_topic = lambda *args, **kwargs: None  # (never answered)
        w.step()
        turns, cpu, deadline = 0, time.process_time(), time.monotonic() + seconds
        while time.monotonic() < deadline:
            w.step()
            turns += 1
        return turns / seconds, (time.process_time() - cpu) / seconds * 100
    finally:
        w.close()
        zctx.destroy(linger=0)


def thin(partitions: int, per_run: int, batch_runs: int, records: int = 60000) -> float:
    """µs of CPU per record through the writer's loop, records spread over `partitions`."""
    zctx, w = started(10**12)
    try:
        for t in range(TOPICS):
            w.dest.dest_partitions[w.destination("t%d" % t)] = 10000
        for p in range(partitions):
            state = PartitionState(w.r.reorder_wait_ms / 1000, frontier=999)
            w.sources[source_of(p)] = source = SourcePartition()
            source.current = state
            w.recovery.recovered.add((*source_of(p), state.incarnation))
        w.marks = [Mark(1, 0.0)]
        feed = transport.push(zctx, ["inproc://receiver-kafka_writer-0.in"], 1000)
        following, p, batches = [1000] * partitions, 0, []
        for _ in range(records // per_run // batch_runs):
            frames = []
            for _ in range(batch_runs):
                frames.append(encoded(p, following[p], per_run))
                following[p] += per_run
                p = (p + 1) % partitions
            lengths, body = transport.join(frames)
            origins = [as_origin((1, 0.0, False))] * len(frames)
            batches.append([Batch(0, origins, [], [], None, [], lengths, []).encode(), body])
        cpu = time.process_time()
        for batch in batches:
            feed.send_multipart(batch)
            w.step()
        while w.dest.backlog_records:
            w.step()
        spent = time.process_time() - cpu
        assert w.dest.produced == len(batches) * batch_runs * per_run
        return spent / w.dest.produced * 1e6
    finally:
        w.close()
        zctx.destroy(linger=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["blocked", "thin"])
    ap.add_argument("partitions", type=int, nargs="*", default=[1000, 10000])
    args = ap.parse_args()
    for n in args.partitions:
        if args.what == "blocked":
            for why in ("queue", "topics"):
                turns, share = blocked(n, why)
                print(f"| {n} | blocked ({why}) | {turns:.0f} turns/s | {share:.1f} % of a core |")
        else:
            for batch_runs in BATCH_RUNS:
                for per_run in (1, 2):
                    print(f"| {n} | thin, batches of {batch_runs} runs of {per_run} | "
                          f"{thin(n, per_run, batch_runs):.1f} µs/record |")


if __name__ == "__main__":
    main()
