"""diode.runtime.files: a file replaced whole, whatever fails on the way, and the permissions a
secret needs from its first byte."""

import errno
import json
import os
import stat

import pytest

from diode.runtime import files


class TornWrite:
    """A file whose write stores half of what it is given, then fails as a full disk does."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def fileno(self):
        return self.f.fileno()

    def write(self, data):
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_write_that_fails_halfway_leaves_the_old_file_whole_and_nothing_aside(tmp_path,
                                                                                monkeypatch):
    path = tmp_path / "checkpoint-0.json"
    files.replace_json(path, {"frontier": 1}, sync=True)
    real = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: TornWrite(real(fd, mode)))
    with pytest.raises(OSError, match="No space left"):
        files.replace_json(path, {"frontier": 2, "pad": "x" * 10_000}, sync=True)
    monkeypatch.undo()
    assert files.read_json(path) == {"frontier": 1}
    assert os.listdir(tmp_path) == [path.name]
    files.replace_json(path, {"frontier": 3}, sync=True)  # and the next write succeeds
    assert files.read_json(path) == {"frontier": 3}


def test_a_failed_sync_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "identity.json"
    files.replace(path, "old", sync=False)

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(OSError, match="Input/output"):
        files.replace(path, "new", sync=True)
    assert path.read_text() == "old" and os.listdir(tmp_path) == [path.name]


def test_data_that_is_not_json_changes_nothing(tmp_path):
    path = tmp_path / "ledger.json"
    files.replace_json(path, [1, 2], sync=False)
    with pytest.raises(TypeError):
        files.replace_json(path, {"when": object()}, sync=False)
    assert files.read_json(path) == [1, 2] and os.listdir(tmp_path) == [path.name]


def test_a_secret_has_its_mode_from_the_start_even_over_a_crash_s_leftover(tmp_path,
                                                                           monkeypatch):
    path = tmp_path / "password"
    (tmp_path / "password.new").write_text("a crash left this, readable by all")
    os.chmod(tmp_path / "password.new", 0o666)
    seen = []
    real = os.fdopen

    def watching(fd, mode):
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real(fd, mode)
    monkeypatch.setattr(os, "fdopen", watching)
    old_umask = os.umask(0)
    try:
        files.replace(path, b"s3cret\n", sync=False, mode=0o600)
    finally:
        os.umask(old_umask)
    assert seen == [0o600]  # before a byte of it was written
    assert path.read_bytes() == b"s3cret\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == [path.name]


def test_json_compact_or_indented_reads_back(tmp_path):
    path = tmp_path / "report.json"
    files.replace_json(path, {"a": [1, 2]}, sync=False)
    assert path.read_text() == '{"a":[1,2]}'
    files.replace_json(path, {"a": [1, 2]}, sync=False, indent=1)
    assert path.read_text() == json.dumps({"a": [1, 2]}, indent=1)
    assert files.read_json(tmp_path / "absent.json") is None
