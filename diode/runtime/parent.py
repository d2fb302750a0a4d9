"""A process diode starts (a worker, a side's metrics exporter, an embedded broker) ends when
the process that started it dies, however it dies, SIGKILL included: Linux's
PR_SET_PDEATHSIG, set in the child (in a worker as it starts, in a broker between fork and
exec). The signal comes when the *thread* that started the child ends, not its whole process.
"""

import ctypes
import signal

PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have `sig` sent to this process when its parent (thread) dies; nothing where the C
    library has no prctl."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass
