"""diode.runtime.journal: what the receiver relies on after a crash, a full disk or a restart."""

import errno
import io
import logging
import os
import time
import zlib

import pytest

from diode.runtime import journal as journal_mod
from diode.runtime.journal import HEADER, Journal, JournalError, JournalFull, records, segment_name

REC = HEADER.size


def datagram(i: int, n: int = 42) -> bytes:
    """A recognisable datagram: its index, padded to n bytes."""
    return (b"%08d" % i).ljust(n, b"x")


def opened(path, **kw) -> Journal:
    j = Journal(str(path), **kw)
    j.open()
    return j


def segment_files(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".journal"))


def test_append_returns_positions_and_read_gives_the_datagrams_back(tmp_path):
    j = opened(tmp_path)
    batch = [b"a", bytearray(b"bb"), memoryview(b"ccc"), b""]
    positions = j.append(batch)
    assert positions == [0, REC + 1, 2 * REC + 3, 3 * REC + 6]
    assert j.end == 4 * REC + 6 and j.start == 0 and j.size == j.end
    assert list(j.read(0)) == [(0, b"a"), (REC + 1, b"bb"), (2 * REC + 3, b"ccc"),
                               (3 * REC + 6, b"")]
    assert list(j.read(positions[2])) == [(2 * REC + 3, b"ccc"), (3 * REC + 6, b"")]
    assert list(j.read(j.end)) == []
    j.close()


def test_memoryview_of_another_format_is_journalled_by_bytes(tmp_path):
    j = opened(tmp_path)
    raw = bytes(range(16))
    j.append([memoryview(raw).cast("I")])
    assert list(j.read(0)) == [(0, raw)]
    j.close()


def test_read_stops_at_the_end_as_of_the_call(tmp_path):
    j = opened(tmp_path)
    j.append([b"one"])
    reader = j.read(0)
    j.append([b"two"])
    assert [d for _, d in reader] == [b"one"]
    j.close()


def test_large_datagrams_across_read_chunks_and_segments(tmp_path):
    j = opened(tmp_path, segment_bytes=1 << 20)
    big = [os.urandom(65507) for _ in range(40)]            # 2.6 MB: several chunks, segments
    positions = []
    for i in range(0, 40, 4):
        positions += j.append(big[i:i + 4])
    assert len(segment_files(tmp_path)) > 1
    assert list(j.read(0)) == list(zip(positions, big))
    j.close()


def test_reopen_continues_positions(tmp_path):
    j = opened(tmp_path)
    first = j.append([datagram(0), datagram(1)])
    j.close()
    j = opened(tmp_path)
    assert (j.start, j.end) == (0, 2 * (REC + 42))
    second = j.append([datagram(2)])
    assert second == [first[-1] + REC + 42]
    assert [d for _, d in j.read(0)] == [datagram(0), datagram(1), datagram(2)]
    j.close()


def test_segments_are_named_by_position_and_a_batch_is_never_split(tmp_path):
    j = opened(tmp_path, segment_bytes=100)
    j.append([datagram(i) for i in range(5)])               # 250 bytes: one segment
    assert segment_files(tmp_path) == [segment_name(0)]
    (p,) = j.append([datagram(5)])                           # the segment is full: roll
    assert p == 250
    assert segment_files(tmp_path) == [segment_name(0), segment_name(250)]
    assert segment_name(67108864) == "00000000000067108864.journal"
    assert [d for _, d in j.read(0)] == [datagram(i) for i in range(6)]
    j.close()


def last_segment(path) -> str:
    return os.path.join(path, segment_files(path)[-1])


@pytest.mark.parametrize("damage", ["truncate mid-record", "flip a byte", "garbage length"])
def test_torn_or_corrupt_tail_is_cut_and_the_journal_keeps_working(tmp_path, caplog, damage):
    j = opened(tmp_path)
    positions = j.append([datagram(0), datagram(1), datagram(2)])
    j.close()
    seg = last_segment(tmp_path)
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:
        if damage == "truncate mid-record":
            f.truncate(size - 5)
            cut = REC + 42 - 5
        elif damage == "flip a byte":
            f.seek(size - 1)
            last = f.read(1)
            f.seek(size - 1)
            f.write(bytes([last[0] ^ 0xFF]))
            cut = REC + 42
        else:
            f.seek(positions[2])
            f.write(HEADER.pack(0xFFFFFFFF, 0))
            cut = REC + 42

    with caplog.at_level(logging.WARNING, logger="diode.runtime.journal"):
        j = opened(tmp_path)
    assert f"cut {cut} bytes" in caplog.text
    assert j.end == positions[2]
    assert os.path.getsize(seg) == positions[2]
    assert j.append([datagram(3)]) == [positions[2]]
    assert [d for _, d in j.read(0)] == [datagram(0), datagram(1), datagram(3)]
    j.close()


