"""The receiver's journal: every accepted datagram, on local disk, before it is forwarded.

A diode cannot ask the sender again, so a datagram the receiver has taken off the wire must
outlive a crash of the stages behind it. The UDP reader appends each batch of datagrams (still
encrypted: opaque bytes) here, then forwards it; after a restart the journal is replayed from the
position the forwarding side last checkpointed.

Layout: a directory of append-only segment files, each named by the position of its first
record, 20 digits zero-padded (``00000000000067108864.journal``), so sorting the names sorts the
positions. A record is a header ``<II`` (length, crc32 of the datagram) then the datagram. A
position is the global byte offset of a record's header across all segments; positions only
grow and are never reused, across restarts too: the segment being written is never deleted, so
the end is always recoverable from the last file name plus its size.

Durability, by `fsync` policy:

- ``"none"``: survives a process crash (kill -9, OOM kill): every append is a write(2) that
  has returned, so the data is in the page cache and the kernel writes it out later. A power
  loss or kernel crash loses what had not been written back yet (up to ~30 s by default).
- ``"interval"``: `sync()` fsyncs at most once per `fsync_interval` seconds, so a power loss or
  kernel crash loses at most the last interval's datagrams; the loss accounting downstream then
  reports them missing, as it would any datagram lost on the link.

A crash mid-write leaves a torn record at the end of the last segment; `open()` cuts it (and
anything after a record whose crc32 fails) and logs how many bytes went.
"""

import bisect
import errno
import fcntl
import logging
import math
import os
import re
import struct
import threading
import time
import zlib
from dataclasses import dataclass

from diode.errors import DiodeError

log = logging.getLogger("diode.runtime.journal")

HEADER = struct.Struct("<II")          # length, crc32 of the datagram
MAX_DATAGRAM = 65535                   # larger than any UDP payload: a longer length is corruption
READ_CHUNK = 1 << 20                   # bytes per read(2) when replaying or scanning
SEGMENT_NAME = re.compile(r"^(\d{20})\.journal$")
FSYNC_POLICIES = ("none", "interval")


class JournalError(DiodeError):
    """The journal could not be read or written; the message names the directory, the errno
    and what to do about it."""


class JournalFull(JournalError):
    """Appending would take the journal past `max_bytes`: the forwarding side is behind (or
    stopped) and has not released enough. Nothing was written."""


def segment_name(start: int) -> str:
    """The file name of the segment whose first record is at `start`."""
    return f"{start:020d}.journal"


def describe(exc: OSError) -> str:
    """'ENOSPC (No space left on device)': the errno name for searching, the text for reading."""
    name = errno.errorcode.get(exc.errno, f"errno {exc.errno}")
    return f"{name} ({os.strerror(exc.errno) if exc.errno else exc})"


