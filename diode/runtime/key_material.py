"""The link's key material, read as the topology's security settings name it: the current key
and, during a rotation, the next one, each from a key file (32 raw bytes or 64 hex characters)
or a password (a file or an environment variable; the master key is stretched from it with the
salt). One reading, and one warning for a file other users can read, for a launch and its
SIGHUP reload (diode.runtime.supervisor.load_secrets) and for `diode check`
(diode.runtime.preflight.key_material). No error or warning holds a secret's value.
"""

import os
from typing import NamedTuple

from diode.errors import SecretError
from diode.link import crypto
from diode.runtime.topology import yaml_key

# the keys a topology names: (its settings' prefix, what its password is called in errors)
CURRENT, NEXT = ("", "password"), ("next_", "next password")


class Material(NamedTuple):
    """One key's material as read, not yet stretched."""
    setting: str          # the setting it was read by: security.key.file, security.password.env...
    secret: bytes         # the key file's key, or the password
    is_password: bool
    warning: str | None   # what to tell the operator about it (its file is readable by others)

    def master_key(self, salt: bytes) -> bytes:
        """The 32-byte master key: the key file's, or the password's stretched with `salt`."""
        if self.is_password:
            return crypto.master_key_from_password(self.secret, salt)
        return self.secret


def read(t, which: tuple = CURRENT) -> Material | None:
    """The material of the current key (CURRENT) or the next one (NEXT) of topology `t`, None
    when no setting names one. SecretError saying which setting failed and why: a file that
    cannot be read, a variable not set, an empty password, a key file of the wrong length."""
    prefix, what = which
    sec = t.security
    key_file, password_file, password_env = (getattr(sec, prefix + name) for name in (
        "key_file", "password_file", "password_env"))
    if not (key_file or password_file or password_env):
        return None
    setting = "security." + yaml_key(prefix + ("key_file" if key_file else "password_file"
                                               if password_file else "password_env"))
    path = t.resolve(key_file or password_file) if key_file or password_file else None
    try:
        if key_file:
            secret = crypto.read_key_file(path)
        else:
            secret = crypto.read_secret(path, password_env, what)
            if not secret:
                raise SecretError(f"the password file {path} is empty" if password_file else
                                  f"the environment variable {password_env} is empty")
    except SecretError as exc:
        raise SecretError(f"{setting}: {exc}") from None
    return Material(setting, secret, not key_file, path and readable_by_others(setting, path))


def readable_by_others(setting: str, path: str) -> str | None:
    """The warning for a secret's file that users other than its owner's may read, or None."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        return None  # (reading it said why)
    if not mode & 0o077:
        return None
    return f"{setting}: {path} is readable by other users (mode {mode:o}): chmod 600 {path}"
