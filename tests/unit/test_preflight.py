"""diode.runtime.preflight and `diode check`: what a launch would need on this host, every
problem at once, each naming its setting and its file, variable or address. No broker here:
the clusters are asked in tests/integration/test_check_clusters.py."""

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from diode.kafka.brokers import free_port
from diode.runtime import preflight, topology
from tests.conftest import ROOT, posing_as_launch, write_topology


def load(tmp_path, **overrides):
    """The topology as `diode check` sees it on this host (its `auto` settings chosen)."""
    return topology.for_this_host(topology.load(write_topology(tmp_path, "127.0.0.1:1",
                                                               "127.0.0.1:2", **overrides)))


def check(path, *extra):
    """`diode check` as an operator runs it (a short wait for the clusters, which are not
    there: warnings only)."""
    return subprocess.run([sys.executable, "-m", "diode", "check", str(path), "--no-measure",
                           "--timeout", "0.5", *extra], capture_output=True, text=True,
                          cwd=ROOT)


def test_a_missing_password_file_fails_the_check_naming_setting_and_file(tmp_path):
    path = write_topology(tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                          security={"password.file": "secrets/none"})
    r = check(path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"security.password.file: cannot read the password file "
            f"{tmp_path / 'secrets' / 'none'}: No such file or directory") in r.stderr
    assert "valid" not in r.stdout


def test_an_unset_password_variable_fails_the_check(tmp_path, monkeypatch):
    monkeypatch.delenv("DIODE_TEST_NO_PASSWORD", raising=False)
    t = load(tmp_path, security={"password.file": "", "password.env": "DIODE_TEST_NO_PASSWORD"})
    assert preflight.key_material(t).problems == [
        "security.password.env: the environment variable DIODE_TEST_NO_PASSWORD (the password) "
        "is not set"]
    monkeypatch.setenv("DIODE_TEST_NO_PASSWORD", "")
    assert preflight.key_material(t).problems == [
        "security.password.env: the environment variable DIODE_TEST_NO_PASSWORD is empty"]
    monkeypatch.setenv("DIODE_TEST_NO_PASSWORD", "a password")
    assert preflight.key_material(t).problems == []


def test_key_files_must_hold_a_key_and_the_next_key_is_checked_too(tmp_path, monkeypatch):
    (tmp_path / "short.key").write_bytes(b"0123456789")
    (tmp_path / "good.key").write_text("ab" * 32 + "\n")
    (tmp_path / "good.key").chmod(0o600)
    monkeypatch.delenv("DIODE_TEST_NEXT", raising=False)
    t = load(tmp_path, security={"password.file": "", "key.file": "short.key",
                                 "next.password.env": "DIODE_TEST_NEXT"})
    assert preflight.key_material(t).problems == [
        f"security.key.file: the key file {tmp_path / 'short.key'} must hold 32 raw bytes or "
        "64 hex characters",
        "security.next.password.env: the environment variable DIODE_TEST_NEXT (the next "
        "password) is not set"]
    t = load(tmp_path, security={"password.file": "", "key.file": "good.key",
                                 "next.key.file": "short.key"})
    assert [p.split(":")[0] for p in preflight.key_material(t).problems] == [
        "security.next.key.file"]
    (tmp_path / "good.key").chmod(0o644)  # a key others can read: said, not refused
    t = load(tmp_path, security={"password.file": "", "key.file": "good.key"})
    found = preflight.key_material(t)
    assert found.problems == [] and f"chmod 600 {tmp_path / 'good.key'}" in found.warnings[0]


def test_a_launch_reads_the_keys_as_check_does_with_its_warning_and_its_refusals(
        tmp_path, monkeypatch, caplog):
    from diode.errors import SecretError
    from diode.runtime.supervisor import load_secrets
    (tmp_path / "open.key").write_text("ab" * 32 + "\n")
    (tmp_path / "open.key").chmod(0o644)
    t = load(tmp_path, security={"password.file": "", "key.file": "open.key"})
    with caplog.at_level("WARNING", logger="diode.runtime.supervisor"):
        assert load_secrets(t).master_key == bytes.fromhex("ab" * 32)
    assert [r.getMessage() for r in caplog.records] == preflight.key_material(t).warnings == [
        f"security.key.file: {tmp_path / 'open.key'} is readable by other users (mode 644): "
        f"chmod 600 {tmp_path / 'open.key'}"]
    monkeypatch.setenv("DIODE_TEST_EMPTY", "")  # a key anyone could derive: refused by both
    t = load(tmp_path, security={"password.file": "", "password.env": "DIODE_TEST_EMPTY"})
    with pytest.raises(SecretError) as refused:
        load_secrets(t)
    assert preflight.key_material(t).problems == [str(refused.value)]


