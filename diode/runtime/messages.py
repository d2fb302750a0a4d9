"""What crosses between the pipeline's processes: one typed message per ZeroMQ frame kind, each
encoded and decoded next to its definition. Nothing here ever comes from the network: these
frames go between our own processes on one host (what crosses the link is diode.link.wire; what
is written to Kafka is diode.kafka.messages).

A message is its control frame, pickled (diode.runtime.transport: cheap for the lists of ints,
floats and strings these carry), followed by frames of bytes where it has any. A frame kind that
shares its queue with others carries its kind first, as a plain tuple (("runs", ...)); the types
are made on decoding, never pickled themselves (pickling a NamedTuple costs thirty times what
a tuple does), and only once per message or per side message: a run's Origin stays a plain tuple
on the writer's side. Records never go through pickle: they travel as run frames
(diode.link.runs).

The sender (kafka_reader -> packer -> udp_sender, acknowledgements back to the reader):
  kafka_reader -> packer   Runs (then one frame per run), Heartbeat, SourceLook, DigestBatch,
                           MetadataLook (`from_reader` decodes any of them)
  packer -> udp_sender     Datagrams (then the datagrams end to end, transport.join)
  packer, udp_sender -> kafka_reader   Acks

The receiver (udp_reader -> unpacker -> kafka_writer, replay requests back to the reader):
  udp_reader -> unpacker   Data (then the datagrams end to end), Mark, Notice (`from_udp_reader`)
  unpacker -> kafka_writer Batch (then the runs end to end): Origin per run, Claim per partition
                           of a heartbeat, Heard, SourceLook, DigestBatch, MetadataLook
  unpacker, kafka_writer -> udp_reader   ReplayAsk (the protocol: diode.runtime.replays)
"""

from functools import partial
from typing import NamedTuple

from diode.runtime.transport import dumps, loads

# -- the sender: kafka_reader -> packer ----------------------------------------------------------


class Runs(NamedTuple):
    """Records read by a kafka_reader, one run frame per source partition after this one
    (diode.link.runs), acknowledged back to it by `msg_id` (Acks) once they left the host."""
    reader: int
    msg_id: int
    counts: list  # records in each run frame, in order

    def encode(self) -> bytes:
        return dumps(("runs", *self))


class Heartbeat(NamedTuple):
    """A reader's heartbeat (wire.KIND_HEARTBEAT's fields: reader, time_ms, interval_ms,
    partitions, cluster, counters, stopping); it crosses the link after the records before it.
    The unpacker adds to what it hands writer 0: session, seen (the receiver's reader clock)
    and stopping (from the datagram's flag)."""
    beat: dict

    def encode(self) -> bytes:
        return dumps(("heartbeat", self.beat))


class SourceLook(NamedTuple):
    """A reader's look at its source (wire.KIND_SOURCE's fields: reader, time_ms, cluster,
    partitions, topics); to the writers, each with the partitions it owns."""
    state: dict

    def encode(self) -> bytes:
        return dumps(("source", self.state))


class DigestBatch(NamedTuple):
    """A reader's digests of ranges read (wire.KIND_DIGEST's fields: reader, time_ms, cluster,
    resend, partitions); to the writers, each with the partitions it owns."""
    batch: dict

    def encode(self) -> bytes:
        return dumps(("digests", self.batch))


class MetadataLook(NamedTuple):
    """The source's metadata (wire.KIND_METADATA's fields: reader, time_ms, cluster, whole,
    topics, groups); on the receiver to writer 0, which applies it (diode.kafka.metasync)."""
    meta: dict

    def encode(self) -> bytes:
        return dumps(("metadata", self.meta))


_FROM_READER = {"runs": Runs._make, "heartbeat": Heartbeat._make, "source": SourceLook._make,
                "digests": DigestBatch._make, "metadata": MetadataLook._make}


def from_reader(frame) -> Runs | Heartbeat | SourceLook | DigestBatch | MetadataLook:
    """The control frame of a message from a kafka_reader to a packer."""
    kind, *fields = loads(frame)
    return _FROM_READER[kind](fields)


# -- the sender: packer -> udp_sender, acknowledgements to the readers ---------------------------

class Datagrams(NamedTuple):
    """Sealed datagrams, end to end in the frame after this one (transport.join), and what each
    carries: per datagram, [(reader, msg_id, records)] of the Runs messages whose records it
    holds (empty for parity, heartbeats and fragments but a record's last), acknowledged to
    those readers once the kernel has taken it."""
    carried: list
    lengths: list

    def encode(self) -> bytes:
        return dumps(tuple(self))

    @classmethod
    def decode(cls, frame) -> "Datagrams":
        return cls._make(loads(frame))


class Acks(NamedTuple):
    """Records of a reader's Runs messages that left the host (or went to the dead-letter
    topic): [(msg_id, records)]. Only then may the reader commit their offsets."""
    acks: list

    def encode(self) -> bytes:
        return dumps(self.acks)

    @classmethod
    def decode(cls, frame) -> "Acks":
        return cls(loads(frame))


# -- the receiver: udp_reader -> unpacker -------------------------------------------------------

class Data(NamedTuple):
    """Datagrams as read (or replayed) from the receive journal, end to end in the frame after
    this one. `positions`: each one's journal position; `seen`: the reader's clock when they
    were read (CLOCK_MONOTONIC); `replayed`: they come again from the journal after a restart
    (the unpacker's replay window has seen them, or not: their records' dedup decides)."""
    replayed: bool
    positions: list
    seen: float
    lengths: list

    def encode(self) -> bytes:
        return dumps(("data", *self))


