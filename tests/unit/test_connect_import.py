"""diode import-properties: the Confluent Data Diode connector's configuration becomes a topology
that validates and does what the connectors did, the password never enters the topology, and
every property diode cannot map is named with its reason."""

import json
import stat
from pathlib import Path

import pytest
import yaml

from diode import cli
from diode.runtime import topology
from diode.connect_import.mapping import password, to_topology
from diode.connect_import.properties import (Config, PropertiesError, assign_roles,
                                             parse_properties, read_config)
from diode.connect_import.render import render_yaml

# The reference's quick start (etc/kafka-connect-datadiode/*.properties), with what a real
# deployment adds: batching, compression, the missing-records topic, client overrides.
SINK = r"""
# Data Diode sink connector: runs on the HIGH side, sends over UDP
name=datadiode-sink-connector
connector.class=io.confluent.connect.diode.sink.DataDiodeSinkConnector
tasks.max=1
topics=diode,\
       orders
key.converter=org.apache.kafka.connect.converters.ByteArrayConverter
value.converter=org.apache.kafka.connect.converters.ByteArrayConverter
header.converter=org.apache.kafka.connect.converters.ByteArrayConverter
diode.host=10.12.13.15
diode.port=3456
diode.buffer.size.kb=8
diode.compression.class=io.confluent.connect.diode.serde.GzipCompressor
diode.encryption.password=supersecretpassword
diode.encryption.salt=secretsalt
consumer.override.bootstrap.servers=kafka-high:9092
consumer.override.security.protocol=SASL_SSL
consumer.override.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule \
    required username="diode" password="jaas-secret";
errors.deadletterqueue.topic.name=diode-dlq
errors.tolerance=all
transforms=route
transforms.route.type=org.apache.kafka.connect.transforms.RegexRouter
"""

SOURCE = """
! Data Diode source connector: runs on the LOW side, receives
name = datadiode-source-connector
connector.class : io.confluent.connect.diode.source.DataDiodeSourceConnector
tasks.max 1
kafka.topic.prefix=dest_
key.converter=org.apache.kafka.connect.converters.ByteArrayConverter
value.converter=org.apache.kafka.connect.converters.ByteArrayConverter
header.converter=org.apache.kafka.connect.converters.ByteArrayConverter
diode.port=3456
diode.encryption.password=supersecretpassword
diode.encryption.salt=secretsalt
missing.records.topic=diode-missing
missing.records.bootstrap.servers=kafka-low:9092
missing.records.client.id=missing-writer
diode.recordqueue.capacity=1000
"""


def cfg(text, path):
    return Config(path, parse_properties(text, path))


def sink(**extra):
    return Config("sink.properties", {**parse_properties(SINK), **extra})


def source(**extra):
    return Config("source.properties", {**parse_properties(SOURCE), **extra})


def imported(*args, **kw):
    t, unmapped, notes = to_topology(*args, **kw)
    return topology.from_dict(t), {u.key: u for u in unmapped}, notes


# -- the mapping ------------------------------------------------------------------------------

def test_reference_pair_maps_to_a_valid_topology_doing_what_the_connectors_did():
    t, _, _ = imported(sink(), source())
    assert (t.link.host, t.link.port) == ("10.12.13.15", 3456)
    assert t.link.datagram_size_bytes == 8 * 1024
    assert t.compression == "gzip"
    assert t.sender.topics == ["diode", "orders"]
    assert t.sender.kafka["bootstrap.servers"] == "kafka-high:9092"
    assert t.sender.kafka["security.protocol"] == "SASL_SSL"
    # the sink's consumer group: diode resumes where the connector committed
    assert t.sender.kafka["group.id"] == "connect-datadiode-sink-connector"
    assert t.sender.dead_letter_topic == "diode-dlq"
    assert t.receiver.topic_prefix == "dest_"
    assert t.receiver.missing_records_topic == "diode-missing"
    assert t.receiver.kafka == {"bootstrap.servers": "kafka-low:9092"}
    # the same PBKDF2 derivation: the salt carries over, the password through a file
    assert t.security.cipher == "aes-256-gcm"
    assert t.security.salt == "secretsalt"
    assert t.security.password_file == "secrets/diode.password"
    assert password(sink(), source()) == "supersecretpassword"


