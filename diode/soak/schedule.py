"""The soak's fault schedule: a YAML file of faults at times or intervals, checked whole before
anything starts, or the built-in schedule that runs every kind of fault at least once.

    seed: 7                  # optional; else --seed
    faults:
      - at: 30s              # from the soak's start: 90, "90", "90s", "1m30s", "2h", "1h5m"
        kind: link-loss
        duration: 20s
        loss: 0.02
      - every: 10m           # at start, start+every, ... while it ends within the soak
        start: 5m            # default: every
        kind: kill-worker
        side: receiver

KINDS is the registry of kinds, their parameters, defaults and checks; docs/soak.md explains
each. Link faults (link-*) are applied one at a time; process faults of one kind too.
"""

import difflib
import math
import random
import re
from dataclasses import dataclass

import yaml

from diode.errors import DiodeError
from diode.runtime.topology import PIPELINES


class ScheduleError(DiodeError):
    """A fault schedule is invalid. The message names every problem, one a line."""


def _fail(where: str, problems: list) -> ScheduleError:
    lines = "\n".join(f"  {p}" for p in problems)
    return ScheduleError(f"{where}: {len(problems)} problem(s)\n{lines}")


# -- durations ---------------------------------------------------------------------------------

_DURATION = re.compile(r"(?:(\d+(?:\.\d*)?)h)?(?:(\d+(?:\.\d*)?)m)?(?:(\d+(?:\.\d*)?)s?)?")


def parse_duration(value) -> float:
    """90, 1.5, "90", "90s", "1m30s", "2h", "1h5m" -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise ScheduleError(f"{value!r}: a duration must be 0 or more seconds")
        return float(value)
    m = _DURATION.fullmatch(value.replace(" ", "").lower()) if isinstance(value, str) else None
    if not m or not any(m.groups()):
        raise ScheduleError(f"{value!r} is not a duration (90, 90s, 1m30s, 2h)")
    h, mins, s = (float(g or 0) for g in m.groups())
    return h * 3600 + mins * 60 + s


def format_duration(seconds: float) -> str:
    """90 -> '1m30s', 3600 -> '1h', 2.5 -> '2.5s', 0 -> '0s'."""
    h, rest = divmod(round(float(seconds), 1), 3600)
    m, s = divmod(round(rest, 1), 60)
    s = round(s, 1)
    text = (f"{int(h)}h" if h else "") + (f"{int(m)}m" if m else "")
    return text + (f"{s:g}s" if s or not text else "")


# -- the registry of kinds: each parameter's default and (what it must be, its test) -----------

def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


PROBABILITY = ("a probability in (0, 1]", lambda v: _number(v) and 0 < v <= 1)
ABOVE_0 = ("more than 0", lambda v: _number(v) and v > 0)
COUNT = ("a whole number of at least 1", lambda v: _number(v) and isinstance(v, int) and v >= 1)
SECONDS = ("more than 0s", lambda v: v > 0)  # duration and down: after parse_duration
SECONDS_OR_0 = ("0s or more", lambda v: v >= 0)
LENGTHS = ("duration", "down")  # how long a fault lasts; not in Fault.params
SIDE = ("sender, receiver or any", lambda v: v in ("sender", "receiver", "any"))
ALL_STAGES = PIPELINES["sender"] + PIPELINES["receiver"]
STAGE = ("one of " + ", ".join(ALL_STAGES), lambda v: v is None or v in ALL_STAGES)
SIGNAL = ("term or kill", lambda v: v in ("term", "kill"))
KINDS = {
    "link-loss": {"duration": (30.0, SECONDS), "loss": (0.01, PROBABILITY)},
    "link-burst": {"duration": (30.0, SECONDS), "probability": (0.002, PROBABILITY),
                   "length": (20, COUNT)},
    "link-reorder": {"duration": (30.0, SECONDS), "probability": (0.05, PROBABILITY),
                     "delay_ms": (50.0, ABOVE_0)},
    "link-duplicate": {"duration": (30.0, SECONDS), "probability": (0.05, PROBABILITY)},
    "link-corrupt": {"duration": (30.0, SECONDS), "probability": (0.01, PROBABILITY)},
    "link-delay": {"duration": (30.0, SECONDS), "delay_ms": (200.0, ABOVE_0)},
    "link-down": {"duration": (10.0, SECONDS)},
    "kill-worker": {"side": ("any", SIDE), "stage": (None, STAGE)},
    "sender-restart": {"down": (2.0, SECONDS_OR_0), "signal": ("term", SIGNAL)},
    "receiver-restart": {"down": (5.0, SECONDS_OR_0), "signal": ("term", SIGNAL)},
    "destination-pause": {"duration": (20.0, SECONDS)},
    "destination-stop": {"duration": (20.0, SECONDS)},
    "source-pause": {"duration": (20.0, SECONDS)},
}
# The kinds that may make records go missing; the others must lose nothing.
LOSSY = frozenset({"link-loss", "link-burst", "link-corrupt", "link-down", "kill-worker",
                   "sender-restart", "receiver-restart"})
TIMING = ("at", "every", "start")


def _length_key(kind: str) -> str | None:
    """The parameter that says how long a fault of this kind lasts: duration, down or none."""
    return next((k for k in LENGTHS if k in KINDS[kind]), None)


@dataclass(frozen=True)
class Fault:
    kind: str
    start: float     # seconds from the soak's start
    duration: float  # seconds (0 for kill-worker, `down` for restarts)
    params: dict     # the kind's other parameters, defaults filled in
    seed: int        # this fault's own seed

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def link(self) -> bool:
        return self.kind.startswith("link-")

    def describe(self) -> str:
        """One line for logs: 'link-loss loss=0.02 for 20s', 'kill-worker side=receiver'."""
        words = [self.kind] + [f"{k}={v}" for k, v in self.params.items() if v is not None]
        length = _length_key(self.kind)
        if length:
            words.append(f"{'for' if length == 'duration' else 'down'} "
                         f"{format_duration(self.duration)}")
        return " ".join(words)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "start": self.start, "end": self.end,
                "duration": self.duration, "seed": self.seed, **self.params}


# -- reading a schedule ------------------------------------------------------------------------

def _label(i: int, entry: dict) -> str:
    """How problems name an entry, as the file has it: 'faults[2] (link-loss at 30s)'."""
    when = next((f" {k} {entry[k]}" for k in ("at", "every") if k in entry), "")
    return f"faults[{i}] ({entry.get('kind', '?')}{when})"


def _params(kind: str, entry: dict, name: str, problems: list) -> dict:
    """The kind's parameters from one entry, defaults filled in, with its problems added."""
    spec, params = KINDS[kind], {}
    for key, value in entry.items():
        if key in TIMING or key == "kind":
            continue
        if key not in spec:
            hint = difflib.get_close_matches(str(key), spec, n=1)
            problems.append(f"{name}: unknown key {key!r}" + (f" (did you mean {hint[0]}?)"
                            if hint else f"; {kind} takes {', '.join(spec) or 'nothing'}"))
            continue
        must, ok = spec[key][1]
        try:
            value = parse_duration(value) if key in LENGTHS else value
        except ScheduleError as exc:
            problems.append(f"{name}: {key}: {exc}")
            continue
        if not ok(value):
            problems.append(f"{name}: {key} must be {must}, not {value!r}")
        else:
            params[key] = value
    params = {key: params.get(key, default) for key, (default, _) in spec.items()}
    side, stage = params.get("side"), params.get("stage")
    if stage and side in PIPELINES and stage not in PIPELINES[side]:
        problems.append(f"{name}: stage {stage} is not on the {side} side "
                        f"({', '.join(PIPELINES[side])})")
    return params


