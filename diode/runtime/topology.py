"""The topology file: loading it, validating it whole (every error at once, with its key path),
and its reference, docs/topology.md (`diode docs`).

What each setting is (its key, default, documentation and validator) is the settings registry,
diode.runtime.settings; its names are importable from here too, as they always were
(`from diode.runtime.topology import Topology, SIDES, ...`). Loading is pure: it reads the file
and nothing of the network. What `auto` settings become on this host (the datagram size from
the path's MTU, the receiver's bind address) is asked where a launch, a check or a measure needs
it (`for_this_host`).
"""

import dataclasses
import difflib
import os
import types
import typing
from pathlib import Path

import yaml

from diode.errors import TopologyError
from diode.link import admission
# the registry's names, importable from here as they always were
from diode.runtime.settings import (FILE_KAFKA_KEYS, METADATA_CONFIGS, PIPELINES, REFERENCE,
                                    SECRET_KAFKA_KEYS, SECTIONS, SIDES, SINGLE_INSTANCE,
                                    BrokerSettings, LinkSettings, ReceiverSettings,
                                    SecuritySettings, SenderSettings, StageSettings,
                                    SupervisorSettings, Topology, kafka_value_problems,
                                    settings_of, yaml_key)

__all__ = ["FILE_KAFKA_KEYS", "METADATA_CONFIGS", "PIPELINES", "REFERENCE", "SECRET_KAFKA_KEYS",
           "SECTIONS", "SIDES", "SINGLE_INSTANCE", "BrokerSettings", "LinkSettings",
           "ReceiverSettings", "SecuritySettings", "SenderSettings", "StageSettings",
           "SupervisorSettings", "Topology", "kafka_value_problems", "settings_of", "yaml_key",
           "load", "from_dict", "yaml_problem", "for_this_host", "reference_markdown"]


# -- loading -----------------------------------------------------------------------------------

def _type_ok(value, tp) -> bool:
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return isinstance(value, tp)


_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a mapping"}