def test_records_stops_quietly_at_a_torn_tail():
    data = HEADER.pack(2, zlib.crc32(b"ok")) + b"ok"
    torn = data + HEADER.pack(10, 0) + b"abc"
    scan = records(io.BytesIO(torn), 0, len(torn))
    got = []
    try:
        while True:
            got.append(next(scan))
    except StopIteration as done:
        assert done.value == len(data)
    assert got == [(0, b"ok")]


def fill_segments(path, count):
    """A journal whose segments hold two 50-byte records each (the third append rolls)."""
    j = opened(path, segment_bytes=100)
    positions = [j.append([datagram(i)])[0] for i in range(count)]
    return j, positions


def test_release_deletes_only_whole_segments_below_the_mark(tmp_path):
    j, positions = fill_segments(tmp_path, 6)             # segments at 0, 100, 200
    assert segment_files(tmp_path) == [segment_name(0), segment_name(100), segment_name(200)]
    assert j.release(199) == 100                            # 100..199 still holds a record
    assert segment_files(tmp_path) == [segment_name(100), segment_name(200)]
    assert j.start == 100 and j.size == 200
    assert j.release(10 ** 9) == 100                        # never the segment being written
    assert segment_files(tmp_path) == [segment_name(200)]
    assert j.start == 200 and j.end == 300
    j.close()


def test_reading_from_a_released_position_starts_at_start(tmp_path, caplog):
    j, positions = fill_segments(tmp_path, 6)
    j.release(200)
    with caplog.at_level(logging.WARNING, logger="diode.runtime.journal"):
        got = list(j.read(0))
    assert got == [(200, datagram(4)), (250, datagram(5))]
    assert "released" in caplog.text
    j.close()


def test_positions_are_never_reused_after_release_and_restart(tmp_path):
    j, positions = fill_segments(tmp_path, 6)
    j.release(10 ** 9)
    j.close()
    j = opened(tmp_path, segment_bytes=100)
    assert (j.start, j.end) == (200, 300)
    assert j.append([datagram(6)]) == [300]
    assert [p for p, _ in j.read(0)] == [200, 250, 300]
    j.close()


def test_journal_full_at_the_bound_writes_nothing_until_released(tmp_path):
    j = opened(tmp_path, max_bytes=200, segment_bytes=100)
    for i in range(4):
        j.append([datagram(i)])                              # exactly 200 bytes: allowed
    with pytest.raises(JournalFull, match="full"):
        j.append([datagram(4)])
    assert j.end == 200
    assert sum(os.path.getsize(tmp_path / n) for n in segment_files(tmp_path)) == 200
    assert [d for _, d in j.read(0)] == [datagram(i) for i in range(4)]
    j.release(100)                                           # the forwarder caught up
    assert j.append([datagram(4)]) == [200]
    j.close()


