"""The connector's configuration as files hold it: java.util.Properties (`.properties`, what
Connect workers and connectors read), or the JSON a Connect REST API takes; and which connector,
the sink (high side) or the source (low side), each file configures. Bad input (an unreadable
file, a malformed line or escape, a file of neither connector) is a PropertiesError naming the
file and the line or property.
"""

import json
import re
import string
from dataclasses import dataclass
from pathlib import Path

from diode.errors import DiodeError

SINK, SOURCE = "sink", "source"
SIDE_OF = {SINK: "sender", SOURCE: "receiver"}
CONNECTOR_CLASS = {SINK: "DataDiodeSinkConnector", SOURCE: "DataDiodeSourceConnector"}


class PropertiesError(DiodeError):
    """Input that cannot be imported: which file, which line or property, what is wrong."""


@dataclass(frozen=True)
class Config:
    """One file read: where it came from (for messages), its properties in file order, and
    whether it is a Connect worker's file (connect-standalone.properties) or a connector's."""
    path: str
    props: dict
    worker: bool = False


# -- java.util.Properties ---------------------------------------------------------------------

_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str, path: str = "<text>") -> dict:
    """Properties as java.util.Properties.load reads them: `key=value`, `key: value` or
    `key value`; `#` and `!` comment lines; a line ending in an odd number of backslashes goes
    on with the next (its leading whitespace dropped); \\t \\n \\r \\f \\uXXXX escapes, and a
    backslash before any other character stands for that character. The last of a repeated key
    wins, as in Java. Raises PropertiesError naming the line of a malformed \\u escape."""
    props = {}
    for lineno, line in _logical_lines(text):
        key, value = _split(line)
        props[_unescape(key, path, lineno)] = _unescape(value, path, lineno)
    return props


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _logical_lines(text: str):
    """(number of the first natural line, logical line): blank and comment lines dropped,
    continued lines joined. A comment line never continues."""
    lines = re.split(r"\r\n|\r|\n", text)
    i = 0
    while i < len(lines):
        start, line = i + 1, lines[i].lstrip(_WS)
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line):
            line = line[:-1]
            if i == len(lines):
                break  # a continuation at the end of the file continues with nothing
            line += lines[i].lstrip(_WS)
            i += 1
        yield start, line


def _split(line: str) -> tuple[str, str]:
    """Key and (still escaped) value: the key ends at the first unescaped `=`, `:` or
    whitespace; one separator, with whitespace around it, comes before the value."""
    i = 0
    while i < len(line) and line[i] not in "=:" + _WS:
        i += 2 if line[i] == "\\" else 1
    key, rest = line[:i], line[i:]
    separated = rest[:1] in ("=", ":")
    rest = (rest[1:] if separated else rest).lstrip(_WS)
    if not separated and rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WS)
    return key, rest


def _unescape(s: str, path: str, lineno: int) -> str:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        i += 1
        if c != "\\":
            out.append(c)
        elif i < len(s) and s[i] == "u":
            digits = s[i + 1:i + 5]
            if len(digits) < 4 or not all(d in string.hexdigits for d in digits):
                raise PropertiesError(f"{path}:{lineno}: malformed \\uxxxx escape "
                                      f"\\u{shown(digits)}")
            out.append(chr(int(digits, 16)))
            i += 5
        elif i < len(s):
            out.append(_ESCAPES.get(s[i], s[i]))
            i += 1
    try:  # \uXXXX pairs may spell one character beyond the basic plane, as UTF-16 does
        return "".join(out).encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        raise PropertiesError(f"{path}:{lineno}: a \\uXXXX escape is half of a surrogate "
                              "pair") from None


def parse_json_config(text: str, path: str) -> dict:
    """A connector configuration as the Connect REST API takes it: {"name": ..., "config":
    {...}} or the bare config map. Values become the strings a .properties file would hold."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PropertiesError(f"{path}: not valid JSON: {exc}") from None
    config = data.get("config", data) if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise PropertiesError(f"{path}: a JSON connector configuration is an object (with a "
                              "\"config\" object)")
    props = {}
    if isinstance(data.get("name"), str) and "config" in data:
        props["name"] = data["name"]
    for key, value in config.items():
        if isinstance(value, (dict, list)) or value is None:
            raise PropertiesError(f"{path}: {shown(key)} must be a string, not {value!r}")
        props[key] = value if isinstance(value, str) else json.dumps(value)
    return props


def read_config(path: str, worker: bool = False) -> Config:
    """Read one file: JSON if it starts with `{`, otherwise .properties (UTF-8; Latin-1, what
    Java reads, when it is not UTF-8)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise PropertiesError(f"cannot read {path}: {exc.strerror}") from None
    if b"\0" in raw:
        raise PropertiesError(f"{path}: not a text file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    props = (parse_json_config(text, path) if text.lstrip().startswith("{")
             else parse_properties(text, path))
    if not props:
        raise PropertiesError(f"{path}: holds no properties")
    return Config(path, props, worker)


# -- which connector a file configures --------------------------------------------------------

_SINK_HINTS = ("topics", "topics.regex", "diode.buffer.size.kb")
_SOURCE_HINTS = ("kafka.topic.prefix", "missing.records.topic", "diode.bind.address")


def role_of(cfg: Config) -> str | None:
    """SINK or SOURCE from connector.class, else from the properties only one of them takes;
    None when the file does not say. A connector.class of another connector is an error."""
    cls = cfg.props.get("connector.class", "").strip()
    if cls:
        for role, name in CONNECTOR_CLASS.items():
            if cls.rpartition(".")[2] == name:
                return role
        raise PropertiesError(f"{cfg.path}: connector.class is {shown(cls)}, not the Data "
                              "Diode sink or source connector")
    sink = any(k in cfg.props for k in _SINK_HINTS)
    source = any(k in cfg.props for k in _SOURCE_HINTS)
    return SINK if sink and not source else SOURCE if source and not sink else None


def assign_roles(files: list, sink: Config | None = None,
                 source: Config | None = None) -> tuple:
    """(sink, source) from files given by role and files whose role is read from their
    content; one file whose content does not say takes the role left over."""
    given = {SINK: sink, SOURCE: source}
    for role, cfg in given.items():
        found = cfg and role_of(cfg)
        if found and found != role:
            raise PropertiesError(f"{cfg.path} configures the {found} connector "
                                  f"(connector.class), but was given as --{role}")
    unknown = []
    for cfg in files:
        role = role_of(cfg)
        if role is None:
            unknown.append(cfg)
        elif given[role] is not None:
            raise PropertiesError(f"{given[role].path} and {cfg.path} both configure the "
                                  f"{role} connector")
        else:
            given[role] = cfg
    free = [role for role, cfg in given.items() if cfg is None]
    if len(unknown) > 1 or (unknown and len(free) != 1):
        raise PropertiesError(f"cannot tell whether {unknown[0].path} configures the sink or "
                              "the source connector (no connector.class): give it with --sink "
                              "or --source")
    if unknown:
        given[free[0]] = unknown[0]
    if given[SINK] is None and given[SOURCE] is None:
        raise PropertiesError("give the sink connector's file, the source connector's, or both")
    return given[SINK], given[SOURCE]


def shown(value) -> str:
    """A value fit for a message or a YAML comment: quoted when it is not plain printable text
    (a newline in a property must not end a comment line)."""
    text = str(value)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


