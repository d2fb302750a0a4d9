"""A command's cluster (diode.kafka.cluster): its settings from a topology's side, -X and
--bootstrap, described without a secret, and librdkafka's complaints turned into the setting to
check; the same settings in the Java client's terms for Spark's connector (diode.kafka.java)."""

import argparse

import pytest
import yaml

from diode import cli
from diode.errors import ClusterError
from diode.kafka.cluster import Cluster, diagnose, of_args, of_options
from diode.kafka.java import Untranslatable, java_settings

SECURED = {"bootstrap.servers": "kafka-low:9093", "security.protocol": "SASL_SSL",
           "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "auditor",
           "sasl.password": "${file:low.password}", "ssl.ca.location": "ca.pem",
           "linger.ms": 50, "acks": "all"}  # (the writers' tuning: not the commands')


@pytest.fixture
def topology(tmp_path):
    (tmp_path / "low.password").write_text("s3cret-low\n")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "link": {"host": "127.0.0.1", "port": 3456},
        "security": {"cipher": "none", "allow.plaintext": True},
        "sender": {"kafka": {"bootstrap.servers": "kafka-high:9092"}, "topics": ["a"]},
        "receiver": {"kafka": SECURED}}))
    return path


def parse(*argv) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def test_the_topology_gives_the_sides_connection_settings_x_and_bootstrap_go_over_them(
        topology, tmp_path, monkeypatch):
    c = of_args(parse("consume", "--topology", str(topology), "--topic", "t"), "receiver")
    assert c.settings == {**{k: v for k, v in SECURED.items() if k not in ("linger.ms", "acks")},
                          "sasl.password": "s3cret-low"}  # read as the launch reads it
    assert c.what == "the destination cluster"
    monkeypatch.setenv("DIODE_TEST_PW", "from-env")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.password").write_text("from-file\n")
    c = of_args(parse("produce", "--topology", str(topology), "--side", "receiver",
                      "-X", "sasl.username=alice", "-X", "sasl.password=${env:DIODE_TEST_PW}",
                      "-X", "ssl.ca.location=${file:other.password}",
                      "--bootstrap", "elsewhere:9093", "--topic", "t"), "sender")
    assert (c.settings["sasl.username"], c.settings["sasl.password"],
            c.settings["ssl.ca.location"], c.bootstrap) == \
        ("alice", "from-env", "from-file", "elsewhere:9093")  # (-X files: from here)
    assert of_args(parse("produce", "--topology", str(topology), "--topic", "t"),
                   "sender").bootstrap == "kafka-high:9092"  # produce: the source by default
    # what it says of each: where it came from, never a secret's value
    text = c.describe()
    assert "sasl.password=(${env:DIODE_TEST_PW} given with -X)" in text
    assert "bootstrap.servers=elsewhere:9093" in text and "from-env" not in text
    assert c.source_of("security.protocol") == f"SASL_SSL in receiver.kafka of {topology}"
    literal = of_options(None, "receiver", [("bootstrap.servers", "h:1"),
                                            ("sasl.password", "typed-out")])
    assert literal.source_of("sasl.password") == "given with -X"
    assert "typed-out" not in literal.describe()


def test_a_setting_that_cannot_be_made_is_an_error_naming_it(topology, monkeypatch):
    monkeypatch.delenv("DIODE_TEST_UNSET", raising=False)
    with pytest.raises(ClusterError, match="the cluster: -X sasl.password: the environment "
                       "variable DIODE_TEST_UNSET is not set"):
        of_options(None, "receiver", [("bootstrap.servers", "h:1"),
                                      ("sasl.password", "${env:DIODE_TEST_UNSET}")])
    (topology.parent / "low.password").unlink()
    with pytest.raises(ClusterError, match="the destination cluster: receiver.kafka."
                       "sasl.password: cannot read .*low.password: No such file"):
        of_options(str(topology), "receiver")
    with pytest.raises(ClusterError, match="no bootstrap.servers: give --bootstrap"):
        of_options(None, "receiver", [("sasl.username", "alice")])
    with pytest.raises(SystemExit):  # (argparse: -X takes KEY=VALUE)
        parse("consume", "-X", "sasl.username", "--topic", "t")


def test_verify_takes_the_source_cluster_apart_from_the_destination(topology):
    from diode.spark import command  # (its parser only: Spark is not imported)
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    args = p.parse_args(["--topology", str(topology), "--source-bootstrap", "kafka-high:9092",
                         "-S", "security.protocol=SSL"])
    assert of_args(args, "receiver").bootstrap == "kafka-low:9093"
    source = of_args(args, "sender", prefix="source-", flag="-S", what="the source cluster")
    assert source.settings == {"bootstrap.servers": "kafka-high:9092",
                               "security.protocol": "SSL"}  # nothing of the destination's
    assert of_args(p.parse_args(["--bootstrap", "h:1"]), "sender", prefix="source-",
                   flag="-S") is None  # no source given: no comparison
    source = of_args(p.parse_args(["--source-topology", str(topology)]), "sender",
                     prefix="source-", flag="-S")
    assert source.bootstrap == "kafka-high:9092"  # the sender side of the file