def test_the_password_is_never_in_the_topology():
    t, unmapped, notes = to_topology(sink(), source())
    text = render_yaml(t, unmapped, notes)
    assert "supersecretpassword" not in text
    assert "jaas-secret" not in text  # nor a Kafka secret inside sasl.jaas.config
    assert yaml.safe_load(text)["security"]["password.file"] == "secrets/diode.password"


def test_unmappable_properties_are_listed_with_their_reasons():
    _, unmapped, _ = imported(sink(), source())
    reasons = {key: u.reason for key, u in unmapped.items()}
    assert "Connect" in reasons["connector.class"]
    assert "sender.stages" in reasons["tasks.max"]
    assert "ByteArrayConverter" in reasons["key.converter"]
    assert "Transforms" in reasons["transforms"] and "transforms.route.type" in reasons
    assert "dead.letter" in reasons["errors.tolerance"]
    assert "sasl.username" in reasons["consumer.override.sasl.jaas.config"]
    assert "missing-records producer" in reasons["missing.records.client.id"]
    assert "typo" in reasons["diode.recordqueue.capacity"]  # unknown properties too
    assert unmapped["diode.recordqueue.capacity"].path == "source.properties"
    mapped = ("topics", "diode.host", "diode.port", "diode.buffer.size.kb", "kafka.topic.prefix",
              "diode.encryption.password", "diode.encryption.salt", "missing.records.topic",
              "diode.compression.class", "consumer.override.bootstrap.servers")
    assert not set(mapped) & set(unmapped)


def test_the_yaml_lists_what_was_not_mapped_and_says_the_link_format_differs():
    t, unmapped, notes = to_topology(sink(), source())
    text = render_yaml(t, unmapped, notes, ["sink connector: sink.properties"])
    header = text[:text.index("\nname:")]
    assert all(line.startswith("#") for line in header.splitlines())
    assert "AES-256-GCM" in header and "Both sides must run diode" in header
    assert "tasks.max (sink.properties, source.properties):" in header
    assert "diode.recordqueue.capacity (source.properties):" in header
    assert all(len(line) <= 100 for line in text.splitlines())
    assert topology.from_dict(yaml.safe_load(text)).sender.topics == ["diode", "orders"]


def test_values_both_sides_share_must_agree():
    with pytest.raises(PropertiesError, match=r"diode.port is 3456 in sink.properties but 4000 "
                                              r"in source.properties"):
        to_topology(sink(), source(**{"diode.port": "4000"}))
    with pytest.raises(PropertiesError, match="salt differs between sink.properties and "
                                              "source.properties") as exc:
        to_topology(sink(), source(**{"diode.encryption.salt": "othersalt"}))
    assert "othersalt" not in str(exc.value) and "secretsalt" not in str(exc.value)
    with pytest.raises(PropertiesError, match="password differs") as exc:
        to_topology(sink(), source(**{"diode.encryption.password": "other"}))
    assert "supersecretpassword" not in str(exc.value)
    # a port left at the connector's default (3456) on one side counts as 3456
    no_port = Config("source.properties", {k: v for k, v in source().props.items()
                                           if k != "diode.port"})
    with pytest.raises(PropertiesError, match=r"3456 in source.properties \(the connector's "):
        to_topology(sink(**{"diode.port": "4000"}), no_port)


def test_either_file_alone_gives_a_valid_topology_with_placeholders_named():
    t, _, notes = imported(sink())
    assert t.sender.topics == ["diode", "orders"] and t.link.host == "10.12.13.15"
    assert t.receiver.kafka["bootstrap.servers"] == "localhost:9092"
    assert any("no source connector file" in n for n in notes)

    t, _, notes = imported(source=source())
    assert t.receiver.topic_prefix == "dest_" and t.security.salt == "secretsalt"
    assert t.sender.topics == ["CHANGE-ME"]
    assert any("sender.topics is CHANGE-ME, a placeholder" in n for n in notes)