def _build(cls, data, where: str, problems: list):
    """An instance of settings class `cls` from a YAML mapping, appending problems."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{where or '(top level)'}: must be a mapping")
        data = {}
    known = {yaml_key(f.name): f for f in settings_of(cls)}
    values = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        f = known.get(key)
        if f is None:
            hint = difflib.get_close_matches(str(key), known, n=1)
            problems.append(f"{path}: unknown key" + (f" (did you mean {hint[0]}?)" if hint
                                                      else ""))
            continue
        tp = f.type if isinstance(f.type, type) else typing.get_origin(f.type) or object
        if tp in (list, dict, bool, int, float, str) and not _type_ok(value, tp):
            problems.append(f"{path}: must be {_TYPE_NAMES[tp]}, not {value!r}")
            continue
        check = f.metadata.get("check")
        if check and (msg := check(value)):
            problems.append(f"{path}: {msg}")
            continue
        values[f.name] = float(value) if tp is float else value
    return cls(**values)


def _build_stages(side: str, data: dict, problems: list, cpu_count: int) -> dict:
    stages = {}
    for name in data:
        if name not in PIPELINES[side]:
            problems.append(f"{side}.stages.{name}: unknown stage type; {side} stages are "
                            f"{', '.join(PIPELINES[side])}")
    for name in PIPELINES[side]:
        where = f"{side}.stages.{name}"
        s = _build(StageSettings, data.get(name), where, problems)
        if name in SINGLE_INSTANCE and s.instances != 1:
            problems.append(f"{where}.instances: must be 1 (one UDP flow, one socket)")
        for cpu in s.cpus:
            if not isinstance(cpu, int) or isinstance(cpu, bool) or not 0 <= cpu < cpu_count:
                problems.append(f"{where}.cpus: {cpu!r} is not a CPU of this machine "
                                f"(0..{cpu_count - 1})")
        if s.pin_per_instance and not s.cpus:
            problems.append(f"{where}.pin.per.instance: needs cpus, the CPUs to pin to")
        stages[name] = s
    return stages


def load(path, cpu_count: int | None = None) -> Topology:
    """Load and validate a topology file. Raises TopologyError listing every problem."""
    path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TopologyError(path, [f"cannot read: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TopologyError(path, [yaml_problem(exc)]) from None
    if data is None:
        raise TopologyError(path, ["empty: a topology is a mapping of settings"])
    return from_dict(data, path, cpu_count)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line: where (line and column, counted from 1) and what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    what = getattr(exc, "problem", None) or str(exc)
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start:
        what += f" ({context} at line {start.line + 1}, column {start.column + 1})"
    return f"{where}not valid YAML: {what}"


def from_dict(data, path="<memory>", cpu_count: int | None = None) -> Topology:
    cpu_count = cpu_count or os.cpu_count() or 1
    problems: list[str] = []
    if not isinstance(data, dict):
        raise TopologyError(path, ["(top level): must be a mapping of settings"])
    top = {k: v for k, v in data.items() if k not in SECTIONS and k != "brokers"}
    base = _build(Topology, top, "", problems)
    sections = {name: _build(cls, data.get(name), name, problems)
                for name, cls in SECTIONS.items()}
    for side in SIDES:
        s = sections[side]
        if not isinstance(s.stages, dict):
            stages_data = {}
        else:
            stages_data = s.stages
        sections[side] = dataclasses.replace(
            s, stages=_build_stages(side, stages_data, problems, cpu_count))
    brokers = []
    raw_brokers = data.get("brokers") or []
    if not isinstance(raw_brokers, list):
        problems.append("brokers: must be a list")
        raw_brokers = []
    for i, b in enumerate(raw_brokers):
        brokers.append(_build(BrokerSettings, b, f"brokers[{i}]", problems))
    topo = dataclasses.replace(base, brokers=brokers, path=path, **sections)
    problems += _cross_checks(topo)
    if problems:
        raise TopologyError(path, problems)
    return topo


# -- on this host ------------------------------------------------------------------------------

def for_this_host(t: Topology) -> Topology:
    """`t` with its `auto` settings made what they are on this host, each with a note of how:
    link.datagram.size.bytes from the MTU of the path toward link.host (diode.link.path),
    link.bind.address from this host's addresses (diode.link.admission). It asks the kernel
    (sockets; nothing is sent), so it is done where a launch, a check or a measure needs them,
    never by `load`. Raises TopologyError when what `auto` chose is refused."""
    link = _bind_address(_datagram_size(t.link))
    if link == t.link:
        return t
    t = dataclasses.replace(t, link=link)
    problems = _link_checks(t)
    if problems:
        raise TopologyError(t.path, problems)
    return t


def _datagram_size(link: LinkSettings) -> LinkSettings:
    """`auto` made a number: what the path toward link.host carries whole (diode.link.path)."""
    if link.datagram_size_bytes != "auto":
        return link
    from diode.link import path as link_path
    found = link_path.toward(link.host)
    size = found.unfragmented(link.host)
    if size is None:
        return dataclasses.replace(
            link, datagram_size_bytes=link_path.ETHERNET_DATAGRAM, datagram_size_note=(
                f"auto: no route to {link.host} known here, so {link_path.ETHERNET_DATAGRAM} "
                "(an MTU of 1500)"))
    return dataclasses.replace(link, datagram_size_bytes=size, datagram_size_note=(
        f"auto: MTU {found.mtu} of {found.device} toward {link.host}"))


def _bind_address(link: LinkSettings) -> LinkSettings:
    """`auto` made an address: link.host where this host holds it (diode.link.admission)."""
    if link.bind_address != "auto":
        return link
    address, note = admission.bind_address(link.host, link.bind_address)
    return dataclasses.replace(link, bind_address=address, bind_address_note=note)


def _cross_checks(t: Topology) -> list[str]:
    """What no single setting can check alone."""
    problems = []
    sec = t.security
    if sec.cipher == "none":
        if not sec.allow_plaintext:
            problems.append("security.cipher: none sends records unauthenticated; set "
                            "security.allow.plaintext: true if that is really meant")
    else:
        sources = [k for k in ("password.file", "password.env", "key.file")
                   if getattr(sec, k.replace(".", "_"))]
        if len(sources) != 1:
            problems.append("security: give exactly one of password.file, password.env, "
                            f"key.file (found {', '.join(sources) or 'none'})")
        if (sec.password_file or sec.password_env) and not sec.salt:
            problems.append("security.salt: required with a password")
        nexts = [k for k in ("next.password.file", "next.password.env", "next.key.file")
                 if getattr(sec, k.replace(".", "_"))]
        if len(nexts) > 1:
            problems.append(f"security: give at most one of {', '.join(nexts)}")
        if nexts and sec.next_key_id == sec.key_id:
            problems.append("security.next.key.id: must differ from security.key.id")
        if "next.password.file" in nexts or "next.password.env" in nexts:
            if not sec.salt:
                problems.append("security.salt: required with a password")
    problems += _link_checks(t)
    if not t.sender.topics and not t.sender.topics_regex:
        problems.append("sender: name at least one topic in topics or topics.regex")
    for side in SIDES:
        kafka = getattr(t, side).kafka
        if "bootstrap.servers" not in kafka:
            problems.append(f"{side}.kafka.bootstrap.servers: required")
        for k, v in kafka.items():
            problems += [f"{side}.kafka.{k}: {p}" for p in kafka_value_problems(k, v)]
    if t.sender.metrics_listen and t.sender.metrics_listen == t.receiver.metrics_listen:
        problems.append("receiver.metrics.listen: the same address as sender.metrics.listen "
                        "(one endpoint per side; a launch of both sides would serve two)")
    for topic, configs in t.receiver.topic_configs.items():
        if not isinstance(configs, dict) or not all(
                isinstance(k, str) and isinstance(v, (str, int, float, bool))
                for k, v in configs.items()):
            problems.append(f"receiver.topic.configs.{topic}: must map config names to values")
    for src, dst in t.receiver.topic_rename.items():
        if not isinstance(dst, str) or not dst:
            problems.append(f"receiver.topic.rename.{src}: must be a topic name")
    problems += _schemas_checks(t)
    seen = {}
    for i, b in enumerate(t.brokers):
        if b.listen in seen:
            problems.append(f"brokers[{i}].listen: {b.listen} is already brokers[{seen[b.listen]}]")
        seen[b.listen] = i
        if b.listen.rpartition(":")[2] == str(t.link.port):
            problems.append(f"brokers[{i}].listen: port {t.link.port} is the link's UDP port")
        if b.kind == "tansu" and (b.data_dir or b.config):
            problems.append(f"brokers[{i}]: data.dir and config are for kind kafka (Tansu keeps "
                            "its records in memory)")
    return problems


def _link_checks(t: Topology) -> list[str]:
    """What the link's bind address allows (written, or as `auto` chose it on this host)."""
    if t.link.source_addresses and ":" in t.link.bind_address:
        return [f"link.source.addresses: the source filter takes IPv4 senders, and "
                f"link.bind.address is {t.link.bind_address} (IPv6): bind an IPv4 "
                "address, or filter in the firewall (docs/threat-model.md)"]
    return []