def cluster(**settings) -> Cluster:
    settings = {"bootstrap.servers": "h:9093", **settings}
    return Cluster("the destination cluster", settings, dict(settings),
                   {k: "given with -X" for k in settings})


AUTH = ("_AUTHENTICATION", "sasl_ssl://h:9093/bootstrap: SASL authentication error: "
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-256 (after 310ms in state AUTH_REQ)")


@pytest.mark.parametrize("errors, lines, final, said", [
    ([AUTH], [], True, "authentication failed for sasl.username=alice (SCRAM-SHA-256 over "
     "SASL_SSL): check sasl.password (given with -X)"),
    ([("_AUTHENTICATION", "SASL PLAIN mechanism handshake failed: Broker: Unsupported SASL "
       "mechanism: broker's supported mechanisms: SCRAM-SHA-512")], [], True,
     "check sasl.mechanism (SCRAM-SHA-256 given with -X)"),
    ([("_SSL", "sasl_ssl://h:9093/bootstrap: SSL handshake failed: error:0A000086:SSL "
       "routines::certificate verify failed: broker certificate could not be verified")], [],
     True, "the broker's TLS certificate is not trusted (SSL handshake failed: certificate "
     "verify failed: broker certificate could not be verified): check ssl.ca.location (not "
     "set)"),
    ([("_TRANSPORT", "ssl://h:9093/bootstrap: SSL handshake failed: Disconnected: SSL "
       "connection closed by peer: connecting to a PLAINTEXT broker listener?")], [], True,
     "a TLS handshake with a listener that does not speak TLS: check security.protocol "
     "(SASL_SSL given with -X)"),
    ([], ["h:9093/bootstrap: Disconnected: connection closed by peer: receive 0 after POLLIN "
          "(after 5ms in state APIVERSION_QUERY)"] * 3, False, ""),  # (SASL_SSL: not that)
    ([("_TRANSPORT", "h:9093/bootstrap: Connect to ipv4#10.0.0.1:9093 failed: Connection "
       "refused (after 0ms in state CONNECT)")], [], False,
     "Connect to ipv4#10.0.0.1:9093 failed: Connection refused: check bootstrap.servers "
     "(h:9093 given with -X)"),
])
def test_what_librdkafka_says_names_the_setting_to_check(errors, lines, final, said):
    got = diagnose(cluster(**{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                              "sasl.username": "alice", "sasl.password": "pw"}), errors, lines)
    assert got[0] == final and said in got[1], got
    assert "pw)" not in got[1]


def test_a_plaintext_client_at_a_secured_listener_is_told_to_check_security_protocol():
    closed = ["h:9093/bootstrap: Disconnected: connection closed by peer: receive 0 after "
              "POLLIN (after 5ms in state APIVERSION_QUERY)"]
    assert diagnose(cluster(), [], closed * 2)[0] is False  # (once or twice: a broker's hiccup)
    final, said = diagnose(cluster(), [], closed * 3)
    assert final and said.endswith("check security.protocol (not set)"), said


def test_the_java_clients_terms_for_spark_s_connector(tmp_path):
    (tmp_path / "client.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n")
    (tmp_path / "client.key").write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n")
    java, notes = java_settings({
        "bootstrap.servers": "h:9093", "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "al\"ice",
        "sasl.password": "p\\w\"d", "ssl.ca.location": str(tmp_path / "client.pem"),
        "ssl.endpoint.identification.algorithm": "none", "socket.timeout.ms": 5000,
        "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"), "ssl.key.password": "kp"})
    assert java == {
        "bootstrap.servers": "h:9093", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="al\\"ice" password="p\\\\w\\"d";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(tmp_path / "client.pem"),
        "ssl.endpoint.identification.algorithm": "", "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "-----BEGIN CERTIFICATE-----\nMIIB\n",
        "ssl.keystore.key": "-----BEGIN PRIVATE KEY-----\nMIIE\n", "ssl.key.password": "kp"}
    assert notes == ["socket.timeout.ms"]
    assert java_settings({"bootstrap.servers": "h:1", "sasl.mechanism": "PLAIN",
                          "sasl.username": "u", "sasl.password": "p"})[0]["sasl.jaas.config"] \
        .startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")
    for refused in ({"sasl.oauthbearer.client.id": "x"}, {"ssl.ca.location": str(tmp_path)},
                    {"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"}):
        with pytest.raises(Untranslatable) as exc:
            java_settings({"bootstrap.servers": "h:1", **refused})
        assert exc.value.key in refused