def test_kafka_secrets_and_tls_files_are_each_named_never_a_value(tmp_path, monkeypatch):
    monkeypatch.delenv("DIODE_TEST_UNSET", raising=False)
    monkeypatch.setenv("DIODE_TEST_SECRET", "hunter2-value")
    (tmp_path / "keypath").write_text(str(tmp_path / "no-such.key") + "\n")
    t = load(tmp_path, sender={"kafka": {"sasl.password": "${env:DIODE_TEST_UNSET}",
                                         "sasl.username": "${file:user}",
                                         "ssl.ca.location": str(tmp_path / "ca.pem")}},
             receiver={"kafka": {"sasl.password": "${env:DIODE_TEST_SECRET}",
                                 "ssl.key.location": "${file:keypath}",
                                 "ssl.certificate.location": str(tmp_path)}})
    sender, failed = preflight.kafka_files(t, "sender")
    assert sender.problems == [
        "sender.kafka.sasl.password: the environment variable DIODE_TEST_UNSET is not set",
        f"sender.kafka.sasl.username: cannot read {tmp_path / 'user'}: No such file or "
        "directory",
        f"sender.kafka.ssl.ca.location: cannot read {tmp_path / 'ca.pem'}: No such file or "
        "directory"]
    assert failed == {"sasl.password", "sasl.username", "ssl.ca.location"}
    receiver, _ = preflight.kafka_files(t, "receiver")
    assert receiver.problems == [
        f"receiver.kafka.ssl.key.location: cannot read {tmp_path / 'no-such.key'}: No such "
        "file or directory",
        f"receiver.kafka.ssl.certificate.location: cannot read {tmp_path}: Is a directory"]
    (tmp_path / "ca.pem").write_text("a CA\n")  # a CA directory is fine, as librdkafka takes it
    t = load(tmp_path, sender={"kafka": {"ssl.ca.location": str(tmp_path)}},
             receiver={"kafka": {"ssl.ca.location": "probe"}})
    assert preflight.kafka_files(t, "sender")[0].problems == []
    assert preflight.kafka_files(t, "receiver")[0].problems == []


def test_the_whole_check_reports_everything_at_once_and_only_for_the_side_asked(
        tmp_path, monkeypatch):
    monkeypatch.delenv("DIODE_TEST_UNSET", raising=False)
    (tmp_path / "afile").write_text("")
    path = write_topology(tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                          security={"password.file": "missing"},
                          sender={"kafka": {"sasl.password": "${env:DIODE_TEST_UNSET}"}},
                          receiver={"journal.dir": "afile/journal",
                                    "kafka": {"ssl.ca.location": "/nonexistent/ca.pem"}})
    r = check(path)
    assert r.returncode == 2
    for said in ["security.password.file:", "sender.kafka.sasl.password: the environment "
                 "variable DIODE_TEST_UNSET is not set", "receiver.kafka.ssl.ca.location: "
                 "cannot read /nonexistent/ca.pem", f"receiver.journal.dir: cannot create "
                 f"{tmp_path / 'afile' / 'journal'}: {tmp_path / 'afile'} is not a directory"]:
        assert said in r.stderr, r.stderr
    r = check(path, "--side", "sender")  # the receiver's host has the receiver's files
    assert r.returncode == 2 and "security.password.file:" in r.stderr
    assert "sender.kafka.sasl.password" in r.stderr and "receiver." not in r.stderr