def test_worker_files_give_bootstrap_and_client_settings_connector_overrides_win():
    worker = cfg("bootstrap.servers=kafka-high:9092\nconsumer.client.id=from-worker\n"
                 "consumer.auto.offset.reset=latest\nconsumer.ssl.truststore.location=/ts.jks\n"
                 "consumer.ssl.keystore.password=ks-secret\n"
                 "plugin.path=/usr/share/java\noffset.flush.interval.ms=2000\n", "worker.props")
    mine = Config("sink.properties", {k: v for k, v in sink().props.items()
                                      if not k.startswith("consumer.override.")})
    mine.props["consumer.override.client.id"] = "from-connector"
    t, unmapped, _ = imported(mine, source(), sink_worker=Config(worker.path, worker.props, True))
    assert t.sender.kafka["bootstrap.servers"] == "kafka-high:9092"
    assert t.sender.kafka["client.id"] == "from-connector"
    assert "overridden by consumer.override.client.id" in unmapped["consumer.client.id"].reason
    assert t.sender.start_position == "latest"
    assert t.sender.offset_commit_interval_ms == 2000
    assert "ssl.ca.location" in unmapped["consumer.ssl.truststore.location"].reason
    assert "${file:PATH}" in unmapped["consumer.ssl.keystore.password"].reason
    assert "worker setting" in unmapped["plugin.path"].reason
    assert "ks-secret" not in json.dumps(to_topology(mine, source())[0])


def test_no_bootstrap_anywhere_is_connect_default_and_said_so():
    bare = Config("sink.properties", {k: v for k, v in sink().props.items()
                                      if not k.startswith("consumer.override.")})
    t, _, notes = imported(bare, source())
    assert t.sender.kafka["bootstrap.servers"] == "localhost:9092"
    assert any("--sink-worker" in n for n in notes)


def test_encryption_and_compression_classes():
    noop = {"diode.encryption.class": "io.confluent.connect.diode.serde.NoopEncryptor"}
    t, unmapped, notes = imported(sink(**noop), source(**noop))
    assert (t.security.cipher, t.security.allow_plaintext) == ("none", True)
    assert "NoopEncryptor" in unmapped["diode.encryption.password"].reason
    assert password(sink(**noop), source(**noop)) is None  # nothing to write
    assert any("forge" in n for n in notes)

    t, unmapped, _ = imported(sink(**{"diode.compression.class": "com.example.Snappy"}))
    assert t.compression == "none"
    assert "zstd" in unmapped["diode.compression.class"].reason

    no_pw = Config("sink.properties", {k: v for k, v in sink().props.items()
                                       if k != "diode.encryption.password"})
    with pytest.raises(PropertiesError, match="diode.encryption.password not given"):
        to_topology(no_pw)


def test_a_config_provider_password_is_not_copied():
    ref = {"diode.encryption.password": "${file:/etc/kafka/secrets.properties:diode}"}
    t, unmapped, _ = imported(sink(**ref))
    assert t.security.password_file == "secrets/diode.password"
    assert "cannot resolve" in unmapped["diode.encryption.password"].reason
    assert password(sink(**ref), None) is None


def test_buffer_size_is_capped_at_the_largest_datagram():
    t, _, notes = imported(sink(**{"diode.buffer.size.kb": "64"}))
    assert t.link.datagram_size_bytes == 65507
    assert any("more than one UDP datagram holds" in n for n in notes)
    with pytest.raises(PropertiesError, match="sink.properties: diode.buffer.size.kb must be an "
                                              "integer"):
        to_topology(sink(**{"diode.buffer.size.kb": "lots"}))


def test_which_file_is_which():
    a, b = sink(), source()
    assert assign_roles([b, a]) == (a, b)
    unnamed = Config("x.properties", {"topics": "t", "diode.host": "h"})
    assert assign_roles([unnamed]) == (unnamed, None)  # only a sink takes topics
    assert assign_roles([Config("y", {"diode.port": "1"})], sink=a)[1].path == "y"
    with pytest.raises(PropertiesError, match="configures the source connector"):
        assign_roles([], sink=b)
    with pytest.raises(PropertiesError, match="both configure the sink"):
        assign_roles([a, a])
    with pytest.raises(PropertiesError, match="give it with --sink or --source"):
        assign_roles([Config("z", {"diode.port": "1"})])
    with pytest.raises(PropertiesError, match="not the Data Diode"):
        assign_roles([Config("w", {"connector.class": "FileStreamSink"})])


# -- the .properties parser -------------------------------------------------------------------

