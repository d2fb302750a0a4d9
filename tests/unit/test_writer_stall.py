"""diode.writer.stall: a writer whose producer holds records and sends none while its destination
answers starts afresh (durable), and waits out an outage however long."""

import logging
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

from diode.runtime.metrics import Metrics, read_counter
from diode.writer import stall
from diode.writer.stall import ProducerStalled, ProducerWatch


class Producer:
    """What the watch asks of a confluent_kafka.Producer: how many records it holds."""

    def __init__(self):
        self.held = 0

    def __len__(self):
        return self.held


class Admin:
    """An AdminClient of a destination that is up or not: its DescribeCluster answered by the
    time the watch looks again, or failed."""

    def __init__(self):
        self.up, self.made = True, 0

    def describe_cluster(self, request_timeout):
        f = Future()
        if self.up:
            f.set_result("cluster")
        else:
            f.set_exception(KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers down")))
        return f


class Dest:
    def __init__(self):
        self.producer, self.produced = Producer(), 0


def watched(durable=True):
    dest, admin = Dest(), Admin()
    metrics = Metrics({"side": "receiver", "stage": "kafka_writer", "index": "0"}, None)

    def new_admin():
        admin.made += 1
        return admin
    watch = ProducerWatch(dest, logging.getLogger("test"), metrics, durable, new_admin)
    return dest, watch, metrics, admin


def looks(watch, start, end):
    t = start
    while t <= end:
        watch.look(t)
        t += stall.LOOK_SECONDS


def test_a_producer_stuck_while_its_destination_answers_starts_the_writer_afresh():
    dest, watch, metrics, admin = watched()
    dest.produced, dest.producer.held = 5000, 2000  # 3 000 written, then none
    looks(watch, 0, stall.QUIET_SECONDS + stall.STALL_SECONDS - stall.LOOK_SECONDS)
    with pytest.raises(ProducerStalled, match="2000 record"):
        looks(watch, stall.QUIET_SECONDS + stall.STALL_SECONDS, 1000)
    assert read_counter(metrics.text(), "errors", reason="produce") == 1  # (logged too)


def test_an_outage_is_waited_out_however_long_and_the_wait_starts_again_when_it_ends():
    dest, watch, _, admin = watched()
    dest.produced, dest.producer.held = 5000, 2000
    admin.up = False
    looks(watch, 0, 3600)  # an hour down: nothing to restart for
    admin.up = True
    back = 3600 + stall.LOOK_SECONDS
    looks(watch, back, back + stall.STALL_SECONDS - stall.LOOK_SECONDS)  # reconnecting
    with pytest.raises(ProducerStalled):
        looks(watch, back + stall.STALL_SECONDS, back + 1000)
    assert admin.made == 1


def test_a_producer_that_writes_slowly_or_holds_nothing_is_never_stuck():
    dest, watch, _, admin = watched()
    dest.produced, dest.producer.held = 5000, 2000
    for i in range(1000):  # one record acknowledged every look
        dest.producer.held = 2000 - i
        watch.look(i * stall.LOOK_SECONDS)
    dest.producer.held = 0
    looks(watch, 1000 * stall.LOOK_SECONDS, 2000 * stall.LOOK_SECONDS)  # idle
    assert admin.made == 0  # (nothing suspected: the destination never asked)


def test_without_a_journal_the_stall_is_said_and_waited_out(caplog):
    dest, watch, _, admin = watched(durable=False)
    dest.produced, dest.producer.held = 5000, 2000
    with caplog.at_level(logging.ERROR):
        looks(watch, 0, 600)
    said = [r for r in caplog.records if "has sent none" in r.getMessage()]
    assert said and len(said) <= 600 / stall.STALL_SECONDS
    assert "a restart would lose them" in said[0].getMessage()
