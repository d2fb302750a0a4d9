"""packer: runs in, datagrams out (runs concatenated, compressed, encrypted).

Each packer process is its own sender session: a random session id, a key derived for it, and a
sequence number that is the AEAD nonce. It fills datagrams with the readers' runs, as they are,
up to link.datagram.size.bytes (diode.link.batching.DatagramBuilder: a run is cut only where a
datagram ends), waits at most batch.linger.ms for more records, and tells the
udp_sender which reader messages each datagram carries. A record too large for one datagram is
fragmented; one larger than sender.max.record.bytes goes to the dead-letter topic on the source
cluster and is acknowledged once it is there. The loop never waits on the source cluster for
it: the topic is created from a thread, and a dead letter the producer cannot take yet waits in
the packer (a few of them at most; then the packer takes no input until they are taken).

Records' way through it, one call chain: the runtime's loop (diode.runtime.worker.Stage.step)
polls the readers' socket with Stage.poll_input, and Stage.take_input takes one message at a
time without copying it and hands a messages.Runs (from_reader) to _runs ->
DatagramBuilder.add (diode.link.batching: runs concatenated up to a datagram, compressed by
diode.link.codec) -> _seal -> diode.link.wire.Sealer.seal_body (the header, the AEAD seal by
diode.link.crypto.SessionCipher; with FEC the block's parity too, diode.link.fec) -> _emit ->
_send -> _put -> a messages.Datagrams to the udp_sender, with what each datagram carries. What
has lingered batch.linger.ms goes at the end of the turn (Stage.after_input, _flush_lingered).
A record too large goes _emit -> _fragment (diode.link.fragments) or _dead_letter. A reader's
other messages go to their own handlers (Heartbeat _heartbeat, SourceLook _source, DigestBatch
_digests, MetadataLook _metadata) -> their own datagram kinds, sealed after the records before
them.
"""

import math
import threading
import time
from collections import deque

import zmq
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from diode.link import codec, crypto, fec, fragments, runs, wire
from diode.runtime import transport
from diode.runtime.messages import (Acks, Datagrams, DigestBatch, Heartbeat, MetadataLook, Runs,
                                    SourceLook, from_reader)
from diode.link.batching import DatagramBuilder
from diode.kafka.clients import admin_config, client_settings, create_topic, producer_config
from diode.kafka.messages import sender_dead_letter_headers
from diode.link.records import provenance_headers
from diode.runtime.worker import Stage as BaseStage

