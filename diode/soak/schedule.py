"""The soak's fault schedule: a YAML file of faults at times or intervals, checked whole
before anything starts, or the built-in schedule that runs every kind at least once.

    seed: 7                  # optional; else --seed
    faults:
      - at: 30s              # 30, "30s", "1m30s", "2h"
        kind: link-loss
        duration: 20s
        loss: 0.02
      - every: 10m           # at start, start+every, ... while it ends within the soak
        start: 5m            # default: every
        kind: kill-worker
        side: receiver

The kinds and their parameters are KINDS; docs/soak.md explains each.
"""

import random
import re
from dataclasses import dataclass

import yaml

from diode.errors import DiodeError

STAGES = {"sender": ("kafka_reader", "packer", "udp_sender"),
          "receiver": ("udp_reader", "unpacker", "kafka_writer")}


def _probability(v) -> bool:
    return isinstance(v, (int, float)) and 0 < v <= 1


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and v > 0


def _count(v) -> bool:
    return isinstance(v, int) and v >= 1


def _one_of(*choices):
    return lambda v: v in choices


P, POS, N = (_probability, "a probability in (0, 1]"), (_positive, "above 0"), \
    (_count, "a whole number of at least 1")
SIDE = (_one_of("sender", "receiver", "any"), "sender, receiver or any")
STAGE = (_one_of(*STAGES["sender"], *STAGES["receiver"]), "a stage: "
         + ", ".join(STAGES["sender"] + STAGES["receiver"]))
SIGNAL = (_one_of("term", "kill"), "term or kill")
DURATION = "duration"  # parsed by parse_duration
# kind -> (its length parameter or None, {parameter: (default, (check, what it must be))})
KINDS = {
    "link-loss": ("duration", {"duration": (30.0, DURATION), "loss": (0.01, P)}),
    "link-burst": ("duration", {"duration": (30.0, DURATION), "probability": (0.002, P),
                                "length": (20, N)}),
    "link-reorder": ("duration", {"duration": (30.0, DURATION), "probability": (0.05, P),
                                  "delay_ms": (50.0, POS)}),
    "link-duplicate": ("duration", {"duration": (30.0, DURATION), "probability": (0.05, P)}),
    "link-corrupt": ("duration", {"duration": (30.0, DURATION), "probability": (0.01, P)}),
    "link-delay": ("duration", {"duration": (30.0, DURATION), "delay_ms": (200.0, POS)}),
    "link-down": ("duration", {"duration": (10.0, DURATION)}),
    "kill-worker": (None, {"side": ("any", SIDE), "stage": (None, STAGE)}),
    "sender-restart": ("down", {"down": (2.0, DURATION), "signal": ("term", SIGNAL)}),
    "receiver-restart": ("down", {"down": (5.0, DURATION), "signal": ("term", SIGNAL)}),
    "destination-pause": ("duration", {"duration": (20.0, DURATION)}),
    "destination-stop": ("duration", {"duration": (20.0, DURATION)}),
    "source-pause": ("duration", {"duration": (20.0, DURATION)}),
}
# The kinds that may make records go missing; the others must lose nothing.
LOSSY = frozenset({"link-loss", "link-burst", "link-corrupt", "link-down", "kill-worker",
                   "sender-restart", "receiver-restart"})
MIN_DEFAULT_SECONDS = 60.0


class ScheduleError(DiodeError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float     # seconds from the soak's start
    duration: float  # seconds (0 for kill-worker, `down` for restarts)
    params: dict     # the kind's parameters, defaults filled in, without duration/down
    seed: int        # this fault's own seed

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def link(self) -> bool:
        return self.kind.startswith("link-")

    def describe(self) -> str:
        shown = " ".join(f"{k}={v}" for k, v in self.params.items() if v is not None)
        length = KINDS[self.kind][0]
        span = f" for {format_duration(self.duration)}" if length == "duration" else \
            f" down {format_duration(self.duration)}" if length else ""
        return f"{self.kind}{' ' + shown if shown else ''}{span}"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "start": self.start, "end": self.end,
                "duration": self.duration, "seed": self.seed, **self.params}


