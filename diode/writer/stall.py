"""A producer that stopped sending while its destination answers: the writer starts afresh.

librdkafka's idempotent producer can stop sending for good after its only broker went away and
came back: the fresh-clone CI of issue 36 had a writer whose producer held its 2 000 records
(its queue.buffering.max.messages, 1 000 each of its two partitions) for the whole three minutes
after the destination broker was started again, without an error, while the other writer's
producer, through the same outage, wrote everything; a helper's run of that test saw it again,
the stuck producer not answering even a metadata request (list_topics) with its broker up.
Why is not known: a dozen runs with librdkafka's debug=eos,broker did not show it, but showed
the producers re-bootstrapping some ten times a second while the broker was down (every broker
handle decommissioned and made again; librdkafka 2.16's notes list re-bootstrap cases that
never reached a broker, fixed), so the writer's producers now keep the brokers they learned
(stages.kafka_writer.WRITER_PRODUCER); with message.timeout.ms 0 a stuck producer never fails
a record either. Nothing outside the producer can move its records on, and nothing in it tells
the writer, so the writer watches for it:

the producer holds records and has had none acknowledged since QUIET_SECONDS, and its
destination has answered at every look for STALL_SECONDS since (a DescribeCluster request from
an admin client of the watch's own, asked at one look and its answer taken at the next: the
loop never waits on it). A durable writer then stops with an error
(ProducerStalled): the supervisor starts it again, with a new producer, and the restarted writer
reads what the destination holds and has the journal replay what its last checkpoint did not
cover (diode.writer.recovery), as after a kill: nothing is lost or written twice. Without a
journal a restart would lose what the producer holds: the stall is said (an error, every
STALL_SECONDS) and waited out.

A destination that refuses records for a while (a partition without enough in-sync replicas)
looks the same from here; the writer then starts afresh at most once every STALL_SECONDS and a
few, below any restart budget (supervisor.restart.max within restart.window.seconds), and loses
nothing by it.
"""

import time

from diode.errors import DiodeError

LOOK_SECONDS = 10.0    # how often the producer's progress is looked at (a timer of the writer)
QUIET_SECONDS = 30.0   # no acknowledgement this long while it holds records: is the cluster up?
STALL_SECONDS = 60.0   # ... and the cluster answering this long since: the producer is stuck
ANSWER_TIMEOUT = 5.0   # s: the request that tells whether the destination answers (< a look)


class ProducerStalled(DiodeError):
    """A writer's producer holds records and sends none while its destination answers."""


class ProducerWatch:
    """`dest`: the writer's diode.writer.destination.Destination (its producer, and the records
    it accepted); `durable`: whether a journal replays what a restart loses; `new_admin()`: an
    AdminClient of the destination, made once a stall is suspected and kept (one dropped
    while a request is out is destroyed from librdkafka's own thread)."""

    def __init__(self, dest, log, metrics, durable: bool, new_admin):
        self.dest, self.log, self.metrics, self.durable = dest, log, metrics, durable
        self.new_admin, self.admin = new_admin, None
        self.asked = None              # the DescribeCluster of the last look (a Future)
        self.acknowledged = 0          # as at the last look
        self.moved_at = time.monotonic()  # when it last held nothing or had more acknowledged
        self.answering_since = None    # since when the destination answered at every look
        self.said_at = 0.0             # (without a journal: when the stall was last said)

    def look(self, now: float) -> None:
        """The timer (every LOOK_SECONDS). ProducerStalled when the producer is stuck and a
        restart loses nothing."""
        dest = self.dest
        held = len(dest.producer)
        acknowledged = dest.produced - held
        if not held or acknowledged != self.acknowledged:
            self.acknowledged, self.moved_at, self.answering_since = acknowledged, now, None
            self.asked = None
            return
        if now - self.moved_at < QUIET_SECONDS:
            return
        if not self._answers():  # (an outage: waited out, however long)
            self.answering_since = None
            return
        if self.answering_since is None:
            self.answering_since = now
        if now - self.answering_since < STALL_SECONDS:
            return
        self.metrics.inc("errors", reason="produce")
        why = (f"the destination cluster has answered for {now - self.answering_since:.0f} s, "
               f"and its producer has sent none of the {held} record(s) it holds for "
               f"{now - self.moved_at:.0f} s")
        if self.durable:
            raise ProducerStalled(f"{why}: starting this writer afresh (the journal replays "
                                  f"what it had not written)")
        if now - self.said_at >= STALL_SECONDS:
            self.said_at = now
            self.log.error("%s; without a journal a restart would lose them: waiting", why)

    def _answers(self) -> bool:
        """Whether the destination answered the request of the last look; asks again."""
        asked = self.asked
        answered = asked is not None and asked.done() and asked.exception() is None
        if self.admin is None:
            self.admin = self.new_admin()
        try:
            self.asked = self.admin.describe_cluster(request_timeout=ANSWER_TIMEOUT)
        except Exception:  # noqa: BLE001 - (refused locally: no answer this time)
            self.asked = None
        return answered