DEAD_LETTERS_WAITING = 8  # dead letters (each over sender.max.record.bytes) held at most
FIT_SAMPLE = 16          # entries of a heartbeat, source look or digests measured to chunk them
FIT_MARGIN = 0.9         # of a datagram the chunks are sized to fill (the rest for longer names)


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        self.input = transport.pull(ctx.zmq, ctx.bound("in"), ctx.hwm)
        self.poller = transport.poller(self.input, ctx.wakeup)
        self.out = self.outbox(transport.push(ctx.zmq, ctx.peers("out"), ctx.hwm))
        self.acks = [transport.push(ctx.zmq, [e], ctx.hwm * 16) for e in ctx.peers("acks")]
        session = crypto.new_session_id()
        cipher = crypto.SessionCipher(ctx.secrets.cipher_id, ctx.secrets.master_key, session)
        self.sealer = wire.Sealer(cipher, self.t.compression, ctx.secrets.key_id)
        link = self.t.link
        self.fec = fec.BlockEncoder(link.fec_data_datagrams, link.fec_parity_datagrams,
                                    link.fec_interleave_depth)
        self.parity: list = []  # parity datagrams to send after the data they protect
        limit = link.datagram_size_bytes
        if self.fec.enabled:  # a parity datagram is as long as its block's longest + overhead
            limit -= wire.HEADER_BYTES + crypto.TAG_BYTES + fec.parity_overhead(
                link.fec_data_datagrams)
        self.builder = DatagramBuilder(limit, self._seal, self.t.compression != "none",
                                       compress=lambda p: codec.compress(self.t.compression, p))
        self.linger = self.t.sender.batch_linger_ms / 1000
        self.first_pending = None  # when the builder's oldest record was taken (its linger)
        self.dlq = None
        self.dlq_topic_ready = threading.Event()  # (set once the topic's creation has answered)
        self.dead_letters: deque = deque()  # (topic, record, headers, on_delivery) to produce
        self.handlers = {Runs: self._runs, Heartbeat: self._heartbeat, SourceLook: self._source,
                         DigestBatch: self._digests, MetadataLook: self._metadata}
        self.log.info("session %016x", session)

    # -- the runtime's loop (diode.runtime.worker.Stage.step) ---------------------------------

    def before_input(self, now):
        """The dead letters handed to their producer, and what waits for the udp_sender handed
        on: no input this turn while either is behind (after waiting a moment for it). Else
        input is waited for no longer than what the builder holds may linger."""
        if self.dlq is not None:
            self.dlq.poll(0)
            self._produce_dead_letters()
            if len(self.dead_letters) >= DEAD_LETTERS_WAITING:
                self.dlq.poll(0.05)  # (waits for the topic or the producer's queue, no input)
                return None
        if not self.out.flush():
            self.out.sock.poll(50, zmq.POLLOUT)
            return None
        if self.builder.pending:  # (rounded up: a last millisecond rounded to 0 would spin)
            return max(0, math.ceil((self.first_pending + self.linger - now) * 1000))
        if self.parity or self.dlq is not None and (self.dead_letters or len(self.dlq)):
            return self.POLL_MS  # (parity to send, dead letters to deliver)
        return self.IDLE_WAIT_MS  # (nothing held: a reader's message is all it waits for)

    def poll_input(self, wait_ms):
        """Wait up to `wait_ms` for a reader's message (or a signal: the worker's Wakeup)."""
        return self.input in dict(self.poller.poll(wait_ms))

    def take_input(self):
        """Reader messages one at a time, and none while the udp_sender is behind: what is
        taken is packed (a message left in the socket is safe, one taken and dropped is lost).
        Not copied: runs are cut into datagrams as views of the frames."""
        handlers = self.handlers
        while not self.out.full:
            try:
                frames = self.input.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            message = from_reader(frames[0].bytes)
            handlers[type(message)](message, frames)

    def after_input(self, now):
        if self.first_pending is None and self.builder.pending:
            self.first_pending = now
        self._flush_lingered()
        return True

    def finish(self, now):
        """What the builder and the FEC blocks hold goes; done once the udp_sender has taken
        everything and every dead letter is delivered."""
        self._flush_lingered()
        return not (self.out.flush() and self._dlq_done())

    def _flush_lingered(self) -> None:
        """What the builder has held batch.linger.ms (or anything, stopping) goes, with the
        parity of unfinished blocks (a quiet link must not hold parity back); parity that
        became due goes too. (Not a loop.Timer, which runs at a turn's start: what lingers
        takes the turn's input first, and stays while the udp_sender is behind, rather than
        leave short; before_input keeps the wait for input within the linger.)"""
        if self.builder.pending and (self.stopping or
                                     time.monotonic() - self.first_pending >= self.linger):
            self._emit(*self.builder.flush())
            self._parity(self.fec.flush())
        if self.parity:
            self._send([], [])

    def _runs(self, message: Runs, frames) -> None:
        tag = (message.reader, message.msg_id)
        for run, count in zip(frames[1:], message.counts):
            self._emit(*self.builder.add(run.buffer, tag, count))

    def _seal(self, body: bytes) -> bytes:
        """Seal a data datagram; with FEC, into the block the encoder assigns, whose parity
        datagrams wait in self.parity until they are due."""
        if not self.fec.enabled:
            return self.sealer.seal_body(body)
        block = self.fec.assign()
        datagram = self.sealer.seal_body(body, routing_key=block, flags=wire.FLAG_FEC)
        self._parity(self.fec.add(block, self.sealer.seq, datagram))
        return datagram

    def _parity(self, outs) -> None:
        for out in outs:
            self.parity.append(self.sealer.seal(out.payload, wire.KIND_PARITY,
                                                routing_key=out.block_id))

    def _put(self, datagrams: list, meta: list) -> None:
        """Datagrams to the udp_sender in one frame, with what each acknowledges."""
        lengths, body = transport.join(datagrams)
        self.out.put([Datagrams(meta, lengths).encode(), body])

    def _send(self, datagrams, meta) -> None:
        """Datagrams (with what each acknowledges), then any parity that became due."""
        parity, self.parity = self.parity, []
        self._put(datagrams + parity, meta + [[] for _ in parity])
        self.metrics.inc("datagrams", len(datagrams))
        self.metrics.inc("parity_datagrams", len(parity))
        self.metrics.inc("bytes", sum(map(len, datagrams)) + sum(map(len, parity)))

    def _emit(self, sealed, oversize):
        if sealed:
            self.first_pending = time.monotonic() if self.builder.pending else None
            meta = [[(reader, msg_id, n) for (reader, msg_id), n in s.tags.items()]
                    for s in sealed]
            self._send([s.datagram for s in sealed], meta)
        for run, tag in oversize:
            run = bytes(run)  # (it may be a view of a reader's frame)
            if len(run) <= self.t.sender.max_record_bytes:
                self._fragment(run, tag)
            else:
                self._dead_letter(runs.Run.decode(run).records()[0], tag)

    def _fragment(self, run: bytes, tag):
        """A record too large for one datagram crosses as fragments (diode.link.fragments): its
        run is compressed whole and split; every fragment is its own sealed datagram routed
        by the group id. The record is acknowledged with the last fragment."""
        compression = self.sealer.compression
        payload = codec.compress(compression, run)
        group = self.sealer.seq + 1  # the sequence number of the first fragment
        chunk = self.builder.budget - fragments.FRAGMENT_HEADER_BYTES
        # Fragments are routed by their group (one unpacker reassembles the record), so they
        # cannot follow FEC's per-block routing: they are not covered by parity.
        datagrams = [self.sealer.seal(body, wire.KIND_FRAGMENT, routing_key=group)
                     for body in fragments.split(payload, group, chunk)]
        meta = [[] for _ in datagrams]
        meta[-1] = [(tag[0], tag[1], 1)]
        self._send(datagrams, meta)
        self.metrics.inc("fragmented_records")

    def _heartbeat(self, message: Heartbeat, frames):
        """Seal a reader's heartbeat after the records this packer holds, split over as many
        datagrams as its partitions need (each with when its claims' chains were first named,
        where the reader says it)."""
        beat = message.beat
        self._emit(*self.builder.flush())
        flags = wire.FLAG_STOPPING if beat.get("stopping") else 0  # (the reader stops cleanly)
        named = beat.get("named_ms")
        if named is None:
            def encode(chunk):
                return wire.encode_heartbeat({**beat, "partitions": chunk})
            parts = beat["partitions"]
        else:
            def encode(chunk):
                return wire.encode_heartbeat({**beat, "partitions": [c for c, _ in chunk],
                                              "named_ms": [n for _, n in chunk]})
            parts = list(zip(beat["partitions"], named))
        self._seal_fitted(parts, encode, wire.KIND_HEARTBEAT, flags)

    def _source(self, message: SourceLook, frames):
        """Seal a reader's look at its source (wire.KIND_SOURCE), split over as many datagrams
        as its partitions need, each with the retention of the topics it names."""
        state = message.state
        topics = {t[0]: t for t in state["topics"]}

        def encode(chunk):
            named = sorted({p[0] for p in chunk})
            return wire.encode_source({**state, "partitions": chunk,
                                       "topics": [topics[t] for t in named if t in topics]})
        self._seal_fitted(state["partitions"], encode, wire.KIND_SOURCE)

    def _digests(self, message: DigestBatch, frames):
        """Seal a reader's digests of ranges read (wire.KIND_DIGEST), as many datagrams as
        they need."""
        batch = message.batch
        self._seal_fitted(batch["partitions"],
                          lambda chunk: wire.encode_digests({**batch, "partitions": chunk}),
                          wire.KIND_DIGEST)

    def _metadata(self, message: MetadataLook, frames):
        """Seal the source's metadata (wire.KIND_METADATA), its topics and group offsets over
        as many datagrams as they need (each entry measured as encoded)."""
        meta = message.meta
        empty = {**meta, "topics": [], "groups": []}
        base = len(wire.encode_metadata(empty))
        room = self.builder.budget - base
        chunks, chunk, size = [], {"topics": [], "groups": []}, 0
        for field in ("topics", "groups"):
            for entry in meta[field]:
                n = len(wire.encode_metadata({**empty, field: [entry]})) - base
                if n > room:
                    self.log.error("the metadata of %s does not fit in a datagram: not sent",
                                   entry[0])
                    continue
                if size + n > room:
                    chunks.append(chunk)
                    chunk, size = {"topics": [], "groups": []}, 0
                chunk[field].append(entry)
                size += n
        chunks.append(chunk)
        datagrams = [self.sealer.seal(wire.encode_metadata({**meta, **c}), wire.KIND_METADATA)
                     for c in chunks]
        self._put(datagrams, [[] for _ in datagrams])
        self.metrics.inc("heartbeat_datagrams", len(datagrams))

    def _seal_fitted(self, parts: list, encode, kind: int, flags: int = 0) -> None:
        """Seal `parts` (per-partition entries), `encode(chunk)` making a chunk's payload, over
        as few datagrams as they fit in, and hand them on in order. The chunks hold as many
        entries as the first ones' encoded size says fit; a chunk whose payload turns out too
        large is halved and encoded again (long topic names further on)."""
        room = self.builder.budget
        base = len(encode([]))
        sample = parts[:FIT_SAMPLE]
        per = (len(encode(sample)) - base) / len(sample) if sample else 1.0
        n = max(1, int((room - base) / max(per, 1.0) * FIT_MARGIN))
        todo = [parts[i:i + n] for i in range(0, len(parts), n)][::-1] or [[]]
        payloads = []
        while todo:  # (a stack: the first chunk last)
            chunk = todo.pop()
            payload = encode(chunk)
            if len(payload) > room and len(chunk) > 1:
                half = len(chunk) // 2
                todo += [chunk[half:], chunk[:half]]
                continue
            payloads.append(payload)
        datagrams = [self.sealer.seal(p, kind, flags=flags) for p in payloads]
        self._put(datagrams, [[] for _ in datagrams])
        self.metrics.inc("heartbeat_datagrams", len(datagrams))

    # -- records too large for a datagram ----------------------------------------------------

    def _dead_letter(self, record, tag):
        topic = self.t.sender.dead_letter_topic
        size = len(record.key or b"") + len(record.value or b"")
        self.log.error("record %s[%d]@%d (%d bytes) is larger than sender.max.record.bytes "
                       "%d: %s", record.topic, record.partition, record.offset, size,
                       self.t.sender.max_record_bytes,
                       f"written to the dead-letter topic {topic}" if topic else "skipped")
        self.metrics.inc("dead_letter_records")
        if not topic:
            self._ack(tag)
            return
        if self.dlq is None:
            threading.Thread(target=self._create_dead_letter_topic, args=(topic,),
                             name="dead-letter-topic", daemon=True).start()
            self.dlq = Producer(producer_config(client_settings(self.t, "sender"), **{
                "message.max.bytes": 1_000_000_000}))  # whatever the source cluster held
        headers = sender_dead_letter_headers(
            provenance_headers(record), f"record of {size} bytes exceeds "
            f"sender.max.record.bytes {self.t.sender.max_record_bytes}")

        def delivered(err, msg, tag=tag, record=record):
            if err is None:
                self._ack(tag)
            else:
                self.log.error("dead-letter write of %s[%d]@%d failed: %s; it is read again "
                               "after the reader's inflight timeout", record.topic,
                               record.partition, record.offset, err)

        self.dead_letters.append((topic, record, headers, delivered))
        self._produce_dead_letters()

    def _produce_dead_letters(self) -> None:
        """Hand the waiting dead letters to the producer, in order, once their topic's creation
        has answered; what its queue cannot take yet waits for a later step."""
        while self.dead_letters and self.dlq_topic_ready.is_set():
            topic, record, headers, delivered = self.dead_letters[0]
            try:
                self.dlq.produce(topic, key=record.key, value=record.value, headers=headers,
                                 on_delivery=delivered)
            except BufferError:
                return
            self.dead_letters.popleft()

    def _create_dead_letter_topic(self, topic: str) -> None:
        """(On a thread of its own: a source cluster that is slow to answer, up to the
        create's timeout, never holds up the loop.)"""
        try:
            if create_topic(AdminClient(admin_config(client_settings(self.t, "sender"))),
                            topic, 1):
                self.log.info("created the dead-letter topic %s", topic)
        except KafkaException as exc:  # the producer reports what this means for the record
            self.log.warning("could not create the dead-letter topic %s: %s", topic,
                             exc.args[0])
        finally:
            self.dlq_topic_ready.set()

    def _ack(self, tag):
        reader, msg_id = tag
        try:
            self.acks[reader].send(Acks([(msg_id, 1)]).encode(), zmq.NOBLOCK)
        except zmq.Again:
            pass  # the reader is gone; its successor re-reads from its commits

    def _dlq_done(self):
        """Every dead letter delivered (a step at a time: the drain's timeout bounds it)."""
        if self.dlq is None:
            return True
        self._produce_dead_letters()
        return not self.dead_letters and self.dlq.flush(0.05) == 0

    def close(self):
        if self.dlq is not None:
            self.dlq.flush(5)