def test_properties_parser_follows_java_rules():
    text = ("# comment\n"
            "  ! another comment \\\n"
            "a=1\n"
            "b : 2\n"
            "c   3\n"
            "d\n"
            "e = = x\n"
            "long = one, \\\n"
            "       two, \\\n"
            "       three\n"
            "esc\\ key\\=x = tab\\there\\nnew \\u00e9\\u0041 \\\\back \\q\n"
            "emoji=\\ud83d\\ude00\r\n"
            "trailing = x  \n"
            "cr=1\rlf=2\n"
            "a=last wins\n"
            "end=\\\n")
    assert parse_properties(text) == {
        "a": "last wins", "b": "2", "c": "3", "d": "", "e": "= x",
        "long": "one, two, three", "esc key=x": "tab\there\nnew éA \\back q",
        "emoji": "\U0001F600", "trailing": "x  ", "cr": "1", "lf": "2", "end": ""}


def test_properties_parser_names_the_line_of_a_bad_escape():
    with pytest.raises(PropertiesError, match=r"f.properties:3: malformed \\uxxxx"):
        parse_properties("a=1\n\nb=\\u12g4\n", "f.properties")


def test_json_connector_config_is_read_too(tmp_path):
    f = tmp_path / "sink.json"
    f.write_text(json.dumps({"name": "datadiode-sink-connector",
                             "config": {**sink().props, "tasks.max": 1}}))
    c = read_config(str(f))
    assert c.props["tasks.max"] == "1" and c.props["name"] == "datadiode-sink-connector"


# -- the command ------------------------------------------------------------------------------

def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_cli_writes_topology_and_a_0600_password_file(tmp_path, capsys):
    s, r = write(tmp_path, "sink.properties", SINK), write(tmp_path, "source.properties", SOURCE)
    out = tmp_path / "high" / "topology.yaml"
    out.parent.mkdir()
    assert cli.main(["import-properties", r, s, "-o", str(out)]) == 0
    secret = out.parent / "secrets" / "diode.password"
    assert secret.read_text() == "supersecretpassword\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    t = topology.load(out)  # what diode check reads, password path relative to it
    assert Path(t.resolve(t.security.password_file)) == secret
    err = capsys.readouterr().err
    assert str(secret) in err and "tasks.max" in err
    assert "supersecretpassword" not in out.read_text() + err


def test_cli_to_stdout_puts_the_password_here_and_never_prints_it(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = write(tmp_path, "sink.properties", SINK)
    assert cli.main(["import-properties", "--sink", s, "--password-file", "keys/pw"]) == 0
    captured = capsys.readouterr()
    assert yaml.safe_load(captured.out)["security"]["password.file"] == "keys/pw"
    assert (tmp_path / "keys" / "pw").read_text() == "supersecretpassword\n"
    assert "supersecretpassword" not in captured.out + captured.err


def test_cli_refuses_to_replace_another_password_without_force(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = write(tmp_path, "sink.properties", SINK)
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "diode.password").write_text("an older one\n")
    assert cli.main(["import-properties", s]) == 2
    assert "holds another password" in capsys.readouterr().err
    assert cli.main(["import-properties", s, "--force"]) == 0
    assert (tmp_path / "secrets" / "diode.password").read_text() == "supersecretpassword\n"
    assert cli.main(["import-properties", s]) == 0  # the same password: nothing to replace


def test_cli_exits_2_on_bad_input(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a password file would go
    assert cli.main(["import-properties", str(tmp_path / "missing.properties")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = write(tmp_path, "bad.properties", SINK + "oops=\\uZZZZ\n")
    assert cli.main(["import-properties", bad]) == 2
    assert "bad.properties:" in capsys.readouterr().err
    s = write(tmp_path, "sink.properties", SINK)
    r = write(tmp_path, "source.properties", SOURCE.replace("diode.port=3456", "diode.port=9"))
    assert cli.main(["import-properties", s, r]) == 2
    err = capsys.readouterr().err
    assert "sink.properties" in err and "source.properties" in err
    assert not (tmp_path / "secrets").exists()  # nothing written for a failed import
    regex = write(tmp_path, "regex.properties", SINK + "topics.regex=orders(\n")
    assert cli.main(["import-properties", regex]) == 2
    assert "sender.topics.regex" in capsys.readouterr().err  # the registry's own verdict
