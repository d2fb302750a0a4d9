"""diode.runtime.topology: loading, validating (every error at once), the plan and the reference."""

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from diode.runtime import topology, wiring
from diode.errors import TopologyError

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = {
    "security": {"password.env": "DIODE_PASSWORD", "salt": "pepper"},
    "sender": {"kafka": {"bootstrap.servers": "high:9092"}, "topics": ["orders"]},
    "receiver": {"kafka": {"bootstrap.servers": "low:9092"}},
}


def minimal(**sections):
    data = copy.deepcopy(MINIMAL)
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(data.get(name), dict):
            data[name].update(values)
        else:
            data[name] = values
    return data


def problems_of(data, cpu_count=4):
    with pytest.raises(TopologyError) as exc:
        topology.from_dict(data, "bad.yaml", cpu_count=cpu_count)
    return exc.value.problems


def test_minimal_topology_gets_the_documented_defaults():
    t = topology.from_dict(minimal(), cpu_count=4)
    assert t.name == "diode"
    assert t.compression == "none"
    assert t.security.cipher == "aes-256-gcm"
    assert t.link.port == 3456
    assert (t.link.datagram_size_bytes, t.link.bind_address) == ("auto", "auto")
    # auto, on this host: what the path toward link.host (127.0.0.1 by default: loopback)
    # carries whole
    here = topology.for_this_host(t).link
    assert here.datagram_size_bytes == 65000
    assert here.datagram_size_note == "auto: MTU 65536 of lo toward 127.0.0.1"
    assert t.sender.kafka == {"bootstrap.servers": "high:9092"}
    assert t.sender.topics == ["orders"]
    for side, stages in topology.PIPELINES.items():
        for stage in stages:
            assert t.stage(side, stage) == topology.StageSettings(1, [])


def test_settings_are_read_from_dotted_keys_and_kafka_passes_through():
    t = topology.from_dict(minimal(
        name="plant", compression="zstd",
        link={"port": 4000, "datagram.size.bytes": 8972, "rate.mbps": 400,
              "bind.address": "10.0.0.2"},
        sender={"kafka": {"bootstrap.servers": "h:1", "security.protocol": "SSL",
                          "fetch.max.bytes": 1048576},
                "topics.regex": ["plant\\..*"], "batch.linger.ms": 2},
        receiver={"topic.prefix": "dst_", "topic.rename": {"orders": "orders-copy"}},
        supervisor={"restart.max": 3},
    ), cpu_count=4)
    assert (t.name, t.compression) == ("plant", "zstd")
    assert (t.link.port, t.link.datagram_size_bytes, t.link.bind_address) == (
        4000, 8972, "10.0.0.2")
    assert t.link.rate_mbps == 400.0 and isinstance(t.link.rate_mbps, float)
    assert t.sender.kafka == {"bootstrap.servers": "h:1", "security.protocol": "SSL",
                              "fetch.max.bytes": 1048576}
    assert t.sender.topics_regex == ["plant\\..*"]
    assert t.sender.batch_linger_ms == 2.0
    assert t.receiver.topic_prefix == "dst_"
    assert t.receiver.topic_rename == {"orders": "orders-copy"}
    assert t.supervisor.restart_max == 3


def test_plaintext_with_explicit_allow_and_key_file_are_valid():
    t = topology.from_dict(minimal(security={"cipher": "none", "allow.plaintext": True}),
                           cpu_count=1)
    assert t.security.cipher == "none"
    t = topology.from_dict(minimal(security={"key.file": "k", "password.env": "",
                                             "salt": ""}), cpu_count=1)
    assert t.security.key_file == "k"