def test_the_journal_directory_must_be_writable_or_creatable(tmp_path):
    (tmp_path / "afile").write_text("")
    t = load(tmp_path, receiver={"journal.dir": "afile"})
    assert preflight.journal_dir(t).problems == [
        f"receiver.journal.dir: {tmp_path / 'afile'} is not a directory"]
    t = load(tmp_path, receiver={"journal.dir": "afile/deeper/journal"})
    assert preflight.journal_dir(t).problems == [
        f"receiver.journal.dir: cannot create {tmp_path / 'afile' / 'deeper' / 'journal'}: "
        f"{tmp_path / 'afile'} is not a directory"]
    t = load(tmp_path, receiver={"journal.dir": "new/journal"})
    found = preflight.journal_dir(t)
    assert found.problems == [] and "writable (made at launch)" in found.notes[0]
    assert " free on its filesystem" in found.notes[0]
    assert not (tmp_path / "new").exists()  # a check makes nothing
    t = load(tmp_path, receiver={"journal.dir": "new/journal", "journal.max.bytes": 1 << 60})
    assert "less than receiver.journal.max.bytes" in preflight.journal_dir(t).warnings[0]


def test_a_run_directory_too_long_for_its_sockets_is_a_problem(tmp_path):
    deep = tmp_path / ("d" * 90)
    t = load(tmp_path, supervisor={"run.dir": str(deep)})
    found = preflight.directories(t, ("receiver",))
    path = deep / "receiver-udp_reader-0.control"
    assert found.problems == [
        f"supervisor.run.dir: {deep} is too long for the queues' sockets in it: "
        f"{path} is {len(str(path))} bytes, a Unix socket path at most 107"]
    t = load(tmp_path, supervisor={"run.dir": str(tmp_path / "run")})
    assert preflight.directories(t, ("receiver",)).problems == []


def ports_while_taken(t) -> preflight.Report:
    """What the receiver's check finds while another socket holds its UDP port."""
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", t.link.port))
    try:
        return preflight.ports_report(t, ("receiver",))
    finally:
        taken.close()


def test_a_port_in_use_or_an_address_not_here_is_a_problem(tmp_path):
    t = load(tmp_path)
    found = ports_while_taken(t)
    assert found.problems == [
        f"link.bind.address, link.port: udp 127.0.0.1:{t.link.port} is in use by another "
        "process (is another receiver running?)"]
    assert preflight.ports_report(t, ("sender",)).problems == []  # the sender binds nothing
    metrics = free_port()
    t = load(tmp_path, link={"bind.address": "192.0.2.7"},
             receiver={"metrics.listen": f"127.0.0.1:{metrics}"})
    listening = socket.socket()
    listening.bind(("127.0.0.1", metrics))
    listening.listen()
    try:
        found = preflight.ports_report(t, ("receiver",))
    finally:
        listening.close()
    assert found.problems == [
        f"link.bind.address, link.port: cannot assign udp 192.0.2.7:{t.link.port}: Cannot "
        "assign requested address (not an address of this host)",
        f"receiver.metrics.listen: tcp 127.0.0.1:{metrics} is in use by another process"]


def test_a_port_held_by_this_topologys_running_receiver_is_said_so(tmp_path):
    t = load(tmp_path)
    with posing_as_launch(Path(t.path), ("receiver",), tmp_path / "run"):
        found = ports_while_taken(t)
    assert found.problems == []
    assert found.warnings == [
        f"link.bind.address, link.port: udp 127.0.0.1:{t.link.port} is held by this "
        f"topology's running receiver (diode launch, pid {os.getpid()}): a second launch "
        "would fail; stop it first"]


