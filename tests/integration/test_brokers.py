"""The embedded brokers: started by one piece of code for both kinds, failing with one clear
line that says why and where the log is, needing no network once the cache is there."""

import shutil
import socket
from pathlib import Path

import pytest

from diode.kafka import maven
from diode.jars import KAFKA
from diode.kafka.brokers import KafkaBroker, free_port, make_broker
from diode.errors import DiodeError
from tests.conftest import consume, create_topic, produce


def test_a_port_held_by_another_process_stops_the_start_with_the_log_named(tmp_path,
                                                                          broker_kind):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # bound, not listening: the broker's own bind fails
    port = held.getsockname()[1]
    log = tmp_path / "b.log"
    try:
        with pytest.raises(DiodeError) as exc:
            make_broker(broker_kind, "b", f"127.0.0.1:{port}", str(log)).start()
    finally:
        held.close()
    message = str(exc.value)
    assert "exited with" in message and f"its log: {log}" in message
    assert "\n" not in message


def test_apache_kafka_without_java_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    b = KafkaBroker("b", f"127.0.0.1:{free_port()}")
    try:
        with pytest.raises(DiodeError, match="needs Java 17 or later, and there is no java"):
            b.start()
    finally:
        b.stop()


def test_with_the_cache_present_apache_kafka_starts_without_maven(tmp_path, monkeypatch):
    """The cache is there (./scripts/install filled it): no mvn, no network."""
    assert maven.cached(KAFKA)
    java_home = Path(shutil.which("java")).resolve().parent
    assert not (java_home / "mvn").exists()
    monkeypatch.setenv("PATH", str(java_home))
    b = KafkaBroker("b", f"127.0.0.1:{free_port()}", str(tmp_path / "b.log")).start()
    try:
        create_topic(b.bootstrap, "t", 1)
        produce(b.bootstrap, "t", [{"value": b"offline"}])
        assert [m.value() for m in consume(b.bootstrap, "t", 1)] == [b"offline"]
    finally:
        b.stop()


def test_maven_unreachable_without_a_cache_names_the_reason_and_the_log(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "mvn"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '[INFO] Scanning for projects...'\n"
                    "echo '[ERROR] Failed to execute goal: Could not transfer artifact "
                    "org.apache.kafka:kafka_2.13:pom: Network is unreachable'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{Path(shutil.which('java')).resolve().parent}")
    monkeypatch.setenv("DIODE_CACHE_DIR", str(tmp_path / "cache"))
    b = KafkaBroker("b", f"127.0.0.1:{free_port()}")
    try:
        with pytest.raises(DiodeError) as exc:
            b.start()
    finally:
        b.stop()
    message = str(exc.value)
    assert "could not fetch the embedded Apache Kafka broker" in message
    assert "Network is unreachable" in message
    assert str(tmp_path / "cache" / KAFKA.name / "mvn.log") in message
    assert not maven.cached(KAFKA)  # nothing half-done is taken for a cache next time