def test_a_bad_file_reports_every_error_at_once_with_key_paths(tmp_path):
    data = {
        "name": 5,
        "compresion": "zstd",
        "compression": "brotli",
        "link": {"port": "3456", "datagram.size.bytes": 100, "prot": 1},
        "security": {"cipher": "none"},
        "sender": {
            "kafka": {"group.id": "x"},
            "topics.regex": ["("],
            "start.position": "middle",
            "stages": {"udp_sender": {"instances": 2}, "packer": {"cpus": [0, 99]},
                       "kafka_reader": {"instances": True}},
        },
        "receiver": {"kafka": {"bootstrap.servers": "low:1"}, "topic.prefix": ["x"]},
        "brokers": [{"listen": "127.0.0.1:19092"}, {"listen": "127.0.0.1:19092"},
                    {"listen": "127.0.0.1:3456"}, {"side": "middle"}],
    }
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(TopologyError) as exc:
        topology.load(f, cpu_count=4)
    assert str(exc.value).startswith(f"{f}: ")
    problems = exc.value.problems
    expected = [
        ("name:", "must be a string"),
        ("compresion:", "unknown key (did you mean compression?)"),
        ("compression:", "must be one of none, gzip, zstd, lz4"),
        ("link.port:", "must be an integer"),
        ("link.datagram.size.bytes:", "between 256 and 65507"),
        ("link.prot:", "unknown key (did you mean port?)"),
        ("security.cipher:", "allow.plaintext"),
        ("sender.topics.regex:", "'(' is not a regular expression"),
        ("sender.start.position:", "must be one of earliest, latest"),
        ("sender.stages.udp_sender.instances:", "must be 1"),
        ("sender.stages.packer.cpus:", "99 is not a CPU of this machine (0..3)"),
        ("sender.stages.kafka_reader.instances:", "must be an integer"),
        ("sender.kafka.bootstrap.servers:", "required"),
        ("sender:", "at least one topic"),
        ("receiver.topic.prefix:", "must be a string"),
        ("brokers[1].listen:", "already brokers[0]"),
        ("brokers[2].listen:", "port 3456 is the link's UDP port"),
        ("brokers[3].side:", "must be one of sender, receiver"),
    ]
    for path, fragment in expected:
        assert any(p.startswith(path) and fragment in p for p in problems), (path, problems)
    assert len(problems) == len(expected), problems


def test_error_message_names_the_file_and_lists_every_problem():
    with pytest.raises(TopologyError) as exc:
        topology.from_dict({"bogus": 1, "link": {"port": 0}}, "/etc/diode/t.yaml", cpu_count=1)
    text = str(exc.value)
    assert text.startswith("/etc/diode/t.yaml:")
    assert exc.value.path == "/etc/diode/t.yaml"
    for p in exc.value.problems:
        assert p in text
    assert any(p.startswith("link.port:") for p in exc.value.problems)


@pytest.mark.parametrize("security, fragment", [
    ({"password.env": "P", "password.file": "f", "salt": "s"},
     "exactly one of password.file, password.env, key.file (found password.file, "
     "password.env)"),
    ({"password.env": "", "salt": ""}, "exactly one of password.file, password.env, key.file "
                                       "(found none)"),
    ({"password.env": "", "key.file": "k", "password.file": "f"}, "found password.file, "
                                                                   "key.file"),
])
def test_exactly_one_key_source(security, fragment):
    problems = problems_of(minimal(security=security))
    assert any(p.startswith("security:") and fragment in p for p in problems), problems


def test_password_needs_a_salt():
    problems = problems_of(minimal(security={"password.env": "P", "salt": ""}))
    assert problems == ["security.salt: required with a password"]


def test_receiver_needs_bootstrap_servers_and_scalar_kafka_values():
    problems = problems_of(minimal(receiver={"kafka": {"acks": ["all"]}}))
    assert any(p.startswith("receiver.kafka.bootstrap.servers: required") for p in problems)
    assert any(p.startswith("receiver.kafka.acks:") for p in problems)