def test_check_side_shows_that_side_only(tmp_path):
    path = write_topology(tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                          brokers=[{"name": "high", "kind": "tansu", "side": "sender",
                                    "listen": f"127.0.0.1:{free_port()}"},
                                   {"name": "low", "kind": "tansu", "side": "receiver",
                                    "listen": f"127.0.0.1:{free_port()}"}])
    both = check(path)
    assert both.returncode == 0, both.stderr
    assert "sender/packer-0" in both.stdout and "receiver/unpacker-0" in both.stdout
    sender = check(path, "--side", "sender")
    assert sender.returncode == 0, sender.stderr
    assert "sender/packer-0" in sender.stdout and "broker high" in sender.stdout
    for other in ("receiver/", "receive journal", "receiver state", "broker low",
                  "link.bind.address", "receiver.journal.dir"):
        assert other not in sender.stdout, (other, sender.stdout)
    assert "receiver.kafka" not in sender.stderr and "destination" not in sender.stderr
    receiver = check(path, "--side", "receiver")
    assert receiver.returncode == 0, receiver.stderr
    assert "receiver/unpacker-0" in receiver.stdout and "receive journal" in receiver.stdout
    assert "sender/" not in receiver.stdout and "broker high" not in receiver.stdout
    assert "sender.kafka" not in receiver.stderr and "source cluster" not in receiver.stderr


@pytest.mark.parametrize("command", ["check", "launch"])
def test_a_yaml_error_names_its_file_line_and_column(tmp_path, command):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlink:\n  port: 1\n bad: 2\n")
    r = subprocess.run([sys.executable, "-m", "diode", command, str(bad)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert f"{bad}: 1 error(s)\n  line 4, column 2: not valid YAML: expected <block end>, " \
        "but found '<block mapping start>'" in r.stderr, r.stderr
    assert "<unicode string>" not in r.stderr and "Traceback" not in r.stderr


def test_check_says_who_can_reach_the_receivers_port(tmp_path):
    """The bind address auto chose and the source filter, or a warning for each opening: no
    filter, or every address bound because link.host is not this host's."""
    t = load(tmp_path, link={"bind.address": "auto"})
    found = preflight.admission_report(t)
    assert f"udp 127.0.0.1:{t.link.port} (link.bind.address auto: link.host, an address of " \
        "this host)" in found.notes
    assert found.notes[-1] == (
        "link.source.addresses: datagrams from 127.0.0.1 alone reach udp "
        f"127.0.0.1:{t.link.port}, the others dropped by the kernel (a socket filter; "
        "diode_source_filtered_datagrams_total)")
    assert found.warnings == []
    t = load(tmp_path, link={"host": "192.0.2.7", "bind.address": "auto",
                             "source.addresses": []})
    found = preflight.admission_report(t)
    assert found.warnings == [
        "link.bind.address: auto: link.host 192.0.2.7 is not an address of this host, so every "
        "address (0.0.0.0); set link.bind.address to the address the diode's datagrams come to",
        f"link.source.addresses is empty: any host that reaches udp 0.0.0.0:{t.link.port} is "
        "read, and a flood of datagrams from the low network crowds out the diode's own; name "
        "the diode's sending address there and filter the port in the firewall "
        "(docs/threat-model.md)"]
    r = check(write_topology(tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                             link={"source.addresses": []}), "--side", "receiver")
    assert r.returncode == 0 and "warning: link.source.addresses is empty" in r.stderr, r.stderr


def test_check_tells_a_kernel_that_filters_but_cannot_count_from_one_that_refuses_the_filter(
        tmp_path, monkeypatch):
    """As the launch does (admission.open_receiving): a kernel that takes the socket filter but
    not the reuseport program that counts what it drops still filters in the kernel; one that
    refuses the filter leaves it to the udp_reader."""
    from diode.link import admission
    attach = admission.attach
    refused = set()

    def refusing(sock, option, program):
        if option in refused:
            raise OSError(errno.EPERM, "Operation not permitted")
        return attach(sock, option, program)
    monkeypatch.setattr(admission, "attach", refusing)
    t = load(tmp_path, link={"bind.address": "auto"})
    refused.add(admission.SO_ATTACH_REUSEPORT_CBPF)
    found = preflight.admission_report(t)
    assert found.warnings == [
        "link.source.addresses: the kernel drops datagrams from addresses other than 127.0.0.1 "
        f"before udp 127.0.0.1:{t.link.port}, but cannot count them apart (Operation not "
        "permitted): diode_socket_drops_total counts them with those a full buffer drops"]
    refused.add(admission.SO_ATTACH_FILTER)
    found = preflight.admission_report(t)
    assert len(found.warnings) == 1 and "this kernel refuses the source filter (Operation not " \
        "permitted): the udp_reader drops datagrams" in found.warnings[0], found.warnings
