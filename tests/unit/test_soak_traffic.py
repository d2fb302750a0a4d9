"""diode.soak.traffic: the soak's records can each be checked on their own, are the same for the
same seed, and --rate/--sizes mistakes are named."""

import zlib

import pytest

from diode.errors import DiodeError
from diode.soak.traffic import Rate, Records, mean_size, parse_sizes


def test_each_record_carries_its_number_and_the_crc_of_its_value():
    mix = parse_sizes("100:0.6,1000:0.3,10000:0.1")
    records = Records(["a", "b", "c"], 4, mix, seed=5)
    seen = set()
    for n in range(3000):
        topic, partition, key, value, headers = records.make(n)
        h = dict(headers)
        assert int(h["soak.seq"]) == n and value.startswith(b"%012d|" % n)
        assert int(h["soak.crc"], 16) == zlib.crc32(value)
        assert len(value) in (100, 1000, 10000) and 0 <= partition < 4 and topic in "abc"
        seen.add(value)
    assert len(seen) == 3000  # no two values alike
    assert Records(["a", "b", "c"], 4, mix, seed=5).make(77) == records.make(77)
    sizes = [len(records.make(n)[3]) for n in range(4096)]
    assert 0.55 < sizes.count(100) / 4096 < 0.65


def test_rate_in_records_or_megabits_and_mistakes_named():
    assert Rate.parse("5000", 100).records_per_second == 5000
    assert Rate.parse("8mbps", 1000).records_per_second == 1000
    assert Rate.parse("8Mbit/s", 1000).records_per_second == 1000
    for bad in ("fast", "0", "-5", "0mbps"):
        with pytest.raises(DiodeError, match="--rate"):
            Rate.parse(bad, 100)
    assert mean_size(parse_sizes("100:3,1000:1")) == 325
    for bad in ("big", "100:x", "8:1", "100:0"):
        with pytest.raises(DiodeError, match="--sizes"):
            parse_sizes(bad)