def _advice(exc: OSError) -> str:
    """What an operator can do about a failed write, by errno."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that filesystem, or lower the journal's max bytes so it fits"
    if exc.errno == errno.EIO:
        return "the disk reported an I/O error: check the kernel log (dmesg) and the disk"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make the directory writable by this user, or point the journal elsewhere"
    return "check the filesystem holding the journal"


def records(f, offset: int, limit: int, origin: int = 0, chunk: int = READ_CHUNK):
    """Yield (position, datagram) for each intact record of file `f` from file offset `offset`
    (a record start), reading at most `limit` bytes in `chunk`-sized reads; return the position
    where the intact records end. A position is `origin` (the position of the file's first
    byte) plus the file offset. Stops at a record that runs past the bytes read (torn) or whose
    length or crc32 is wrong (corrupt). `f` is any binary file object: testable on BytesIO.

    One read per chunk, not per record: replay is bounded by memcpy, not by syscalls."""
    header, unpack, crc32 = HEADER.size, HEADER.unpack_from, zlib.crc32
    f.seek(offset)
    buf, pos, base, left = b"", 0, origin + offset, limit   # base: position of buf[0]
    while True:
        n = len(buf)
        while n - pos >= header:
            length, crc = unpack(buf, pos)
            if length > MAX_DATAGRAM:
                return base + pos
            stop = pos + header + length
            if stop > n:
                break
            data = buf[pos + header:stop]
            if crc32(data) != crc:
                return base + pos
            yield base + pos, data
            pos = stop
        if left <= 0:
            return base + pos
        more = f.read(min(chunk, left))
        if not more:
            return base + pos
        left -= len(more)
        buf, base, pos = buf[pos:] + more, base + pos, 0


@dataclass(slots=True)
class Segment:
    """One segment file of the journal: the position of its first record (its name) and its
    size in bytes (it grows while it is the current one)."""
    start: int
    size: int


class Journal:
    """An append-only, segmented journal of datagrams; see the module docstring.

    Not thread-safe: one stage owns it. `read()` may run interleaved with `append()`."""

    def __init__(self, directory: str, max_bytes: int = 1 << 30, segment_bytes: int = 64 << 20,
                 fsync: str = "none", fsync_interval: float = 1.0):
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"journal fsync policy must be one of {FSYNC_POLICIES}, "
                             f"not {fsync!r}")
        if segment_bytes <= 0 or max_bytes <= 0:
            raise ValueError("journal max_bytes and segment_bytes must be positive")
        self.directory = str(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        self.start = 0
        self.end = 0
        self._segments: list[Segment] = []     # oldest first; the last is the current one
        self._fd: int | None = None            # current segment, O_APPEND
        self._dir_fd: int | None = None        # locked while open; fsynced after a new segment
        self._unsynced: list[int] = []         # fds of rolled segments awaiting their fsync
        self._dirty = False                    # appended since the last fsync
        self._dir_dirty = False                # a segment was created since the last fsync
        self._last_sync = -math.inf
        self._broken: str | None = None
        # Syncing on a thread of its own (start_syncing): the lock guards the fds and flags
        # it shares with append(), never held across an fsync.
        self._lock = threading.Lock()
        self._syncer: threading.Thread | None = None
        self._stop_syncing = threading.Event()
        self.sync_error: JournalError | None = None  # the background fsync's last failure

    @property
    def size(self) -> int:
        """Bytes held on disk: what `max_bytes` bounds."""
        return self.end - self.start

    def _path(self, start: int) -> str:
        return os.path.join(self.directory, segment_name(start))

    def _fail(self, what: str, exc: OSError) -> JournalError:
        return JournalError(f"journal {self.directory}: cannot {what}: {describe(exc)}; "
                            f"{_advice(exc)}")

    # -- opening ------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the directory if needed, lock it, find the segments, cut a torn tail off the
        last one and open it for appending. Sets `start` and `end`."""
        if self._fd is not None:
            return
        try:
            os.makedirs(self.directory, exist_ok=True)
            dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise JournalError(
                f"journal directory {self.directory} cannot be created or opened: "
                f"{describe(exc)}; create it as a writable directory (is a file in the way?) "
                f"or point the journal elsewhere") from exc
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(dir_fd)
            raise JournalError(
                f"journal directory {self.directory} is in use by another process "
                f"({describe(exc)}); two receivers cannot share a journal: stop the other one "
                f"or give this one its own directory") from exc
        self._dir_fd = dir_fd
        try:
            if not os.access(self.directory, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), self.directory)
            self._load()
        except OSError as exc:
            self.close()
            raise self._fail("open its segments", exc) from exc
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        self._broken, self._dirty, self._dir_dirty = None, False, False
        starts = sorted(int(m.group(1)) for m in map(SEGMENT_NAME.match,
                                                     os.listdir(self.directory)) if m)
        self._segments = [Segment(s, os.stat(self._path(s)).st_size) for s in starts]
        if not self._segments:
            self._create(0)
        else:
            last = self._segments[-1]
            self._cut_torn_tail(last)
            self._fd = os.open(self._path(last.start),
                               os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.start = self._segments[0].start
        self.end = self._segments[-1].start + self._segments[-1].size

    def _cut_torn_tail(self, segment: Segment) -> None:
        """Scan the last segment and truncate it after its last intact record."""
        start, size = segment.start, segment.size
        path = self._path(start)
        with open(path, "rb") as f:
            scan = records(f, 0, size)
            try:
                while True:
                    next(scan)
            except StopIteration as done:
                intact = done.value
        if intact < size:
            os.truncate(path, intact)
            log.warning("journal %s: cut %d bytes of a torn or corrupt record at position %d "
                        "(a write interrupted by a crash or power loss); the datagrams in them "
                        "are lost and the loss accounting will report them missing",
                        path, size - intact, start + intact)
            segment.size = intact

    def _create(self, start: int) -> None:
        """Start a new segment at `start` and make it the current one."""
        fd = os.open(self._path(start),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        if self._fd is not None:
            if self.fsync == "interval":
                self._unsynced.append(self._fd)    # fsynced by the next sync(), not here
            else:
                os.close(self._fd)
        self._fd = fd
        self._segments.append(Segment(start, 0))
        self._dir_dirty = True

    # -- the hot path -------------------------------------------------------------------------

    def append(self, datagrams: list) -> list[int]:
        """Write a batch of datagrams (bytes, bytearray or memoryview) with one write(2) and
        return each one's position. All or nothing: JournalFull or JournalError leave the
        journal as it was before the call."""
        if self._fd is None:
            raise JournalError(self._broken or f"journal {self.directory} is not open; "
                               f"call open() first")
        if not datagrams:
            return []
        pack, crc32, header = HEADER.pack, zlib.crc32, HEADER.size
        parts, positions = [], []
        begin = pos = self.end
        for d in datagrams:
            n = d.nbytes if type(d) is memoryview else len(d)
            if n > MAX_DATAGRAM:
                raise ValueError(f"a datagram of {n} bytes is larger than any UDP payload "
                                 f"({MAX_DATAGRAM})")
            positions.append(pos)
            parts.append(pack(n, crc32(d)))
            parts.append(d)
            pos += header + n
        total = pos - begin
        if self.end - self.start + total > self.max_bytes:
            raise JournalFull(
                f"journal {self.directory} is full: {self.size} of {self.max_bytes} bytes held "
                f"and a batch of {total} bytes does not fit; the forwarding side is behind or "
                f"stopped (it releases what it has checkpointed): see why, or raise the "
                f"journal's max bytes")
        with self._lock:
            current = self._segments[-1]
            if current.size >= self.segment_bytes:
                try:
                    self._create(begin)
                except OSError as exc:
                    raise self._fail(f"create segment {self._path(begin)}", exc) from exc
                current = self._segments[-1]
            self._write(b"".join(parts), current)
            current.size += total
            self.end = pos
            self._dirty = True
        return positions

    def _write(self, buf: bytes, current: Segment) -> None:
        """write(2) all of `buf`; on failure cut the segment back to where it was and raise."""
        view, done = memoryview(buf), 0
        try:
            while done < len(buf):
                written = os.write(self._fd, view[done:])
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += written
        except OSError as exc:
            error = self._fail(f"write {self._path(current.start)}", exc)
            try:
                os.ftruncate(self._fd, current.size)
            except OSError as cut:
                # The segment may now end in a partial batch that later records would follow:
                # refuse to append; a restart's open() cuts it as a torn tail.
                self._broken = (f"journal {self.directory}: a failed write could not be "
                                f"undone ({describe(cut)}); restart the receiver so that "
                                f"open() cuts the partial batch")
                self._close_fds()
                raise JournalError(f"{error}; {self._broken}") from exc
            raise error from exc

    def sync(self, now: float | None = None) -> bool:
        """Under policy "interval", fsync what was appended (and the directory, after a new
        segment) if `fsync_interval` seconds have passed since the last fsync. Call it from the
        loop after appending; it is cheap when there is nothing to do. Returns whether it
        synced."""
        if self.fsync != "interval" or self._fd is None or self._syncer is not None:
            return False
        now = time.monotonic() if now is None else now
        if not (self._dirty or self._dir_dirty or self._unsynced):
            return False
        if now - self._last_sync < self.fsync_interval:
            return False
        self._sync_all()
        self._last_sync = now
        return True

    def start_syncing(self) -> None:
        """Under policy "interval", fsync every `fsync_interval` seconds on a thread of its own
        (os.fsync releases the GIL), so appending never waits for the disk: an fsync can take
        longer than the socket buffer lasts. Its failures land in `sync_error`."""
        if self.fsync != "interval" or self._syncer is not None or self._fd is None:
            return
        self._stop_syncing.clear()
        self._syncer = threading.Thread(target=self._sync_loop, name="journal-fsync",
                                        daemon=True)
        self._syncer.start()

    def _sync_loop(self) -> None:
        while not self._stop_syncing.wait(self.fsync_interval):
            with self._lock:  # take what needs syncing; the fsyncs run without the lock
                if self._fd is None:
                    return
                rolled, self._unsynced = self._unsynced, []
                current = os.dup(self._fd) if self._dirty else None
                directory = os.dup(self._dir_fd) if self._dir_dirty else None
                self._dirty = self._dir_dirty = False
            try:
                for fd in (*rolled, current, directory):
                    if fd is not None:
                        os.fsync(fd)
            except OSError as exc:
                self.sync_error = JournalError(
                    f"journal {self.directory}: fsync failed ({describe(exc)}); datagrams "
                    f"appended since the last fsync may not be on disk")
            finally:
                for fd in (*rolled, current, directory):
                    if fd is not None:
                        os.close(fd)

    def _stop_syncer(self) -> None:
        if self._syncer is not None:
            self._stop_syncing.set()
            self._syncer.join()
            self._syncer = None

    def _sync_all(self) -> None:
        try:
            while self._unsynced:
                os.fsync(self._unsynced[0])
                os.close(self._unsynced.pop(0))
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False
            if self._dir_dirty:
                os.fsync(self._dir_fd)
                self._dir_dirty = False
        except OSError as exc:
            raise self._fail("fsync (datagrams appended since the last fsync may not be on "
                             "disk)", exc) from exc

    # -- after forwarding ---------------------------------------------------------------------

    def release(self, low_water: int) -> int:
        """Delete the oldest segments whose records all lie below `low_water` (the checkpointed
        position), never the current one. Returns the bytes freed; `start` moves up."""
        freed = 0
        while len(self._segments) > 1:
            start, size = self._segments[0].start, self._segments[0].size
            if start + size > low_water:
                break
            try:
                os.unlink(self._path(start))
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._fail(f"delete released segment {self._path(start)}", exc) from exc
            self._segments.pop(0)
            freed += size
        self.start = self._segments[0].start if self._segments else self.start
        return freed

    def read(self, position: int):
        """Return an iterator of (position, datagram) from `position` to the end as of this
        call. A position below `start` (released meanwhile) is moved up to `start`, with a
        warning. A corrupt stretch in an older segment is skipped to the next segment, with a
        warning; the end of the last segment stops the read quietly."""
        stop = self.end
        if position > stop:
            raise JournalError(
                f"journal {self.directory}: cannot read from position {position}, past the end "
                f"({stop}); the checkpoint is newer than this journal (was the directory "
                f"removed or replaced?): restore it, or remove the checkpoint to start afresh")
        if position < self.start:
            log.warning("journal %s: position %d was already released; reading from %d, the "
                        "datagrams in between are lost", self.directory, position, self.start)
            position = self.start
        starts = [s.start for s in self._segments]
        first = max(bisect.bisect_right(starts, position) - 1, 0)
        return self._read(position, stop, starts[first:])

    def _read(self, position: int, stop: int, starts: list[int]):
        asked = position
        for seg_start in starts:
            if position >= stop:
                return
            path = self._path(seg_start)
            try:
                f = open(path, "rb")
            except FileNotFoundError:            # released while this read was under way
                continue
            with f:
                offset = max(position - seg_start, 0)
                want = min(os.fstat(f.fileno()).st_size, stop - seg_start) - offset
                if want <= 0:
                    continue
                intact = yield from records(f, offset, want, seg_start)
            if intact < seg_start + offset + want:
                if intact == asked:
                    raise JournalError(
                        f"journal {self.directory}: no intact record at position {position} "
                        f"in {path}; the checkpoint does not point at a record of this "
                        f"journal: remove the checkpoint to replay from the start")
                if seg_start != starts[-1]:
                    log.warning("journal %s: %d corrupt bytes at position %d; skipping to the "
                                "next segment", path, seg_start + offset + want - intact, intact)
            position = intact

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Fsync under policy "interval" (a clean stop loses nothing), close and unlock."""
        self._stop_syncer()
        if self._fd is not None and self.fsync == "interval":
            try:
                self._sync_all()
            except JournalError as exc:
                log.error("%s", exc)
        self._close_fds()
        if self._dir_fd is not None:
            os.close(self._dir_fd)               # releases the flock
            self._dir_fd = None

    def _close_fds(self) -> None:
        for fd in self._unsynced:
            os.close(fd)
        self._unsynced = []
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()
