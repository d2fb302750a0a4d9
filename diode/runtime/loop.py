"""What the runtime keeps for a stage's loop (diode.runtime.worker.Stage.step): its declared
inputs, which it polls and whose messages it decodes and hands over by kind, and its timers.

A stage declares both in `open()` (Stage.listen, Stage.every) and is then what it does to a
message and at its deadlines; the turn that calls them is Stage.step, the same for every stage.
"""

import zmq

from diode.runtime import transport


class Timer:
    """A stage's deadline: `fn(now)` runs at the first turn at or after `due`, then every
    `seconds` after that turn (so a slow turn delays the next run, never bunches them). It is a
    period, kept to within a turn: a loop turns at least every POLL_MS (a deadline that must
    end the wait for input, as the packer's linger, is what its before_input returns)."""

    __slots__ = ("due", "fn", "seconds")

    def __init__(self, seconds: float, fn, due: float):
        self.seconds, self.fn, self.due = seconds, fn, due

    def at(self, when: float) -> None:
        """Run next at `when` instead (sooner, or later), then every `seconds` again."""
        self.due = when


class Timers:
    """A stage's timers. A stage has a handful: each turn looks at every one (cheaper than a
    heap at that count)."""

    __slots__ = ("timers",)

    def __init__(self):
        self.timers: list[Timer] = []

    def add(self, timer: Timer) -> Timer:
        self.timers.append(timer)
        return timer

    def run(self, now: float) -> None:
        """Run each timer that is due, in the order they were declared."""
        for t in self.timers:
            if now >= t.due:
                t.due = now + t.seconds
                t.fn(now)


class Input:
    """A declared ZeroMQ input: a socket, how its first frame decodes (`decode`: a message
    class's decode, or a function of the frame choosing among kinds; None hands the frames as
    they are), who handles each kind (a function of (message, frames), or a dict of them by
    type), and how many messages a turn takes from it at most."""

    __slots__ = ("decode", "handle", "handlers", "limit", "sock")

    def __init__(self, sock: zmq.Socket, handle, decode=None, limit: int = 16):
        self.sock, self.decode, self.limit = sock, decode, limit
        if isinstance(handle, dict):
            self.handlers, self.handle = handle, self._by_kind
        else:
            self.handlers, self.handle = None, handle

    def _by_kind(self, message, frames) -> None:
        self.handlers[type(message)](message, frames)

    def take(self) -> int:
        """Hand over what waits on the socket (at most `limit` messages); how many."""
        waiting = transport.drain(self.sock, self.limit)
        decode, handle = self.decode, self.handle
        for frames in waiting:
            handle(frames if decode is None else decode(frames[0]), frames)
        return len(waiting)


class Inputs:
    """A stage's declared inputs: polled together, each ready one taken. `wakeup`, a file
    descriptor (the worker's signal wake-up: diode.runtime.worker.Wakeup), ends the wait too."""

    __slots__ = ("inputs", "poller", "wakeup")

    def __init__(self, wakeup=None):
        self.inputs: list[Input] = []
        self.poller = None
        self.wakeup = wakeup

    def add(self, one: Input) -> Input:
        self.inputs.append(one)
        if len(self.inputs) > 1 or self.wakeup is not None:
            self.poller = zmq.Poller()
            for i in self.inputs:
                self.poller.register(i.sock, zmq.POLLIN)
            if self.wakeup is not None:
                self.poller.register(self.wakeup, zmq.POLLIN)
        return one

    def __bool__(self) -> bool:
        return bool(self.inputs)

    def poll(self, wait_ms: int) -> list[Input]:
        """The inputs with something waiting, after waiting up to `wait_ms` for one."""
        if self.poller is None:
            one = self.inputs[0]
            return [one] if one.sock.poll(wait_ms) else []
        ready = dict(self.poller.poll(wait_ms))
        return [i for i in self.inputs if i.sock in ready]

    @staticmethod
    def take(ready: list[Input]) -> None:
        for one in ready:
            one.take()