def _schemas_checks(t: Topology) -> list[str]:
    """sender.schemas: the registry's topic read and written where nothing else is."""
    s, r = t.sender, t.receiver
    if not s.schemas:
        return []
    problems = []
    if not s.schemas_topic:
        problems.append("sender.schemas.topic: required with sender.schemas: true (the high "
                        "side registry's kafkastore.topic)")
    if not r.schemas_topic:
        problems.append("receiver.schemas.topic: required with sender.schemas: true (the low "
                        "side registry's kafkastore.topic)")
    if s.schemas_topic and s.schemas_topic == s.dead_letter_topic:
        problems.append(f"sender.dead.letter.topic: {s.schemas_topic} is sender.schemas.topic, "
                        "which is replicated: records are never dead-lettered into it")
    if s.schemas_topic in r.topic_rename:
        problems.append(f"receiver.topic.rename.{s.schemas_topic}: the schemas topic goes to "
                        "receiver.schemas.topic; rename it there")
    others = {"receiver.digest.topic": r.digest_topic,
              "receiver.missing.records.topic": r.missing_records_topic,
              "receiver.heartbeat.topic": r.heartbeat_topic,
              "receiver.dead.letter.topic": r.dead_letter_topic}
    others.update({f"receiver.topic.rename.{k}": v for k, v in r.topic_rename.items()})
    others.update({f"sender.topics ({name})": r.topic_prefix + name for name in s.topics
                   if name != s.schemas_topic and name not in r.topic_rename})
    for where, topic in others.items():
        if r.schemas_topic and topic == r.schemas_topic:
            problems.append(f"{where}: writes to {topic}, which is receiver.schemas.topic: "
                            "the low side registry would read what is not a schema")
    return problems


# -- reference documentation -------------------------------------------------------------------

def _type_name(f) -> str:
    names = {bool: "bool", int: "int", float: "number", str: "string", list: "list",
             dict: "map"}
    if isinstance(f.type, types.UnionType):  # (an int or the word auto)
        return "int or auto" if typing.get_args(f.type) == (int, str) else \
            " or ".join(names[a] for a in typing.get_args(f.type))
    tp = f.type if isinstance(f.type, type) else typing.get_origin(f.type)
    if isinstance(f.type, types.GenericAlias):
        tp = typing.get_origin(f.type)
    return names.get(tp, "section")


def _default(f) -> str:
    if f.default is not dataclasses.MISSING:
        return "" if f.default is None else repr(f.default) if f.default != "" else '""'
    return repr(f.default_factory())


def reference_markdown() -> str:
    """docs/topology.md, generated from the registry (`diode docs`)."""
    out = ["# Topology reference", "",
           "Generated from `diode/runtime/topology.py` by `diode docs > docs/topology.md`; a "
           "test keeps the two equal. Keys are lowercase and dotted, with units in the name. "
           "Every error in a file is reported at once, with its key path (`diode check FILE`).",
           ""]

    def table(title, cls, prefix):
        out.extend([f"## {title}", "", "| key | type | default | meaning |",
                    "| --- | --- | --- | --- |"])
        for f in settings_of(cls):
            if f.name in SECTIONS:
                continue
            doc = f.metadata["doc"]
            if f.metadata.get("example"):
                doc += f" Example: `{f.metadata['example']}`."
            out.append(f"| `{prefix}{yaml_key(f.name)}` | {_type_name(f)} | `{_default(f)}` "
                       f"| {doc} |")
        out.append("")

    table("Top level", Topology, "")
    for name, cls in SECTIONS.items():
        table(f"`{name}`", cls, f"{name}.")
    table("`sender.stages.<type>` and `receiver.stages.<type>`", StageSettings, "")
    table("`brokers[]`", BrokerSettings, "")
    return "\n".join(out)
