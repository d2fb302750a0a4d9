"""Asking the udp_reader to replay its receive journal: the receiver's replay-request protocol.

An unpacker or kafka_writer that restarts has lost what its predecessor held (a first start has
lost nothing: what was sent to it waited for it). It asks the udp_reader, on the reader's control
endpoint (diode.runtime.wiring: "replay"), to forward the journal again from the writers' lowest
checkpoint (a ReplayAsk: when it started, and its name), and asks again every ASK_AGAIN_SECONDS
until a Notice on each of its input streams (one per unpacker for a writer, the reader's for an
unpacker) says a replay began after it started. Until then it trusts no mark of that stream: a
mark from before the replay would checkpoint past what the predecessor lost.
ReplayRequest is the asking side, the reader answers with `waiting`.
"""

import time

import zmq

from diode.runtime import transport
from diode.runtime.messages import ReplayAsk

ASK_AGAIN_SECONDS = 1.0  # a replay asked for and not begun yet is asked again


class ReplayRequest:
    """The replay a (re)started worker waits for, over `streams` input streams (each carries
    its own notices and marks). On a first start (incarnation 1) there is nothing to ask and
    every stream is trusted at once."""

    __slots__ = ("ask_again", "sock", "started", "trusted", "who")

    def __init__(self, ctx, streams: int = 1, now: float | None = None):
        self.who = ctx.spec.name
        self.started = time.monotonic() if now is None else now
        self.trusted = [ctx.incarnation == 1] * streams
        self.sock = None
        if not self.settled:
            self.sock = transport.push(ctx.zmq, ctx.peers("replay"), 4)
            self._ask(self.started)
        self.ask_again = self.started + ASK_AGAIN_SECONDS

    @property
    def settled(self) -> bool:
        """Every stream's replay has begun (or none was needed): nothing more to ask."""
        return all(self.trusted)

    def trusts(self, stream: int = 0) -> bool:
        """Whether `stream`'s marks may be taken: its replay has begun (or none was needed)."""
        return self.trusted[stream]

    def tick(self, now: float) -> None:
        """Ask again when it is time (a step's call). Asked as of now: a notice that answered
        the first ask may have been lost with a restarting reader."""
        if not self.settled and now >= self.ask_again:
            self._ask(now)
            self.ask_again = now + ASK_AGAIN_SECONDS

    def noticed(self, replay_started: float, stream: int = 0) -> bool:
        """A Notice on `stream`: a replay began at `replay_started`. True when it answers this
        request (it began at or after this worker started): the stream is trusted from now."""
        if replay_started >= self.started:
            self.trusted[stream] = True
            return True
        return False

    def _ask(self, now: float) -> None:
        try:
            self.sock.send(ReplayAsk(now, self.who).encode(), zmq.NOBLOCK)
        except zmq.Again:
            pass  # the reader is not there yet: asked again later


def waiting(control: zmq.Socket, replay_started: float) -> list[str]:
    """The reader's side: who of the workers that asked (drained from `control`) started at or
    after the last replay began, so that replay does not cover what they lost."""
    asked = [ReplayAsk.decode(m[0]) for m in transport.drain(control, 64)]
    return [a.who for a in asked if a.started >= replay_started]