def _starts(entry: dict, length: float, duration: float, name: str, problems: list) -> list:
    """The start times of one entry: its `at`, or every `every` from `start` within the soak."""
    if ("at" in entry) == ("every" in entry) or ("start" in entry and "every" not in entry):
        problems.append(f"{name}: give either `at`, or `every` with an optional `start`")
        return []
    try:
        times = {k: parse_duration(entry[k]) for k in TIMING if k in entry}
    except ScheduleError as exc:
        problems.append(f"{name}: {exc}")
        return []
    if "at" in times:
        return [times["at"]]
    every, first = times["every"], times.get("start", times["every"])
    if every < 1:
        problems.append(f"{name}: every must be at least 1s")
        return []
    starts = [first + n * every for n in range(int((duration - length - first) // every) + 1)]
    if not starts:
        problems.append(f"{name}: does not fit in the soak's {format_duration(duration)} "
                        f"even once (from {format_duration(first)}, lasting "
                        f"{format_duration(length)})")
    return starts


def from_dict(data, duration: float, seed: int, where: str = "<schedule>") -> list[Fault]:
    """The faults of a parsed schedule, sorted by start (ties in file order). Raises
    ScheduleError naming every problem."""
    if not isinstance(data, dict):
        raise _fail(where, ["(top level): must be a mapping with faults: (a list) and an "
                            "optional seed:"])
    problems = [f"{key}: unknown key; a schedule has faults and seed" for key in data
                if key not in ("faults", "seed")]
    if "seed" in data:
        if isinstance(data["seed"], int) and not isinstance(data["seed"], bool):
            seed = data["seed"]
        else:
            problems.append(f"seed: must be a whole number, not {data['seed']!r}")
    entries = data.get("faults")
    if not isinstance(entries, list):
        problems.append("faults: required, a list of faults")
        entries = []
    placed = []  # (start, entry index, kind, length, params, label)
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"faults[{i}]: must be a mapping (kind, at or every, parameters)")
            continue
        name, kind = _label(i, entry), entry.get("kind")
        if kind not in KINDS:
            problems.append(f"{name}: " + (f"unknown kind {kind!r}" if "kind" in entry else
                                           "no kind") + f"; the kinds are {', '.join(KINDS)}")
            continue
        params = _params(kind, entry, name, problems)
        length = params.pop(_length_key(kind), 0.0)
        for t in _starts(entry, length, duration, name, problems):
            placed.append((t, i, kind, length, params,
                           name if "at" in entry else f"{name} at {format_duration(t)}"))
    placed.sort(key=lambda p: (p[0], p[1]))
    # each fault's own seed: from the schedule's and its place in the sorted list
    faults = [Fault(kind, t, length, dict(params), random.Random(f"{seed}:{n}").getrandbits(31))
              for n, (t, _, kind, length, params, _) in enumerate(placed)]
    problems += _timing_problems(faults, [p[1] for p in placed], [p[5] for p in placed],
                                 duration)
    if problems:
        raise _fail(where, problems)
    return faults


def _timing_problems(faults: list, entries: list, names: list, duration: float) -> list:
    """Faults that end after the soak; link faults at once; process faults of one kind at once
    (each pair of entries named once)."""
    problems, latest, reported = [], {}, set()
    for f, entry, name in zip(faults, entries, names):
        if f.end > duration:
            problems.append(f"{name}: ends at {format_duration(f.end)}, after the soak's "
                            f"{format_duration(duration)}")
        track = "link" if f.link else f.kind
        if track in latest:
            other, other_entry, other_name = latest[track]
            if (f.start < other.end or f.start == other.start) \
                    and (other_entry, entry) not in reported:
                reported.add((other_entry, entry))
                problems.append(f"{other_name} and {name} overlap: " + (
                    "one link fault at a time" if f.link else f"one {f.kind} at a time"))
            if other.end >= f.end:
                continue
        latest[track] = (f, entry, name)
    return problems


def load(path, duration: float, seed: int) -> list[Fault]:
    """The faults of a YAML schedule file; ScheduleError naming the path if it cannot be read."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise _fail(str(path), [f"cannot read the fault schedule: {exc.strerror or exc}"]) \
            from None
    except yaml.YAMLError as exc:
        raise _fail(str(path), [f"not valid YAML: {exc}"]) from None
    return from_dict(data, duration, seed, where=str(path))


# -- the built-in schedule ---------------------------------------------------------------------

LINK_CHANNEL = [("link-loss", {"loss": 0.01}),
                ("link-burst", {"probability": 0.002, "length": 20}),
                ("link-reorder", {"probability": 0.05, "delay_ms": 50.0}),
                ("link-duplicate", {"probability": 0.05}),
                ("link-corrupt", {"probability": 0.01}),
                ("link-delay", {"delay_ms": 200.0}),
                ("link-down", {})]
PROCESS_CHANNEL = [("kill-worker", {"side": "receiver"}), ("kill-worker", {"side": "sender"}),
                   ("source-pause", {}), ("destination-pause", {}), ("receiver-restart", {}),
                   ("destination-stop", {}), ("sender-restart", {})]
LONGEST = {"link-down": 15.0, "destination-stop": 45.0, "destination-pause": 45.0,
           "source-pause": 30.0, "receiver-restart": 5.0, "sender-restart": 2.0}
MIN_DEFAULT_SECONDS = 60.0


def default_schedule(duration: float, seed: int, leave_out: frozenset = frozenset()) -> list:
    """Every kind at least once (once more per 20 minutes), link faults in sequence on one
    channel and process faults on another, in equal slots between the quiet first tenth (at
    least 10 s) and last 15 % (at least 25 s) of the soak; without the kinds in `leave_out`
    (those the soak cannot inject here). Checked like a file."""
    if duration < MIN_DEFAULT_SECONDS:
        raise _fail("the built-in schedule", [
            f"needs a soak of at least {format_duration(MIN_DEFAULT_SECONDS)}, not "
            f"{format_duration(duration)}"])
    first, last = max(10.0, duration * 0.1), duration - max(25.0, duration * 0.15)
    cycles = max(1, int(duration // 1200))
    entries = []
    for channel in (LINK_CHANNEL, PROCESS_CHANNEL):
        faults = [(kind, params) for kind, params in channel if kind not in leave_out] * cycles
        slot = (last - first) / max(1, len(faults))
        for n, (kind, params) in enumerate(faults):
            # starts rounded up and lengths down to 0.1 s: still inside the slot
            entry = {"kind": kind, "at": math.ceil(round((first + n * slot) * 10, 6)) / 10,
                     **params}
            if length := _length_key(kind):
                entry[length] = math.floor(min(slot / 2, LONGEST.get(kind, 120.0)) * 10) / 10
            entries.append(entry)
    return from_dict({"faults": entries}, duration, seed, where="the built-in schedule")
