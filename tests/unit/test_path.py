"""diode.link.path: the datagram size that crosses the path whole, and what a larger one costs."""

import pytest

from diode.link import path
from diode.link.path import Path


@pytest.mark.parametrize("size, mtu, count", [
    (1472, 1500, 1), (1473, 1500, 2), (8972, 9000, 1), (65000, 1500, 44), (65000, 9000, 8)])
def test_fragments_of_a_datagram(size, mtu, count):
    assert path.fragments(size, mtu) == count


def test_a_size_the_path_fragments_is_warned_of_with_the_loss_it_costs():
    eth = Path("eth0", 1500, "10.0.0.1")
    said = path.fragmentation_warning(65000, eth, "10.0.0.2")
    assert "MTU 1500 on eth0: 1472 bytes" in said and "44 IP fragments" in said
    assert "at 1% frame loss, 36% of datagrams instead of 1%" in said
    assert "link.allow.fragmentation: true" in said
    assert path.fragmentation_warning(1472, eth, "10.0.0.2") == ""
    assert path.fragmentation_warning(1452, Path("eth0", 1500, "fd00::1"), "fd00::2") == ""
    assert "1452 bytes" in path.fragmentation_warning(1472, Path("eth0", 1500, "fd00::1"),
                                                      "fd00::2")  # (IPv6: 48 bytes of headers)
    assert path.fragmentation_warning(65000, Path(None, None, None), "10.0.0.2") == ""


def test_loopback_carries_65000_bytes_whole():
    lo = path.toward("127.0.0.1")
    assert lo.device == "lo" and lo.mtu >= 65536
    assert lo.unfragmented("127.0.0.1") == 65000
