"""Per-process counters and gauges, written in Prometheus text format.

Each worker writes `<run dir>/metrics/<side>-<stage>-<index>.prom` about once a second (atomic
rename), so operators, `diode status` and tests read them without asking the process.
"""

import os
import time
from collections import defaultdict
from pathlib import Path


class Metrics:
    def __init__(self, labels: dict, path: str | None = None, interval: float = 1.0):
        self.labels = labels
        self.counters: dict[tuple, float] = defaultdict(float)
        self.gauges: dict[tuple, float] = {}
        self.path = path
        self.interval = interval
        self._next_write = 0.0

    def inc(self, name: str, n: float = 1, **labels) -> None:
        self.counters[(name, tuple(sorted(labels.items())))] += n

    def set(self, name: str, value: float, **labels) -> None:
        self.gauges[(name, tuple(sorted(labels.items())))] = value

    def get(self, name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return self.counters.get(key, self.gauges.get(key, 0))

    def text(self) -> str:
        lines = []
        for kind, table in (("counter", self.counters), ("gauge", self.gauges)):
            for name in sorted({n for n, _ in table}):
                full = f"diode_{name}"
                lines.append(f"# TYPE {full} {kind}")
                for (n, labels), value in sorted(table.items()):
                    if n != name:
                        continue
                    all_labels = {**self.labels, **dict(labels)}
                    text = ",".join(f'{k}="{v}"' for k, v in all_labels.items())
                    shown = int(value) if float(value).is_integer() else repr(float(value))
                    lines.append(f"{full}{{{text}}} {shown}")
        return "\n".join(lines) + "\n"

    def due(self) -> bool:
        return time.monotonic() >= self._next_write

    def maybe_write(self, force: bool = False) -> None:
        if not self.path:
            return
        now = time.monotonic()
        if not force and now < self._next_write:
            return
        self._next_write = now + self.interval
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(self.text())
        os.replace(tmp, self.path)


def read_counter(text: str, name: str, **labels) -> float:
    """Sum of a metric's samples in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(f"diode_{name}{{"):
            continue
        label_text, value = line[len(name) + 7:].rsplit("} ", 1)
        found = dict(part.split("=", 1) for part in label_text.split(",") if part)
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
    return total
