"""Compression of datagram payloads, with bounded decompression.

Pure functions over bytes, so the payload format is testable without sockets. The layering
follows the Confluent connector: records (as runs, diode.link.runs) -> compressed -> encrypted (see
diode.link.wire). Compression contexts are made once per process and reused: a zstd context costs
more to create than to compress a datagram.
"""

import gzip
import zlib

import lz4.frame
import zstandard

from diode.errors import RejectedDatagram

# A decompressed payload may not be larger than this, whatever the compression ratio: it bounds
# the memory a single datagram can make a receiver allocate (decompression bombs).
MAX_BATCH_BYTES = 8 * 1024 * 1024


# -- compression ---------------------------------------------------------------------------

COMPRESSION_IDS = {"none": 0, "gzip": 1, "zstd": 2, "lz4": 3}
COMPRESSION_NAMES = {v: k for k, v in COMPRESSION_IDS.items()}


_contexts: dict = {}


def _context(name: str, make):
    ctx = _contexts.get(name)
    if ctx is None:
        ctx = _contexts[name] = make()
    return ctx


def compress(kind: str, data: bytes) -> bytes:
    if kind == "none":
        return data
    if kind == "zstd":
        return _context("zstd", lambda: zstandard.ZstdCompressor(level=3)).compress(data)
    if kind == "lz4":
        c = _context("lz4", lz4.frame.LZ4FrameCompressor)
        return c.begin(len(data)) + c.compress(data) + c.flush()
    if kind == "gzip":
        return gzip.compress(data, compresslevel=6, mtime=0)
    raise ValueError(f"unknown compression {kind!r}")


def decompress(kind_id: int, data: bytes, limit: int = MAX_BATCH_BYTES) -> bytes:
    """Decompress at most `limit` bytes; anything larger or malformed is rejected."""
    kind = COMPRESSION_NAMES.get(kind_id)
    try:
        if kind == "none":
            out = data
        elif kind == "gzip":
            d = zlib.decompressobj(wbits=31)
            out = d.decompress(data, limit + 1)
            if not d.eof:
                raise ValueError("truncated or over the size limit")
        elif kind == "zstd":
            # Our frames declare their size (zstandard writes it by default): check it before
            # allocating, then require the whole frame.
            size = zstandard.frame_content_size(data)
            if size < 0 or size > limit:
                raise ValueError(f"frame content size {size} unknown or over {limit}")
            out = _context("unzstd", zstandard.ZstdDecompressor).decompress(data)
        elif kind == "lz4":
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=limit + 1)
            if not d.eof:
                raise ValueError("truncated or over the size limit")
        else:
            raise RejectedDatagram("bad_compression", f"unknown compression id {kind_id}")
    except RejectedDatagram:
        raise
    except Exception as exc:
        raise RejectedDatagram("decompress_failed", f"{type(exc).__name__}: {exc}") from None
    if len(out) > limit:
        raise RejectedDatagram("decompress_failed", f"batch over {limit} bytes")
    return out
