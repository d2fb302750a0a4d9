"""The source's state across the link (wire.KIND_SOURCE): what the receiver knows of its source
without seeing it. Each source partition's log start and end, and each topic's retention, come
every sender.source.state.interval.ms; the receiver exports, per topic, how far behind the
source it is and how much the source still holds, and `diode status` shows both. On Apache
Kafka and on Tansu."""

import subprocess
import sys

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from tests.conftest import (ROOT, client, consume, create_topic, produce, wait_for,
                            write_topology)


def test_the_receiver_knows_how_far_behind_its_source_it_is(tmp_path, start_brokers,
                                                            broker_kind, launch):
    src, dst = start_brokers(broker_kind, "source", "destination")
    create_topic(src.bootstrap, "src", 2, {"retention.ms": "86400000"})
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          link={"rate.mbps": 2},  # 800 KB take about 3 s: a visible lag
                          sender={"source.state.interval.ms": 300})
    diode = launch(topo)
    sent = [{"value": b"%05d" % i + bytes(2000), "partition": i % 2} for i in range(400)]
    produce(src.bootstrap, "src", sent)
    lags = []

    def caught_up():
        lags.append(diode.metric("source_lag_records", "kafka_writer", topic="src"))
        return lags[-1] == 0 and diode.metric("records", "kafka_writer") == 400
    wait_for(caught_up, 60, "the receiver to catch up with its source")
    assert max(lags) > 0  # behind while the paced link carried the backlog
    assert len(consume(dst.bootstrap, "dst_src", 400, timeout=30)) == 400
    held = diode.metric("source_held_records", "kafka_writer", topic="src")
    assert held == 400, held
    status = subprocess.run([sys.executable, "-m", "diode", "status", str(topo)],
                            capture_output=True, text=True, cwd=ROOT).stdout
    assert "source src: 0 records behind, 400 still held there" in status, status
    if broker_kind == "kafka":  # (Tansu has no DeleteRecords)
        admin = AdminClient(client(src.bootstrap))
        for future in admin.delete_records([TopicPartition("src", 0, 150)]).values():
            future.result(30)
        wait_for(lambda: diode.metric("source_held_records", "kafka_writer",
                                      topic="src") == 250, 20, "the deleted records to show")
    assert diode.stop() == 0
