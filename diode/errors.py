"""Errors that carry their context: which setting, which datagram, which stage."""


class DiodeError(Exception):
    """Base class for every error diode raises on purpose."""


class TopologyError(DiodeError):
    """A topology file is invalid. Holds every problem found, each with its key path."""

    def __init__(self, path, problems):
        self.path = str(path)
        self.problems = list(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{self.path}: {len(self.problems)} error(s)\n{lines}")


class RejectedDatagram(DiodeError):
    """A datagram was dropped. `reason` is the metrics label (bad_magic, auth_failed, ...)."""

    def __init__(self, reason, detail=""):
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


class SecretError(DiodeError):
    """A key, password or salt could not be loaded."""


class ClusterError(DiodeError):
    """A Kafka cluster a command talks to cannot be used: its client settings cannot be made,
    or it did not answer, refused them, or failed TLS. Names the setting to check, never a
    secret's value; the command exits 2."""
