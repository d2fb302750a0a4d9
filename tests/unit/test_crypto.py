"""diode.link.crypto: master keys, per-session keys, AEAD sealing and the receiver's keyring."""

import os

import pytest

from diode.link import crypto, runs, wire
from diode.errors import RejectedDatagram, SecretError
from diode.link.records import Record

ONE = Record("t", 0, 5, 0, 0, None, b"v", ())

AEADS = ["aes-256-gcm", "chacha20-poly1305"]
MASTER = bytes(range(32))
HEADER = b"H" * 28


def ids(name):
    return crypto.CIPHER_IDS[name]


# -- keys --------------------------------------------------------------------------------------

def test_master_key_from_password_is_deterministic_32_bytes():
    a = crypto.master_key_from_password(b"correct horse", b"salt-1")
    b = crypto.master_key_from_password(b"correct horse", b"salt-1")
    assert a == b
    assert len(a) == 32
    assert crypto.master_key_from_password(b"correct horse", b"salt-2") != a
    assert crypto.master_key_from_password(b"correct horsf", b"salt-1") != a


def test_master_key_is_pbkdf2_sha256_with_65536_rounds():
    """Both sides must derive the same key as any other PBKDF2-HMAC-SHA256 implementation."""
    import hashlib
    expected = hashlib.pbkdf2_hmac("sha256", b"pw", b"salt", 65536, 32)
    assert crypto.master_key_from_password(b"pw", b"salt") == expected


def test_session_keys_differ_per_session_and_master():
    keys = {crypto.session_key(MASTER, sid) for sid in (0, 1, 2, 2**64 - 1)}
    assert len(keys) == 4
    assert all(len(k) == 32 for k in keys)
    assert crypto.session_key(MASTER, 7) == crypto.session_key(MASTER, 7)
    assert crypto.session_key(bytes(32), 7) != crypto.session_key(MASTER, 7)


def test_new_session_ids_are_random_64_bit():
    sids = {crypto.new_session_id() for _ in range(200)}
    assert len(sids) == 200
    assert all(0 <= s < 2**64 for s in sids)


def test_nonces_are_96_bits_and_distinct_per_sequence_number():
    nonces = {crypto.nonce(seq) for seq in (0, 1, 2, 2**32, 2**64 - 1)}
    assert len(nonces) == 5
    assert all(len(n) == 12 for n in nonces)


# -- sealing and opening -----------------------------------------------------------------------

@pytest.mark.parametrize("cipher", AEADS)
def test_seal_open_round_trip(cipher):
    sender = crypto.SessionCipher(ids(cipher), MASTER, 0x1234)
    receiver = crypto.Keyring(ids(cipher), MASTER)
    body = sender.seal(5, HEADER, b"secret records")

    assert b"secret records" not in body
    assert len(body) == len(b"secret records") + crypto.TAG_BYTES
    assert receiver.open(ids(cipher), 0x1234, 5, HEADER, body) == b"secret records"


def test_none_cipher_passes_plaintext_through():
    sender = crypto.SessionCipher(0, None, 99)
    body = sender.seal(1, HEADER, b"clear")
    assert body == b"clear"
    assert crypto.Keyring(0, None).open(0, 99, 1, HEADER, body) == b"clear"


@pytest.mark.parametrize("cipher", AEADS)
def test_password_derived_keys_interoperate_and_wrong_password_fails(cipher):
    salt = b"shared salt"
    sender = crypto.SessionCipher(
        ids(cipher), crypto.master_key_from_password(b"right", salt), 42)
    body = sender.seal(1, HEADER, b"payload")

    good = crypto.Keyring(ids(cipher), crypto.master_key_from_password(b"right", salt))
    assert good.open(ids(cipher), 42, 1, HEADER, body) == b"payload"

    bad = crypto.Keyring(ids(cipher), crypto.master_key_from_password(b"wrong", salt))
    with pytest.raises(RejectedDatagram) as exc:
        bad.open(ids(cipher), 42, 1, HEADER, body)
    assert exc.value.reason == "auth_failed"


