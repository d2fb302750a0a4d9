"""Offset ranges: (first, last) inclusive, as lists kept sorted and merged. Pure functions,
shared by the receiver's loss reports and the streaming audit's ledger."""

from itertools import pairwise

Range = tuple[int, int]  # first, last (inclusive)


def merge(ranges: list[Range]) -> list[Range]:
    """Sorted, with overlapping and adjacent ranges joined."""
    out: list[Range] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            if last > out[-1][1]:
                out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return out


def overlap(a: list[Range], b: list[Range]) -> int:
    """How many offsets two merged range lists share."""
    i = j = n = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            n += hi - lo + 1
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return n


def subtract(a: list[Range], b: list[Range]) -> list[Range]:
    """The offsets of `a` not in `b` (both merged)."""
    out, j = [], 0
    for first, last in a:
        while j < len(b) and b[j][1] < first:
            j += 1
        k, cur = j, first
        while k < len(b) and b[k][0] <= last:
            if b[k][0] > cur:
                out.append((cur, b[k][0] - 1))
            cur = max(cur, b[k][1] + 1)
            k += 1
        if cur <= last:
            out.append((cur, last))
    return out


def holes(runs: list[Range], until: int | None = None) -> list[Range]:
    """The gaps between merged runs, and after the last one up to `until`."""
    out = [(a[1] + 1, b[0] - 1) for a, b in pairwise(runs)]
    if runs and until is not None and until > runs[-1][1]:
        out.append((runs[-1][1] + 1, until))
    return out