def test_a_file_in_the_way_is_a_journal_error_naming_the_path(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    where = tmp_path / "file" / "journal"
    with pytest.raises(JournalError, match=str(where)):
        Journal(str(where)).open()


def test_two_journals_cannot_share_a_directory(tmp_path):
    j = opened(tmp_path)
    with pytest.raises(JournalError, match="in use"):
        Journal(str(tmp_path)).open()
    j.close()
    opened(tmp_path).close()                                 # released on close


def test_disk_full_mid_batch_leaves_the_journal_consistent(tmp_path, monkeypatch):
    j = opened(tmp_path)
    before = j.append([datagram(0)])
    real_write = os.write
    calls = []

    def half_then_enospc(fd, buf):
        """A disk that takes half the batch, then is full."""
        calls.append(len(buf))
        if len(calls) == 1:
            return real_write(fd, buf[:len(buf) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(journal_mod.os, "write", half_then_enospc)
    with pytest.raises(JournalError, match="ENOSPC") as info:
        j.append([datagram(1), datagram(2), datagram(3)])
    assert str(tmp_path) in str(info.value)
    assert len(calls) == 2                                   # one write per batch, plus retry
    monkeypatch.setattr(journal_mod.os, "write", real_write)

    assert j.end == REC + 42
    assert os.path.getsize(last_segment(tmp_path)) == REC + 42
    after = j.append([datagram(4)])
    assert after == [before[0] + REC + 42]
    assert list(j.read(0)) == [(0, datagram(0)), (after[0], datagram(4))]
    j.close()
    j = opened(tmp_path)                                     # and on disk, no garbage either
    assert [d for _, d in j.read(0)] == [datagram(0), datagram(4)]
    j.close()


def test_one_write_per_batch(tmp_path, monkeypatch):
    j = opened(tmp_path)
    real_write, calls = os.write, []
    monkeypatch.setattr(journal_mod.os, "write",
                        lambda fd, buf: calls.append(1) or real_write(fd, buf))
    j.append([datagram(i) for i in range(1000)])
    assert len(calls) == 1
    j.close()


def count_fsyncs(monkeypatch) -> list:
    calls = []
    real = os.fsync
    monkeypatch.setattr(journal_mod.os, "fsync", lambda fd: calls.append(fd) or real(fd))
    return calls


def test_fsync_interval_syncs_at_most_once_per_interval(tmp_path, monkeypatch):
    calls = count_fsyncs(monkeypatch)
    j = opened(tmp_path, fsync="interval", fsync_interval=1.0)
    j.append([datagram(0)])
    assert j.sync(now=100.0) is True
    synced = len(calls)
    assert synced >= 1
    j.append([datagram(1)])
    assert j.sync(now=100.5) is False                        # within the interval
    assert len(calls) == synced
    assert j.sync(now=101.0) is True
    assert len(calls) == synced + 1                          # just the segment this time
    assert j.sync(now=105.0) is False                        # nothing new to sync
    assert len(calls) == synced + 1
    j.close()


def test_fsync_interval_syncs_a_rolled_segment_and_the_directory(tmp_path, monkeypatch):
    calls = count_fsyncs(monkeypatch)
    j = opened(tmp_path, fsync="interval", segment_bytes=100)
    for i in range(3):                                       # the third append rolls
        j.append([datagram(i)])
    assert j.sync(now=0.0) is True
    assert len(calls) == 3                                   # old segment, new one, directory
    j.close()


def test_fsync_none_never_syncs(tmp_path, monkeypatch):
    calls = count_fsyncs(monkeypatch)
    j = opened(tmp_path, fsync="none", segment_bytes=100)
    for i in range(5):
        j.append([datagram(i)])
        assert j.sync(now=float(i * 10)) is False
    j.close()
    assert calls == []


def test_reading_from_a_position_that_is_not_a_record_is_an_error(tmp_path):
    j = opened(tmp_path)
    j.append([datagram(0), datagram(1)])
    with pytest.raises(JournalError, match="no intact record at position 3"):
        list(j.read(3))
    with pytest.raises(JournalError, match="past the end"):
        list(j.read(10 ** 6))
    j.close()


def test_a_corrupt_older_segment_is_skipped_to_the_next(tmp_path, caplog):
    j, positions = fill_segments(tmp_path, 6)               # segments at 0, 100, 200
    with open(tmp_path / segment_name(100), "r+b") as f:
        f.seek(REC)                                          # the first payload byte at 100
        f.write(b"!")
    with caplog.at_level(logging.WARNING, logger="diode.runtime.journal"):
        got = [p for p, _ in j.read(0)]
    assert got == [0, 50, 200, 250]
    assert "skipping to the next segment" in caplog.text
    j.close()


def test_background_syncing_fsyncs_on_its_own_thread_and_reports_failures(tmp_path,
                                                                         monkeypatch):
    """The udp_reader never waits for the disk: fsync runs on a thread every interval."""
    import threading
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(threading.current_thread().name),
                                                 real_fsync(fd)))
    j = Journal(str(tmp_path), fsync="interval", fsync_interval=0.05)
    j.open()
    j.start_syncing()
    j.append([b"x" * 100])
    deadline = time.monotonic() + 5
    while "journal-fsync" not in synced and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "journal-fsync" in synced
    assert j.sync(time.monotonic() + 100) is False  # the thread does it, not the caller

    def failing(fd):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(os, "fsync", failing)
    j.append([b"y" * 100])
    while j.sync_error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert j.sync_error is not None and "EIO" in str(j.sync_error)
    monkeypatch.setattr(os, "fsync", real_fsync)
    j.close()
    again = Journal(str(tmp_path))
    again.open()
    assert [d for _, d in again.read(again.start)] == [b"x" * 100, b"y" * 100]
    again.close()