@pytest.mark.parametrize("cipher", AEADS)
@pytest.mark.parametrize("tamper", ["header", "body", "tag", "seq", "session"])
def test_tampering_is_detected(cipher, tamper):
    sender = crypto.SessionCipher(ids(cipher), MASTER, 77)
    body = bytearray(sender.seal(9, HEADER, b"x" * 40))
    header, seq, sid = bytearray(HEADER), 9, 77
    if tamper == "header":
        header[3] ^= 0x01
    elif tamper == "body":
        body[10] ^= 0x80
    elif tamper == "tag":
        body[-1] ^= 0x01
    elif tamper == "seq":
        seq = 10  # a different nonce
    else:
        sid = 78  # a different session key

    with pytest.raises(RejectedDatagram) as exc:
        crypto.Keyring(ids(cipher), MASTER).open(ids(cipher), sid, seq, bytes(header),
                                                 bytes(body))
    assert exc.value.reason == "auth_failed"


@pytest.mark.parametrize("receiver, datagram", [
    ("aes-256-gcm", "chacha20-poly1305"),
    ("chacha20-poly1305", "aes-256-gcm"),
    ("aes-256-gcm", "none"),  # a forged plaintext datagram must not bypass authentication
    ("none", "aes-256-gcm"),
])
def test_cipher_mismatch_is_rejected(receiver, datagram):
    sender = crypto.SessionCipher(ids(datagram), MASTER, 1)
    body = sender.seal(1, HEADER, b"payload")
    keyring = crypto.Keyring(ids(receiver), MASTER)
    with pytest.raises(RejectedDatagram) as exc:
        keyring.open(ids(datagram), 1, 1, HEADER, body)
    assert exc.value.reason == "wrong_cipher"


def test_unknown_cipher_id_is_rejected():
    with pytest.raises(RejectedDatagram) as exc:
        crypto.Keyring(1, MASTER).open(9, 1, 1, HEADER, b"x" * 32)
    assert exc.value.reason == "wrong_cipher"


# -- the keyring's session cache ----------------------------------------------------------------

@pytest.fixture
def derivations(monkeypatch):
    """Counts session key derivations (HKDF), i.e. cache misses of the keyring."""
    calls = []
    real = crypto.session_key

    def counting(master, session_id):
        calls.append(session_id)
        return real(master, session_id)

    monkeypatch.setattr(crypto, "session_key", counting)
    return calls


def test_keyring_caches_authenticated_sessions(derivations):
    sender = crypto.SessionCipher(1, MASTER, 5)
    keyring = crypto.Keyring(1, MASTER)
    derivations.clear()
    for seq in range(1, 20):
        assert keyring.open(1, 5, seq, HEADER, sender.seal(seq, HEADER, b"r")) == b"r"
    assert derivations == [5]


def test_keyring_cache_is_bounded():
    keyring = crypto.Keyring(1, MASTER)
    keyring.MAX_SESSIONS = 8
    for sid in range(30):
        body = crypto.SessionCipher(1, MASTER, sid).seal(1, HEADER, b"r")
        assert keyring.open(1, sid, 1, HEADER, body) == b"r"
        assert len(keyring._sessions) <= 8
    # the newest sessions are the ones kept, and they still open
    assert (0, 29) in keyring._sessions
    old = crypto.SessionCipher(1, MASTER, 0).seal(2, HEADER, b"again")
    assert keyring.open(1, 0, 2, HEADER, old) == b"again"


def test_forged_sessions_are_not_cached_and_do_not_evict_real_ones(derivations):
    keyring = crypto.Keyring(1, MASTER)
    keyring.MAX_SESSIONS = 4
    real = crypto.SessionCipher(1, MASTER, 1000)
    assert keyring.open(1, 1000, 1, HEADER, real.seal(1, HEADER, b"ok")) == b"ok"

    for sid in range(50):  # an attacker floods forged session ids
        with pytest.raises(RejectedDatagram) as exc:
            keyring.open(1, sid, 1, HEADER, os.urandom(40))
        assert exc.value.reason == "auth_failed"

    assert set(keyring._sessions) == {(0, 1000)}
    derivations.clear()
    assert keyring.open(1, 1000, 2, HEADER, real.seal(2, HEADER, b"ok")) == b"ok"
    assert derivations == []  # the real session was still cached


