"""Keys and authenticated encryption.

The master key comes from password + salt (PBKDF2-HMAC-SHA256, 65 536 rounds, as the Confluent
connector) or from a raw key file. Every sender session derives its own key from the master key
over a random 64-bit session id (HKDF-SHA256), and the datagram sequence number is the nonce: a
(key, nonce) pair never repeats, across restarts included, because every process start draws a
new session id.
"""

import os
import struct
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

from diode.errors import RejectedDatagram, SecretError

PBKDF2_ROUNDS = 65536
KEY_BYTES = 32
TAG_BYTES = 16

CIPHER_IDS = {"none": 0, "aes-256-gcm": 1, "chacha20-poly1305": 2}
CIPHER_NAMES = {v: k for k, v in CIPHER_IDS.items()}
_AEAD = {1: AESGCM, 2: ChaCha20Poly1305}


def master_key_from_password(password: bytes, salt: bytes) -> bytes:
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt,
                     iterations=PBKDF2_ROUNDS)
    return kdf.derive(password)


def read_secret(file: str | None, env: str | None, what: str) -> bytes:
    """A secret from a file (trailing newline stripped) or an environment variable."""
    if file:
        try:
            return Path(file).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise SecretError(f"cannot read the {what} file {file}: {exc.strerror}") from None
    if env:
        value = os.environ.get(env)
        if value is None:
            raise SecretError(f"the environment variable {env} (the {what}) is not set")
        return value.encode()
    raise SecretError(f"no {what} configured")


def read_key_file(file: str) -> bytes:
    """A raw 32-byte key, stored as 32 bytes or as 64 hexadecimal characters."""
    try:
        data = Path(file).read_bytes()
    except OSError as exc:
        raise SecretError(f"cannot read the key file {file}: {exc.strerror}") from None
    if len(data) == KEY_BYTES:
        return data
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise SecretError(f"the key file {file} must hold 32 raw bytes or 64 hex characters")
    return key


def session_key(master: bytes, session_id: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                info=b"diode session " + struct.pack("!Q", session_id)).derive(master)


def nonce(seq: int) -> bytes:
    """The 96-bit nonce of datagram `seq` in its session."""
    return struct.pack("!IQ", 0, seq)


def new_session_id() -> int:
    return int.from_bytes(os.urandom(8), "big")


class SessionCipher:
    """Encrypts one sender session's datagrams. Sequence numbers only go up."""

    def __init__(self, cipher_id: int, master: bytes | None, session_id: int):
        self.cipher_id = cipher_id
        self.session_id = session_id
        self._aead = _AEAD[cipher_id](session_key(master, session_id)) if cipher_id else None

    def seal(self, seq: int, header: bytes, plaintext: bytes) -> bytes:
        if self._aead is None:
            return plaintext
        return self._aead.encrypt(nonce(seq), plaintext, header)


class Keyring:
    """The receiver's side: master keys by key id (current and next during a rotation), and
    session ciphers cached by (key id, session id), bounded."""

    MAX_SESSIONS = 1024

    def __init__(self, cipher_id: int, master: bytes | None, others: dict | None = None,
                 key_id: int = 0):
        self.cipher_id = cipher_id
        self.masters = {key_id: master, **(others or {})}
        self._sessions: dict[tuple, object] = {}

    def open(self, cipher_id: int, session_id: int, seq: int, header: bytes, body: bytes,
             key_id: int = 0) -> bytes:
        if cipher_id != self.cipher_id:
            raise RejectedDatagram(
                "wrong_cipher",
                f"datagram uses {CIPHER_NAMES.get(cipher_id, cipher_id)}, this receiver "
                f"{CIPHER_NAMES[self.cipher_id]}")
        if not cipher_id:
            return body
        master = self.masters.get(key_id)
        if master is None:
            raise RejectedDatagram("unknown_key", f"key id {key_id}; this receiver has "
                                   f"{sorted(self.masters)}")
        aead = self._sessions.get((key_id, session_id))
        if aead is None:
            aead = _AEAD[cipher_id](session_key(master, session_id))
        try:
            plaintext = aead.decrypt(nonce(seq), body, header)
        except InvalidTag:
            raise RejectedDatagram("auth_failed", f"session {session_id:016x} seq {seq}") from None
        # Cache only sessions that authenticated, so forged session ids cannot fill the cache.
        if (key_id, session_id) not in self._sessions:
            if len(self._sessions) >= self.MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[(key_id, session_id)] = aead
        return plaintext