def format_duration(seconds: float) -> str:
    """90 -> '1m30s', 3600 -> '1h', 2.5 -> '2.5s'."""
    s = round(float(seconds), 1)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    sec = round(sec, 1)
    sec = int(sec) if float(sec).is_integer() else sec
    text = (f"{int(h)}h" if h else "") + (f"{int(m)}m" if m else "") + \
        (f"{sec}s" if sec or not (h or m) else "")
    return text


_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def parse_duration(value) -> float:
    """'1m30s', '2h', '45', 45, 1.5 -> seconds."""
    if isinstance(value, bool):
        raise ScheduleError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
                raise ScheduleError(f"{value!r} is not a duration (90, 90s, 1m30s, 2h)") \
                    from None
            seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if seconds < 0:
        raise ScheduleError(f"{value!r}: a duration is not negative")
    return seconds


def _fault_seed(seed: int, index: int) -> int:
    return random.Random(f"{seed}:{index}").getrandbits(31)


def _entry(entry, where: str, problems: list):
    """(kind, length, params, starts) of one entry, or None, with its problems added."""
    if not isinstance(entry, dict):
        problems.append(f"{where}: a fault is a mapping (kind, at or every, parameters)")
        return None
    kind = entry.get("kind")
    if kind not in KINDS:
        problems.append(f"{where}: unknown kind {kind!r}; the kinds are "
                        + ", ".join(KINDS))
        return None
    where = f"{where} ({kind})"
    length_key, spec = KINDS[kind]
    timing = {k: entry[k] for k in ("at", "every", "start") if k in entry}
    params = {}
    for key, value in entry.items():
        if key in ("kind", "at", "every", "start"):
            continue
        if key not in spec:
            problems.append(f"{where}: unknown key {key!r}; it takes "
                            + ", ".join(spec) if spec else f"{where}: unknown key {key!r}")
            continue
        check = spec[key][1]
        if check == DURATION:
            try:
                params[key] = parse_duration(value)
            except ScheduleError as exc:
                problems.append(f"{where}: {key}: {exc}")
        elif not check[0](value):
            problems.append(f"{where}: {key} must be {check[1]}, not {value!r}")
        else:
            params[key] = value
    for key, (default, _) in spec.items():
        params.setdefault(key, default)
    if kind == "kill-worker" and params["stage"] and params["side"] != "any" \
            and params["stage"] not in STAGES[params["side"]]:
        problems.append(f"{where}: stage {params['stage']} is not on the {params['side']} side")
    if ("at" in timing) == ("every" in timing) or ("start" in timing and "every" not in timing):
        problems.append(f"{where}: give `at`, or `every` (with an optional `start`)")
        return None
    try:
        times = {k: parse_duration(v) for k, v in timing.items()}
    except ScheduleError as exc:
        problems.append(f"{where}: {exc}")
        return None
    length = params.pop(length_key) if length_key else 0.0
    if "at" in times:
        return kind, length, params, [times["at"]], where
    if times["every"] <= 0:
        problems.append(f"{where}: every must be above 0")
        return None
    return kind, length, params, ("every", times.get("start", times["every"]),
                                  times["every"]), where


def from_dict(data, duration: float, seed: int, where: str = "<schedule>") -> list:
    """The faults of a parsed schedule, sorted by start; ScheduleError listing every problem."""
    problems = []
    if not isinstance(data, dict) or not isinstance(data.get("faults"), list):
        raise ScheduleError(f"{where}: a schedule is a mapping with `faults:` (a list) and an "
                            "optional `seed:`")
    for key in set(data) - {"faults", "seed"}:
        problems.append(f"{where}: unknown key {key!r} (faults, seed)")
    if "seed" in data:
        if isinstance(data["seed"], int) and not isinstance(data["seed"], bool):
            seed = data["seed"]
        else:
            problems.append(f"{where}: seed must be a whole number")
    placed = []  # (start, order, kind, length, params, where)
    for i, entry in enumerate(data["faults"]):
        parsed = _entry(entry, f"{where}: faults[{i}]", problems)
        if parsed is None:
            continue
        kind, length, params, starts, at = parsed
        if starts and starts[0] == "every":
            _, first, every = starts
            starts = []
            t = first
            while t + length <= duration:
                starts.append(t)
                t += every
            if not starts:
                problems.append(f"{at}: does not fit in the soak's {format_duration(duration)} "
                                "even once")
        for t in starts:
            placed.append((t, len(placed), kind, length, params, at))
    placed.sort(key=lambda p: (p[0], p[1]))
    faults = [Fault(kind, t, length, dict(params), _fault_seed(seed, n))
              for n, (t, _, kind, length, params, _) in enumerate(placed)]
    names = [p[5] for p in placed]
    problems += _overlaps(faults, names, duration)
    if problems:
        raise ScheduleError("\n".join(problems))
    return faults


