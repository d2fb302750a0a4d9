"""A receiver reloads its keys on SIGHUP (docs/runbooks.md, "Key rotation"): the supervisor
reads the topology file again and hands its workers the keys through worker.KeySlot; a file that
is not valid, or keys that cannot be read, change nothing. Driven without forking or signals."""

import logging

import pytest
import yaml

from diode.link import crypto
from diode.runtime import topology, worker
from diode.runtime.supervisor import Supervisor, load_secrets


def write(path, **security):
    path.write_text(yaml.safe_dump({
        "security": {"password.file": "old.password", "salt": "pepper", **security},
        "sender": {"kafka": {"bootstrap.servers": "high:9092"}, "topics": ["orders"]},
        "receiver": {"kafka": {"bootstrap.servers": "low:9092"}}}))


@pytest.fixture
def receiver(tmp_path):
    """A receiver's supervisor with key 0 loaded, as a launch has it before its workers fork."""
    for name in ("old", "new"):
        (tmp_path / f"{name}.password").write_text(f"{name} password\n")
        (tmp_path / f"{name}.password").chmod(0o600)
    path = tmp_path / "topology.yaml"
    write(path)
    sup = Supervisor(topology.load(path), ("receiver",), str(tmp_path / "run"))
    sup.secrets = load_secrets(sup.t)
    sup.keys.write(sup.secrets)
    return sup, path


def master(tmp_path, name: str) -> bytes:
    return crypto.master_key_from_password(f"{name} password".encode(), b"pepper")


def test_the_key_slot_hands_a_worker_what_the_supervisor_wrote():
    slot = worker.KeySlot(worker.Secrets(1, b"a" * 32, 3))
    assert slot.read() == worker.Secrets(1, b"a" * 32, 3, None, 1)
    slot.write(worker.Secrets(2, b"b" * 32, 3, b"c" * 32, 4))
    got = slot.read()
    assert got.keys() == {3: b"b" * 32, 4: b"c" * 32} and got.cipher_id == 2
    assert worker.KeySlot(worker.Secrets(0, None)).read().master_key is None


def test_a_reload_takes_the_files_keys_through_every_step_of_a_rotation(receiver, tmp_path,
                                                                         caplog):
    sup, path = receiver
    caplog.set_level(logging.INFO)
    old, new = master(tmp_path, "old"), master(tmp_path, "new")
    write(path, **{"next.password.file": "new.password", "next.key.id": 1})  # step 1
    sup._reload()
    assert sup.keys.read().keys() == {0: old, 1: new}
    assert "the receiver accepts key ids 0 (current) and 1 (next)" in caplog.text
    write(path, **{"password.file": "new.password", "key.id": 1})  # step 3
    sup._reload()
    assert sup.keys.read().keys() == {1: new}
    assert sup.status()["keys"] == {"current": 1, "accepted": [1]}
    assert "new password" not in caplog.text and new.hex() not in caplog.text


@pytest.mark.parametrize("edit, why", [
    ({"next.password.file": "missing.password"}, "cannot read the next password file"),
    ({"next.password.file": "new.password", "next.key.id": 0}, "must differ"),
    ({"cipher": "chacha20-poly1305"}, "a restart applies that"),
])
def test_a_reload_that_cannot_be_applied_keeps_the_keys_and_says_why(receiver, tmp_path,
                                                                     caplog, edit, why):
    sup, path = receiver
    write(path, **edit)
    sup._reload()
    assert sup.keys.read().keys() == {0: master(tmp_path, "old")}
    assert sup.t.security.next_password_file == ""
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and why in errors[0], errors
    assert "still accepts key id 0" in errors[0]


def test_a_file_that_is_not_yaml_keeps_the_keys(receiver, tmp_path, caplog):
    sup, path = receiver
    path.write_text("security: [\n")
    sup._reload()
    assert sup.keys.read().keys() == {0: master(tmp_path, "old")}
    assert "not valid YAML" in caplog.text


def test_a_sender_reloads_nothing_and_says_it_takes_a_key_at_its_start(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    (tmp_path / "old.password").write_text("old password\n")
    path = tmp_path / "topology.yaml"
    write(path)
    sup = Supervisor(topology.load(path), ("sender",), str(tmp_path / "run"))
    sup.secrets = load_secrets(sup.t)
    sup.keys.write(sup.secrets)
    write(path, **{"password.file": "new.password", "key.id": 1})
    sup._reload()
    assert sup.keys.read().keys() == {0: master(tmp_path, "old")}
    assert "restart it (a clean stop loses nothing); nothing reloaded" in caplog.text
    assert sup.status()["keys"] == {"current": 0, "accepted": None}