# -- secrets -----------------------------------------------------------------------------------

def test_read_secret_from_file_strips_trailing_newline(tmp_path):
    f = tmp_path / "password"
    f.write_bytes(b"s3cret pass \r\n")
    assert crypto.read_secret(str(f), None, "password") == b"s3cret pass "


def test_read_secret_file_wins_over_env(tmp_path, monkeypatch):
    f = tmp_path / "password"
    f.write_bytes(b"from file\n")
    monkeypatch.setenv("DIODE_TEST_PW", "from env")
    assert crypto.read_secret(str(f), "DIODE_TEST_PW", "password") == b"from file"


def test_read_secret_from_env(monkeypatch):
    monkeypatch.setenv("DIODE_TEST_PW", "p\u00e4ss")
    assert crypto.read_secret(None, "DIODE_TEST_PW", "password") == "p\u00e4ss".encode()


def test_read_secret_missing_file(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(SecretError) as exc:
        crypto.read_secret(str(missing), None, "password")
    assert str(missing) in str(exc.value) and "password" in str(exc.value)


def test_read_secret_missing_env(monkeypatch):
    monkeypatch.delenv("DIODE_TEST_UNSET", raising=False)
    with pytest.raises(SecretError) as exc:
        crypto.read_secret(None, "DIODE_TEST_UNSET", "password")
    assert "DIODE_TEST_UNSET" in str(exc.value)


def test_read_secret_nothing_configured():
    with pytest.raises(SecretError):
        crypto.read_secret(None, None, "password")
    with pytest.raises(SecretError):
        crypto.read_secret("", "", "salt")


def test_read_key_file_raw_bytes(tmp_path):
    key = os.urandom(32)
    f = tmp_path / "key"
    f.write_bytes(key)
    assert crypto.read_key_file(str(f)) == key


@pytest.mark.parametrize("suffix", [b"", b"\n", b"\r\n"])
def test_read_key_file_hex(tmp_path, suffix):
    key = os.urandom(32)
    f = tmp_path / "key"
    f.write_bytes(key.hex().encode() + suffix)
    assert crypto.read_key_file(str(f)) == key
    f.write_bytes(key.hex().upper().encode() + suffix)
    assert crypto.read_key_file(str(f)) == key


@pytest.mark.parametrize("content", [b"", b"\x00" * 31, b"\x00" * 33, b"ab" * 31,
                                     b"ab" * 33, b"zz" * 32, b"\xff" * 64])
def test_read_key_file_rejects_bad_sizes_and_content(tmp_path, content):
    f = tmp_path / "key"
    f.write_bytes(content)
    with pytest.raises(SecretError) as exc:
        crypto.read_key_file(str(f))
    assert str(f) in str(exc.value)


def test_read_key_file_missing(tmp_path):
    with pytest.raises(SecretError):
        crypto.read_key_file(str(tmp_path / "missing"))


def test_key_rotation_receiver_accepts_current_and_next_keys_only():
    old, new, stranger = os.urandom(32), os.urandom(32), os.urandom(32)
    receiver = crypto.Keyring(1, old, {1: new}, key_id=0)
    for key_id, master in ((0, old), (1, new)):
        sealer = wire.Sealer(crypto.SessionCipher(1, master, 77 + key_id), "none", key_id)
        dg = sealer.seal(runs.encode_records([ONE], {"t": 1}))
        assert wire.open_datagram(dg, receiver) == ([ONE], {"t": 1})
    # a key id the receiver does not hold, and the right id with the wrong key
    for key_id, master, reason in ((2, new, "unknown_key"), (1, stranger, "auth_failed")):
        sealer = wire.Sealer(crypto.SessionCipher(1, master, 99), "none", key_id)
        with pytest.raises(RejectedDatagram) as exc:
            wire.open_datagram(sealer.seal(runs.encode_records([ONE])), receiver)
        assert exc.value.reason == reason