class Mark(NamedTuple):
    """Every datagram below journal `position`, and every one read before `seen` (the reader's
    clock), has been forwarded in this message stream. Writers measure the reorder wait on this
    clock and checkpoint up to the position; an unpacker holds the position back to the oldest
    datagram it still buffers."""
    position: int
    seen: float

    def encode(self) -> bytes:
        return dumps(("mark", *self))


class Notice(NamedTuple):
    """A replay of the journal began at `started` (the reader's clock): a worker that asked for
    one before then has its lost input coming (diode.runtime.replays)."""
    started: float

    def encode(self) -> bytes:
        return dumps(("notice", self.started))


_FROM_UDP_READER = {"data": Data._make, "mark": Mark._make, "notice": Notice._make}


def from_udp_reader(frame) -> Data | Mark | Notice:
    """The control frame of a message from the udp_reader to an unpacker."""
    kind, *fields = loads(frame)
    return _FROM_UDP_READER[kind](fields)


# -- the receiver: unpacker -> kafka_writer -----------------------------------------------------

class Origin(NamedTuple):
    """Where the receiver got a run: its datagram's journal position (of the first datagram of
    its fragment group or FEC block, which a replay must start from to rebuild it), the reader's
    clock when that was read, and whether it came again from the journal (Run.origin)."""
    position: int
    seen: float
    replayed: bool


# An Origin from a (position, seen, replayed) tuple: Origin._make less its length check, a third
# faster (one per datagram, in the unpacker).
as_origin = partial(tuple.__new__, Origin)
_new = tuple.__new__


class Claim(NamedTuple):
    """One partition of a heartbeat: the sender's chain of an incarnation of a source partition
    (where it started, the last offset sent, where the source ended) and whether the incarnation
    is gone (`retired`), with when the receiver read the heartbeat (`seen`, the reader's clock),
    whether it came live (not replayed), the sender's reader and time (ms) that sent it, and
    when the chain was first named (`named`, sender time, ms: the first heartbeat that carried
    it, as the sender says; an older sender's heartbeat, which does not say, its own time)."""
    topic: str
    partition: int
    incarnation: bytes
    chain_start: int
    last_sent: int
    end: int
    retired: bool
    seen: float
    live: bool
    reader: int
    sent: int
    named: int


class Heard(NamedTuple):
    """A heartbeat of the sender's `reader` sent at `time_ms` (sender time) was heard: to every
    writer, so a chain that starts after it is accounted from its start."""
    reader: int
    time_ms: int


class Batch(NamedTuple):
    """What an unpacker hands one kafka_writer at a time: the runs of the partitions that writer
    owns, end to end in the frame after this one, with their origins; the claims of heartbeats
    for those partitions; the beats themselves (writer 0); the reader's newest mark, held back
    to what the unpacker still buffers (None: none, or not trusted yet); the replay notices;
    and the side messages (Heard, SourceLook, DigestBatch, MetadataLook) in the order they
    came. `unpacker`: which unpacker sent it (marks and notices are per unpacker)."""
    unpacker: int
    origins: list   # one per run: an Origin, or once decoded its fields as a plain tuple
    claims: list    # [Claim]
    beats: list     # [dict] (Heartbeat.beat, with session, seen and stopping)
    mark: Mark | None
    notices: list   # [float] Notice.started
    lengths: list   # each run's bytes in the frame after this one
    sources: list   # [Heard | SourceLook | DigestBatch | MetadataLook]

    def encode(self) -> bytes:
        unpacker, origins, claims, beats, mark, notices, lengths, sources = self
        return dumps((unpacker, list(map(tuple, origins)),
                      list(map(tuple, claims)) if claims else claims, beats,
                      mark if mark is None else tuple(mark), notices, lengths,
                      [(_SIDE_KINDS[type(s)], *s) for s in sources] if sources else sources))

    @classmethod
    def decode(cls, frame) -> "Batch":
        unpacker, origins, claims, beats, mark, notices, lengths, sources = loads(frame)
        # (origins stay plain tuples, in Origin's field order, for Run.origin: an Origin made
        # per run would be the one per-run cost of the writer's decoding)
        # (tuple.__new__, and nothing made for what is empty: most batches carry runs alone)
        return _new(cls, (unpacker, origins, list(map(Claim._make, claims)) if claims else claims,
                          beats, mark if mark is None else _new(Mark, mark), notices, lengths,
                          [_SIDES[kind](fields) for kind, *fields in sources] if sources
                          else sources))


_SIDES = {"heard": Heard._make, "source": SourceLook._make, "digests": DigestBatch._make,
          "metadata": MetadataLook._make}
_SIDE_KINDS = {Heard: "heard", SourceLook: "source", DigestBatch: "digests",
               MetadataLook: "metadata"}


# -- the receiver: replay requests to the udp_reader ---------------------------------------------

class ReplayAsk(NamedTuple):
    """A restarted unpacker or kafka_writer asks the udp_reader to replay its journal: when the
    asking worker started (the reader's clock is CLOCK_MONOTONIC too) and its name, for the
    reader's log (diode.runtime.replays)."""
    started: float
    who: str

    def encode(self) -> bytes:
        return dumps(("replay", *self))

    @classmethod
    def decode(cls, frame) -> "ReplayAsk":
        _, started, who = loads(frame)
        return cls(started, who)