def _overlaps(faults: list, names: list, duration: float) -> list:
    problems = []
    for f, name in zip(faults, names):
        if f.end > duration:
            problems.append(f"{name} at {format_duration(f.start)}: ends at "
                            f"{format_duration(f.end)}, after the soak's "
                            f"{format_duration(duration)}")
    for i, (a, an) in enumerate(zip(faults, names)):
        for b, bn in zip(faults[i + 1:], names[i + 1:]):
            if b.start >= a.end and not (a.duration == 0 and b.start == a.start):
                continue
            if a.link and b.link:
                problems.append(f"{an} at {format_duration(a.start)} and {bn} at "
                                f"{format_duration(b.start)} overlap: one link fault at a time")
            elif a.kind == b.kind and not a.link:
                problems.append(f"{an} at {format_duration(a.start)} and {bn} at "
                                f"{format_duration(b.start)} overlap")
    return problems


def load(path, duration: float, seed: int) -> list:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ScheduleError(f"fault schedule {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ScheduleError(f"fault schedule {path} is not valid YAML: {exc}") from None
    return from_dict(data, duration, seed, where=str(path))


LINK_TRACK = [("link-loss", {"loss": 0.01}),
              ("link-burst", {"probability": 0.002, "length": 20}),
              ("link-reorder", {"probability": 0.05, "delay_ms": 50}),
              ("link-duplicate", {"probability": 0.05}),
              ("link-corrupt", {"probability": 0.01}),
              ("link-delay", {"delay_ms": 200}),
              ("link-down", {})]
PROCESS_TRACK = [("kill-worker", {"side": "receiver"}), ("kill-worker", {"side": "sender"}),
                 ("source-pause", {}), ("destination-pause", {}), ("receiver-restart", {}),
                 ("destination-stop", {}), ("sender-restart", {})]
CAPS = {"link-down": 15.0, "destination-stop": 45.0, "destination-pause": 45.0,
        "source-pause": 30.0, "receiver-restart": 5.0, "sender-restart": 2.0}


def default_schedule(duration: float, seed: int, leave_out: frozenset = frozenset()) -> list:
    """Every kind at least once (once per 20 minutes), link faults on one track and process
    faults on another, the first tenth and the last 15 % (at least 25 s) of the soak quiet;
    without the kinds in `leave_out` (those the soak cannot inject here)."""
    if duration < MIN_DEFAULT_SECONDS:
        raise ScheduleError(f"the built-in schedule needs a soak of at least "
                            f"{format_duration(MIN_DEFAULT_SECONDS)}")
    first = max(10.0, duration * 0.1)
    last = duration - max(25.0, duration * 0.15)
    cycles = max(1, int(duration // 1200))
    entries = []
    for track in (LINK_TRACK, PROCESS_TRACK):
        faults = [(kind, params) for kind, params in track if kind not in leave_out] * cycles
        slot = (last - first) / len(faults)
        for n, (kind, params) in enumerate(faults):
            length_key = KINDS[kind][0]
            entry = {"kind": kind, "at": round(first + n * slot, 1), **params}
            if length_key:
                entry[length_key] = round(min(slot / 2, CAPS.get(kind, 120.0)), 1)
            entries.append(entry)
    return from_dict({"faults": entries}, duration, seed, where="the built-in schedule")