def test_topics_regex_alone_is_enough_and_no_topics_is_an_error():
    t = topology.from_dict(minimal(sender={"topics": [], "topics.regex": ["a.*"]}),
                           cpu_count=1)
    assert t.sender.topics_regex == ["a.*"]
    problems = problems_of(minimal(sender={"topics": []}))
    assert any(p.startswith("sender:") and "at least one topic" in p for p in problems)


def test_receiver_udp_reader_is_single_instance():
    problems = problems_of(minimal(receiver={"stages": {"udp_reader": {"instances": 3}}}))
    assert problems == ["receiver.stages.udp_reader.instances: must be 1 (one UDP flow, "
                        "one socket)"]


@pytest.mark.parametrize("cpus", [[-1], [4], ["0"], [True]])
def test_cpu_out_of_range(cpus):
    problems = problems_of(minimal(sender={"stages": {"packer": {"cpus": cpus}}}), cpu_count=4)
    assert len(problems) == 1
    assert problems[0].startswith("sender.stages.packer.cpus:")


def test_instance_count_limits():
    problems = problems_of(minimal(sender={"stages": {"packer": {"instances": 0}}},
                                   receiver={"stages": {"unpacker": {"instances": 65}}}))
    assert len(problems) == 2
    assert problems[0].startswith("sender.stages.packer.instances: must be between 1 and 64")
    assert problems[1].startswith("receiver.stages.unpacker.instances: must be between 1 and 64")


def test_stage_of_the_other_side_is_unknown():
    problems = problems_of(minimal(sender={"stages": {"unpacker": {}}}))
    assert len(problems) == 1 and problems[0].startswith("sender.stages.unpacker: unknown stage")


@pytest.mark.parametrize("data, fragment", [
    ({"link": 5}, "link: must be a mapping"),
    ({"brokers": {"a": 1}}, "brokers: must be a list"),
    ({"brokers": ["x"]}, "brokers[0]: must be a mapping"),
    ({"sender": {"stages": {"packer": 3}}}, "sender.stages.packer: must be a mapping"),
    ({"brokers": [{"listen": "nohost"}]}, "brokers[0].listen: must be host:port"),
    ({"link": {"rate.mbps": -1}}, "link.rate.mbps: must be 0 or more"),
    ({"supervisor": {"heartbeat.timeout.seconds": 0}},
     "supervisor.heartbeat.timeout.seconds: must be more than 0"),
    ({"security": {"allow.plaintext": "yes"}}, "security.allow.plaintext: must be true or false"),
    ({"receiver": {"topic.rename": {"a": ""}}}, "receiver.topic.rename.a: must be a topic name"),
    ({"brokers": [{"kind": "redpanda"}]}, "brokers[0].kind: must be one of kafka, tansu"),
    ({"brokers": [{"kind": "tansu", "data.dir": "d"}]},
     "brokers[0]: data.dir and config are for kind kafka"),
])
def test_single_problems(data, fragment):
    base = minimal()
    for k, v in data.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    problems = problems_of(base)
    assert any(p.startswith(fragment) for p in problems), problems


def test_top_level_must_be_a_mapping():
    with pytest.raises(TopologyError) as exc:
        topology.from_dict(["a", "b"], "t.yaml")
    assert "(top level)" in exc.value.problems[0]


# -- files ---------------------------------------------------------------------------------------

def test_load_a_file_and_resolve_paths_beside_it(tmp_path):
    f = tmp_path / "conf" / "topology.yaml"
    f.parent.mkdir()
    f.write_text(yaml.safe_dump(minimal(security={"password.file": "secrets/pw",
                                                  "password.env": ""})))
    t = topology.load(f, cpu_count=2)
    assert t.path == str(f)
    assert t.resolve("secrets/pw") == str(tmp_path / "conf" / "secrets" / "pw")
    assert t.resolve("/abs/pw") == "/abs/pw"


