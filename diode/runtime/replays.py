"""Asking the udp_reader to replay its receive journal: the receiver's control queue.

An unpacker or kafka_writer that restarts has lost what its predecessor held (a first start has
lost nothing: what was sent to it waited for it). It asks the udp_reader, on the reader's control
endpoint (diode.runtime.wiring: "replay"), to forward the journal again from the writers' lowest
checkpoint, and asks again until a ("notice", started) in its input says a replay started after
it did. An ask is ("replay", started, who): when the asking worker started (the reader's clock is
CLOCK_MONOTONIC too) and its name, for the reader's log.
"""

import zmq

from diode.runtime import transport


def request_replay(ctx, started: float) -> zmq.Socket:
    """Ask the reader to replay the journal for a worker that (re)started at `started`. Returns
    the socket, to ask again with `ask` until a notice answers."""
    sock = transport.push(ctx.zmq, ctx.peers("replay"), 4)
    ask(sock, ctx.spec.name, started)
    return sock


def ask(sock: zmq.Socket, who: str, started: float) -> None:
    try:
        sock.send(transport.dumps(("replay", started, who)), zmq.NOBLOCK)
    except zmq.Again:
        pass  # the reader is not there yet: asked again later


def waiting(control: zmq.Socket, replay_started: float) -> list[str]:
    """The reader's side: who of the workers that asked (drained from `control`) started at or
    after the last replay began, so that replay does not cover what they lost."""
    asked = [transport.loads(m[0]) for m in transport.drain(control, 64)]
    return [who for _, started, who in asked if started >= replay_started]
