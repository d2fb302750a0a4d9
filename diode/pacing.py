"""Pacing the sender to the link rate with sub-millisecond precision.

A diode link drops what it cannot carry and nobody tells the sender, so the sender must never
burst above the configured rate. `Pacer.wait(n)` returns when `n` more bytes may leave: it sleeps
while the deadline is far and spins for the last fraction of a millisecond (time.sleep alone
overshoots by 50-100 µs on Linux).
"""

import time

SPIN_SECONDS = 0.0003


class Pacer:
    def __init__(self, bytes_per_second: float, burst_bytes: int = 0,
                 clock=time.perf_counter, sleep=time.sleep):
        self.rate = bytes_per_second
        self.burst = burst_bytes / bytes_per_second if bytes_per_second else 0.0
        self._clock = clock
        self._sleep = sleep
        self._next = clock()

    def delay(self, nbytes: int) -> float:
        """Reserve `nbytes`; returns how many seconds to wait before sending them."""
        if not self.rate:
            return 0.0
        now = self._clock()
        # Idle time earns at most `burst` seconds of credit.
        start = max(self._next, now - self.burst)
        self._next = start + nbytes / self.rate
        return max(0.0, start - now)

    def wait(self, nbytes: int) -> None:
        wait = self.delay(nbytes)
        if wait <= 0:
            return
        deadline = self._clock() + wait
        if wait > SPIN_SECONDS:
            self._sleep(wait - SPIN_SECONDS)
        while self._clock() < deadline:
            pass
