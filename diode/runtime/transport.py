"""ZeroMQ plumbing between stages. Sockets are made in the child, after the fork.

Who binds: the receiving end of every queue (a packer's input, a reader's acknowledgements), so
a restarted worker comes back at the same ipc path and its peers reconnect by themselves.
Pushing sockets set IMMEDIATE, so nothing is queued towards a peer that is not there (a dead
packer); round robin then skips it.
"""

import pickle
import time
from collections import deque

import zmq


def pull(ctx: zmq.Context, endpoint: str, hwm: int) -> zmq.Socket:
    s = ctx.socket(zmq.PULL)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, hwm)
    s.bind(endpoint)
    return s


def push(ctx: zmq.Context, endpoints, hwm: int) -> zmq.Socket:
    """One PUSH socket connected to every endpoint: round robin among the live ones."""
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, hwm)
    s.setsockopt(zmq.IMMEDIATE, 1)
    for ep in endpoints:
        s.connect(ep)
    return s


def dumps(obj) -> bytes:
    """The control frame of a message between our own processes (never anything from the
    network), for diode.runtime.messages, where every kind is defined. Records never go through
    pickle: they travel as run frames (diode.link.runs)."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


loads = pickle.loads


def join(parts: list) -> tuple[list[int], bytes]:
    """Many small buffers as one frame and their lengths: a ZeroMQ frame costs about as much
    to send and receive as the bytes of a 1 500-byte datagram, so a batch of datagrams goes as
    one frame (`split` takes it apart)."""
    return [len(p) for p in parts], b"".join(parts)


def split(lengths: list[int], body: bytes) -> list[memoryview]:
    """The buffers `join` put in `body`, as views of it. Raises ValueError when the lengths do
    not add up to the body (never from the network: both ends are ours)."""
    view, out, at = memoryview(body), [], 0
    for n in lengths:
        out.append(view[at:at + n])
        at += n
    if at != len(body):
        raise ValueError(f"a batch of {len(body)} bytes holds {at} by its lengths")
    return out


def drain(sock: zmq.Socket, limit: int = 1 << 30):
    """Every message waiting on `sock` (at most `limit`), without blocking."""
    out = []
    while len(out) < limit:
        try:
            out.append(sock.recv_multipart(zmq.NOBLOCK, copy=True))
        except zmq.Again:
            break
    return out


def poller(*readable) -> zmq.Poller:
    """A poller of what may be read among `readable` (sockets, or file descriptors; None is
    left out)."""
    p = zmq.Poller()
    for one in readable:
        if one is not None:
            p.register(one, zmq.POLLIN)
    return p


def wait_for_room(outboxes, wait_ms: int, readable=()) -> bool:
    """Wait up to `wait_ms` for a peer of an outbox holding messages to have room for one
    (ZeroMQ's POLLOUT), or for one of `readable` (sockets, or file descriptors) to have
    something to read: how a stage held back by the stage after it waits without turning
    (it turned every millisecond in a sleep loop, 5-6 % of a core per process while a
    destination was behind). True when something is ready."""
    poller = zmq.Poller()
    for box in outboxes:
        if box.pending:
            poller.register(box.sock, zmq.POLLOUT)
    for one in readable:
        if one is not None:
            poller.register(one, zmq.POLLIN)
    return bool(poller.poll(wait_ms))


class Outbox:
    """Messages waiting for room downstream. A stage stops taking input while its outbox is
    full, which is how backpressure travels upstream without ever blocking a loop forever."""

    def __init__(self, sock: zmq.Socket, limit: int = 4):
        self.sock = sock
        self.limit = limit
        self.pending = deque()
        self._blocked = 0.0        # seconds spent with peers that would take nothing
        self._blocked_since = None

    def put(self, frames) -> None:
        self.pending.append(frames)
        self.flush()

    def flush(self) -> bool:
        """Send what the peers will take now; True when nothing is left."""
        while self.pending:
            try:
                self.sock.send_multipart(self.pending[0], zmq.NOBLOCK, copy=True)
            except zmq.Again:
                if self._blocked_since is None:
                    self._blocked_since = time.monotonic()
                return False
            self.pending.popleft()
        if self._blocked_since is not None:
            self._blocked += time.monotonic() - self._blocked_since
            self._blocked_since = None
        return True

    @property
    def blocked_seconds(self) -> float:
        """How long, in all, the peers downstream have taken nothing (backpressure): the
        stage after this one is the slower."""
        ongoing = time.monotonic() - self._blocked_since if self._blocked_since else 0.0
        return self._blocked + ongoing

    def clear(self) -> None:
        self.pending.clear()

    @property
    def full(self) -> bool:
        return len(self.pending) >= self.limit

    def __len__(self):
        return len(self.pending)