def test_invalid_yaml_is_a_topology_error(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("link:\n  port: [3456\nsender: {\n")
    with pytest.raises(TopologyError) as exc:
        topology.load(f)
    assert exc.value.path == str(f)
    assert exc.value.problems == ["line 3, column 7: not valid YAML: expected ',' or ']', but "
                                  "got ':' (while parsing a flow sequence at line 2, column 9)"]
    assert str(exc.value).startswith(f"{f}: 1 error(s)")


@pytest.mark.parametrize("make", ["missing", "directory"])
def test_unreadable_file_is_a_topology_error(tmp_path, make):
    f = tmp_path / "t.yaml"
    if make == "directory":
        f.mkdir()
    with pytest.raises(TopologyError) as exc:
        topology.load(f)
    assert str(f) in str(exc.value)
    assert exc.value.problems[0].startswith("cannot read")


def test_empty_file_is_a_topology_error(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("")
    with pytest.raises(TopologyError):
        topology.load(f)


def test_the_demo_topology_is_valid():
    t = topology.load(ROOT / "topology.yaml", cpu_count=64)
    assert len(wiring.plan(t)) == 6
    assert [b.kind for b in t.brokers] == ["tansu", "tansu"]  # the faster start (README)


# -- Kafka settings: secrets from files and the environment, never in the file ----------------

@pytest.mark.parametrize("key", topology.SECRET_KAFKA_KEYS)
def test_a_kafka_secret_written_in_the_topology_is_refused_without_echoing_it(key):
    problems = problems_of(minimal(receiver={"kafka": {"bootstrap.servers": "low:9092",
                                                       key: "hunter2"}}))
    assert problems == [f"receiver.kafka.{key}: a secret must not be written in the topology "
                        "file: give ${file:PATH} (a file holding it) or ${env:NAME} instead"]


@pytest.mark.parametrize("value, fragment", [
    ("${env:}", "${env:} names no variable"),
    ("${file: }", "${file:} names no file"),
    ("${vault:x}", "a ${ that is not ${env:NAME} or ${file:PATH}"),
    ("pre${env:X", "a ${ that is not"),
])
def test_malformed_references_are_reported(value, fragment):
    problems = problems_of(minimal(sender={"kafka": {"bootstrap.servers": "h:1",
                                                     "sasl.username": value}}))
    assert any(p.startswith("sender.kafka.sasl.username: " + fragment) for p in problems), \
        problems


def test_references_resolve_from_a_file_beside_the_topology_and_the_environment(tmp_path,
                                                                                 monkeypatch):
    from diode.errors import SecretError
    from diode.kafka.clients import client_settings, consumer_config
    (tmp_path / "pw").write_text("from-the-file\n")
    monkeypatch.setenv("DIODE_TEST_USER", "alice")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(minimal(sender={"kafka": {
        "bootstrap.servers": "h:1", "sasl.username": "${env:DIODE_TEST_USER}",
        "sasl.password": "${file:pw}", "client.id": "diode-${env:DIODE_TEST_USER}-1"}})))
    t = topology.load(path)
    assert t.sender.kafka["sasl.password"] == "${file:pw}"  # the topology keeps the reference
    conf = client_settings(t, "sender")
    assert (conf["sasl.username"], conf["sasl.password"], conf["client.id"]) == \
        ("alice", "from-the-file", "diode-alice-1")
    assert consumer_config(t)["sasl.password"] == "from-the-file"
    monkeypatch.delenv("DIODE_TEST_USER")
    with pytest.raises(SecretError, match="DIODE_TEST_USER"):
        client_settings(t, "sender")
    assert client_settings(t, "receiver") == {"bootstrap.servers": "low:9092"}


# -- plan ----------------------------------------------------------------------------------------

def test_plan_lists_processes_in_data_flow_order_with_instance_counts():
    t = topology.from_dict(minimal(
        sender={"stages": {"kafka_reader": {"instances": 2}, "packer": {"instances": 3,
                                                                        "cpus": [1, 2]}}},
        receiver={"stages": {"unpacker": {"instances": 2}, "kafka_writer": {"instances": 4}}},
    ), cpu_count=4)
    specs = wiring.plan(t)
    assert [(s.side, s.stage, s.index) for s in specs] == [
        ("sender", "kafka_reader", 0), ("sender", "kafka_reader", 1),
        ("sender", "packer", 0), ("sender", "packer", 1), ("sender", "packer", 2),
        ("sender", "udp_sender", 0),
        ("receiver", "udp_reader", 0),
        ("receiver", "unpacker", 0), ("receiver", "unpacker", 1),
        ("receiver", "kafka_writer", 0), ("receiver", "kafka_writer", 1),
        ("receiver", "kafka_writer", 2), ("receiver", "kafka_writer", 3),
    ]
    assert [s.cpus for s in specs if s.stage == "packer"] == [(1, 2)] * 3
    pinned = topology.from_dict(minimal(sender={"stages": {"packer": {
        "instances": 3, "cpus": [1, 2], "pin.per.instance": True}}}), cpu_count=4)
    # one CPU each, round robin, as diode tune proposes
    assert [s.cpus for s in wiring.plan(pinned) if s.stage == "packer"] == [(1,), (2,), (1,)]
    assert "sender.stages.kafka_reader.pin.per.instance: needs cpus" in problems_of(minimal(
        sender={"stages": {"kafka_reader": {"pin.per.instance": True}}}), cpu_count=4)[0]
    assert specs[2].name == "sender/packer-0"
    receiver_only = wiring.plan(t, sides=("receiver",))
    assert [s.stage for s in receiver_only] == ["udp_reader", "unpacker", "unpacker",
                                                "kafka_writer", "kafka_writer",
                                                "kafka_writer", "kafka_writer"]


def test_every_queue_a_worker_reaches_is_bound_by_exactly_one_worker():
    """The wiring (diode.runtime.wiring), which the stages open their sockets from and
    `diode check` prints: nothing dangles, nothing is bound twice, whatever the counts."""
    t = topology.from_dict(minimal(
        sender={"stages": {"kafka_reader": {"instances": 2}, "packer": {"instances": 3}}},
        receiver={"stages": {"unpacker": {"instances": 2}, "kafka_writer": {"instances": 4}}},
    ), cpu_count=4)
    specs = wiring.plan(t)
    bound = [e for s in specs for e in (wiring.bound("/run", s, p)
                                        for p in wiring.QUEUES[s.stage][0])]
    assert len(bound) == len(set(bound)) == len(specs)
    for s in specs:
        for name in wiring.QUEUES[s.stage][1]:
            reached = wiring.peers(t, "/run", s, name)
            assert reached and set(reached) <= set(bound), (s.name, name)
    packer = next(s for s in specs if s.stage == "packer")
    assert wiring.peers(t, "/run", packer, "acks") == [
        "ipc:///run/sender-kafka_reader-0.acks", "ipc:///run/sender-kafka_reader-1.acks"]
    binds, connects = wiring.describe(t, next(s for s in specs if s.stage == "udp_reader"),
                                      "/run")
    assert binds[0].startswith("udp://") and len(connects) == 2  # the two unpackers


def test_endpoints_are_distinct_per_process_and_purpose():
    eps = {wiring.endpoint("/run", side, stage, i, purpose)
           for side, stages in topology.PIPELINES.items() for stage in stages
           for i in range(3) for purpose in ("in", "acks")}
    assert len(eps) == 2 * 3 * 3 * 2
    assert wiring.endpoint("/run", "sender", "packer", 1) == "ipc:///run/sender-packer-1.in"
    assert wiring.endpoint("inproc", "sender", "packer", 1).startswith("inproc://")


# -- reference -----------------------------------------------------------------------------------

def test_reference_mentions_every_setting_key():
    md = topology.reference_markdown()
    keys = [f"`{topology.yaml_key(f.name)}`" for f in topology.settings_of(topology.Topology)
            if f.name not in topology.SECTIONS]
    for name, cls in topology.SECTIONS.items():
        keys += [f"`{name}.{topology.yaml_key(f.name)}`" for f in topology.settings_of(cls)]
    for cls in (topology.StageSettings, topology.BrokerSettings):
        keys += [f"`{topology.yaml_key(f.name)}`" for f in topology.settings_of(cls)]
    assert len(keys) > 40
    for key in keys:
        assert key in md, key
    # spot checks of what an operator looks up
    for key in ("`link.datagram.size.bytes`", "`security.allow.plaintext`",
                "`sender.topics.regex`", "`supervisor.restart.max`", "`instances`"):
        assert key in md


def test_reference_documents_defaults():
    md = topology.reference_markdown()
    row = next(line for line in md.splitlines() if line.startswith("| `link.datagram.size"))
    assert "| int or auto | `'auto'` |" in row
    row = next(line for line in md.splitlines() if line.startswith("| `security.cipher`"))
    assert "`'aes-256-gcm'`" in row


def test_every_setting_has_a_default_that_validates():
    """Defaults must pass their own validators, or an omitted key would be invalid."""
    for cls in (topology.Topology, *topology.SECTIONS.values(), topology.StageSettings,
                topology.BrokerSettings):
        for f in topology.settings_of(cls):
            check = f.metadata.get("check")
            if check:
                default = f.default if f.default is not dataclasses.MISSING \
                    else f.default_factory()
                assert check(default) is None, (cls.__name__, f.name)


# -- robustness ----------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 70000),
                    st.floats(allow_nan=False), st.text(max_size=6),
                    st.sampled_from(["none", "zstd", "aes-256-gcm", "127.0.0.1:9092", "x:3456"]))
