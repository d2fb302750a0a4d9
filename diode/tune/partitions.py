"""What the source's partition count changes in a topology (issue 36): `diode tune` reads the
count from the source cluster (the partitions of the topics the sender replicates), or takes it
as --partitions, and says, for the topology's own settings:

- heartbeats: each kafka_reader's heartbeat names the partitions it reads. With
  sender.heartbeat.claims.max 0 every heartbeat names all of them; with N, what changed and N
  of the others in turn, each at least every K = ceil(partitions of a reader / N) heartbeats,
  which is how long a lost heartbeat's word may be late (the setting's own meaning,
  diode.runtime.settings; its value and default are the topology's, never restated here);
- the kafka_writers: each holds the state of the partitions it owns (partitions / writers),
  and writes all of it at every checkpoint (receiver.checkpoint.interval.ms): the cost of one
  such checkpoint is measured here, with diode's own state and checkpoint file, and its share
  of a writer's core at the topology's interval;
- the readers' share of the partitions (kafka_reader instances).

Pure but for `count` (the source cluster) and `checkpoint_cost` (CPU time here).
"""

import math
import secrets
import tempfile
import time

from diode.accounting.ordering import PartitionState
from diode.errors import DiodeError
from diode.runtime import checkpoints

CHECKPOINT_SAMPLES = 3  # checkpoints written to time one (the fastest is kept)


def count(t, seconds: float = 10.0) -> int:
    """The partitions of the topics the sender replicates, from the source cluster's metadata;
    DiodeError when it does not answer."""
    from confluent_kafka import Consumer
    from diode.kafka.clients import client_settings, partition_counts, replicated
    conf = {**client_settings(t, "sender"), "group.id": f"diode-tune-{secrets.token_hex(4)}",
            "log_level": 0}
    consumer = Consumer(conf)
    try:
        counts = partition_counts(consumer, timeout=seconds)
    except Exception as exc:  # noqa: BLE001 - librdkafka's errors: say which cluster
        raise DiodeError(f"the source cluster ({conf.get('bootstrap.servers')}) did not answer "
                         f"for its partition count: {exc}; give --partitions") from None
    finally:
        consumer.close()
    return len(replicated(t.sender).owned(counts))


def checkpoint_cost(partitions: int) -> float:
    """CPU seconds of one writer's whole checkpoint of `partitions` partitions, each written up
    to an offset with nothing waiting: their states taken and the file written (no fsync), as
    diode.writer.recovery does."""
    states = [("t%05d" % (p // 5), p % 5, PartitionState(1.0, frontier=1000))
              for p in range(partitions)]
    best = math.inf
    with tempfile.TemporaryDirectory(prefix="diode-tune-checkpoint-") as scratch:
        for _ in range(CHECKPOINT_SAMPLES):
            start = time.process_time()
            snapshot = [[t, p, {**s.checkpoint(), "destination": t, "incarnation": "",
                                "current": True}] for t, p, s in states]
            checkpoints.save(scratch, 0, 0, snapshot, 1, int(time.time() * 1000), sync=False)
            best = min(best, time.process_time() - start)
    return best


def advise(t, partitions: int, where: str, checkpoint_seconds: float | None = None,
           readers: int | None = None, writers: int | None = None) -> dict:
    """What `partitions` source partitions mean for topology `t` (its settings as loaded: a
    setting the file does not give is its default); `where`: how the count was learnt;
    `checkpoint_seconds`: one writer's checkpoint of its share, when measured; `readers`,
    `writers`: the instances planned (default: the topology's)."""
    readers = readers or t.stage("sender", "kafka_reader").instances
    writers = writers or t.stage("receiver", "kafka_writer").instances
    per_reader = math.ceil(partitions / readers)
    per_writer = math.ceil(partitions / writers)
    most = t.sender.heartbeat_claims_max
    interval = t.sender.heartbeat_interval_ms / 1000
    every = 1 if not most else max(1, math.ceil(per_reader / most))
    out = {
        "partitions": partitions, "from": where,
        "kafka_reader": {"instances": readers, "partitions_each": per_reader},
        "kafka_writer": {"instances": writers, "partitions_each": per_writer},
        "heartbeat": {"claims_max": most, "interval_seconds": interval,
                      # claims one heartbeat names with nothing changed
                      "unchanged_claims": per_reader if not most else min(most, per_reader),
                      "every_heartbeats": every, "every_seconds": every * interval},
    }
    ckpt = {"interval_seconds": t.receiver.checkpoint_interval_ms / 1000}
    if checkpoint_seconds is not None:
        ckpt["seconds"] = checkpoint_seconds
        ckpt["writer_share"] = checkpoint_seconds / ckpt["interval_seconds"]
    out["checkpoint"] = ckpt
    return out


def lines(a: dict) -> list[str]:
    """The advice as the table's lines."""
    h, r, w, c = a["heartbeat"], a["kafka_reader"], a["kafka_writer"], a["checkpoint"]
    out = [f"source: {a['partitions']:,} partitions ({a['from']}); {r['instances']} "
           f"kafka_reader(s) read about {r['partitions_each']:,} each, {w['instances']} "
           f"kafka_writer(s) hold about {w['partitions_each']:,} each"]
    if not h["claims_max"]:
        out.append(f"heartbeats: sender.heartbeat.claims.max 0: every heartbeat names every "
                   f"partition of its reader ({h['unchanged_claims']:,} claims every "
                   f"{h['interval_seconds']:g} s, whether anything changed or not); N > 0 "
                   f"names what changed and N others, each partition at least every "
                   f"ceil({r['partitions_each']:,} / N) heartbeats")
    else:
        out.append(f"heartbeats: sender.heartbeat.claims.max {h['claims_max']:,}: a heartbeat "
                   f"names what changed and {h['unchanged_claims']:,} others; every partition "
                   f"is named at least every {h['every_heartbeats']:,} heartbeat(s) "
                   f"({h['every_seconds']:g} s): a lost heartbeat's word (an idle partition's "
                   f"lost tail) may come that much later")
    if "seconds" in c:
        out.append(f"checkpoints: a kafka_writer's checkpoint of its {w['partitions_each']:,} "
                   f"partitions takes {1000 * c['seconds']:.1f} ms of CPU here, every "
                   f"{c['interval_seconds']:g} s (receiver.checkpoint.interval.ms): "
                   f"{c['writer_share']:.1%} of its core; a longer interval or more writers "
                   f"lower it, a restart then replays more of the journal")
    return out