values = st.recursive(scalars, lambda c: st.one_of(
    st.lists(c, max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=4), st.sampled_from(
        ["packer", "udp_sender", "instances", "cpus", "bootstrap.servers", "listen"])),
        c, max_size=3)), max_leaves=8)
SECTION_KEYS = {
    "link": ["host", "port", "datagram.size.bytes", "rate.mbps"],
    "security": ["cipher", "password.file", "password.env", "salt", "key.file",
                 "allow.plaintext"],
    "sender": ["kafka", "topics", "start.position", "stages", "batch.linger.ms"],
    "receiver": ["kafka", "topic.prefix", "topic.rename", "stages"],
    "supervisor": ["restart.max", "queue.max.messages"],
}
documents = st.fixed_dictionaries({}, optional={
    **{name: st.dictionaries(st.sampled_from(keys), values, max_size=5)
       for name, keys in SECTION_KEYS.items()},
    "name": values, "compression": values, "brokers": values, "bogus": values,
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_any_document_is_either_valid_or_a_topology_error(data):
    try:
        topology.from_dict(data, "fuzz.yaml", cpu_count=4)
    except TopologyError as exc:
        assert exc.problems and all(isinstance(p, str) for p in exc.problems)


@pytest.mark.parametrize("pattern", [2024, ["a"], {"a": 1}])
def test_non_string_regex_is_reported(pattern):
    problems = problems_of(minimal(sender={"topics.regex": [pattern]}))
    assert any(p.startswith("sender.topics.regex:") for p in problems)


def test_key_rotation_settings_are_checked():
    problems = problems_of(minimal(security={"next.password.file": "n", "next.key.file": "k",
                                             "next.key.id": 0}))
    assert "security: give at most one of next.password.file, next.key.file" in problems
    assert "security.next.key.id: must differ from security.key.id" in problems
    t = topology.from_dict(minimal(security={"next.password.env": "NEXT", "key.id": 3,
                                             "next.key.id": 4}), cpu_count=4)
    assert (t.security.key_id, t.security.next_key_id) == (3, 4)


def test_a_datagram_size_is_auto_or_a_number_in_range():
    t = topology.from_dict(minimal(link={"datagram.size.bytes": 8972}))
    assert t.link.datagram_size_bytes == 8972 and t.link.datagram_size_note == ""
    for bad, said in (("big", "must be auto or an integer, not 'big'"),
                      (100, "must be between 256 and 65507, not 100"),
                      (True, "must be auto or an integer, not True")):
        with pytest.raises(TopologyError) as exc:
            topology.from_dict(minimal(link={"datagram.size.bytes": bad}))
        assert f"link.datagram.size.bytes: {said}" in str(exc.value)


def test_schemas_go_to_their_own_topic_and_nothing_else_writes_there():
    t = topology.from_dict(minimal(sender={"schemas": True}), cpu_count=1)
    assert (t.sender.schemas_topic, t.receiver.schemas_topic) == ("_schemas", "_schemas")
    problems = problems_of(minimal(
        sender={"schemas": True, "schemas.topic": "_reg", "dead.letter.topic": "_reg"},
        receiver={"kafka": {"bootstrap.servers": "low:9092"}, "schemas.topic": "",
                  "topic.rename": {"_reg": "elsewhere", "orders": "_schemas"}}))
    assert any(p.startswith("sender.dead.letter.topic:") for p in problems)
    assert any(p.startswith("receiver.schemas.topic: required") for p in problems)
    assert any(p.startswith("receiver.topic.rename._reg:") for p in problems)
    problems = problems_of(minimal(
        sender={"schemas": True},
        receiver={"kafka": {"bootstrap.servers": "low:9092"}, "topic.prefix": "_",
                  "missing.records.topic": "_schemas"}))
    assert any(p.startswith("receiver.missing.records.topic:") for p in problems)
    assert not any("sender.topics" in p for p in problems)  # (_orders is not _schemas)
    problems = problems_of(minimal(
        sender={"schemas": True, "topics": ["schemas"]},
        receiver={"kafka": {"bootstrap.servers": "low:9092"}, "topic.prefix": "_"}))
    assert any(p.startswith("sender.topics (schemas):") for p in problems)


def test_loading_asks_nothing_of_the_network(monkeypatch):
    """`load` reads the file alone: the MTU toward link.host and this host's addresses, which
    `auto` settings need, are asked by for_this_host (a launch, a check, a measure)."""
    import socket

    def no_socket(*args, **kwargs):
        raise AssertionError("a socket was opened while loading")
    monkeypatch.setattr(socket, "socket", no_socket)
    monkeypatch.setattr(socket, "getaddrinfo", no_socket)
    t = topology.from_dict(minimal(link={"host": "127.0.0.1"}))
    assert (t.link.datagram_size_bytes, t.link.bind_address) == ("auto", "auto")


def test_the_receivers_address_and_its_senders_are_checked():
    """link.bind.address auto binds link.host where this host holds it; a bind address or a
    source address that is not one is an error naming the key."""
    t = topology.for_this_host(topology.from_dict(minimal(link={
        "host": "127.0.0.1", "source.addresses": ["127.0.0.1", "10.20.0.0/30"]})))
    assert (t.link.bind_address, t.link.bind_address_note) == (
        "127.0.0.1", "auto: link.host, an address of this host")
    assert t.link.source_addresses == ["127.0.0.1", "10.20.0.0/30"]
    assert problems_of(minimal(link={"bind.address": "receiver-host",
                                     "source.addresses": ["10.20.0.1/24"]})) == [
        "link.bind.address: must be auto or an IP address of the receiving host, not "
        "'receiver-host'",
        "link.source.addresses: '10.20.0.1/24' is not an IPv4 address or CIDR block: "
        "10.20.0.1/24 has host bits set (the block is 10.20.0.0/24)"]
    assert problems_of(minimal(link={"bind.address": "::", "source.addresses": ["10.0.0.1"]})) \
        == ["link.source.addresses: the source filter takes IPv4 senders, and "
            "link.bind.address is :: (IPv6): bind an IPv4 address, or filter in the firewall "
            "(docs/threat-model.md)"]
