"""Who reaches the receiver's socket (diode.link.admission): the source filter, attached to real
UDP sockets on loopback, where 127.0.0.1 and 127.0.0.2 are two senders; the bind address auto
chooses; the setting's errors."""

import socket
import time

import pytest

from diode.errors import DiodeError
from diode.link import admission, udpstat
from tests.conftest import free_port


def sender(address: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((address, 0))
    return s


def received(sock: socket.socket) -> list:
    """(payload, source address) of everything waiting on `sock`."""
    sock.settimeout(0.2)
    out = []
    try:
        while True:
            data, (address, _) = sock.recvfrom(2048)
            out.append((data, address))
    except TimeoutError:
        return out


def drops(sock) -> int:
    return udpstat.of(sock)[0]["drops"]


@pytest.fixture
def receiving():
    made = []

    def make(addresses, address="127.0.0.1"):
        made.append(admission.open_receiving(address, free_port(socket.SOCK_DGRAM), 1 << 20,
                                             addresses))
        return made[-1]
    yield make
    for r in made:
        r.close()


def test_only_the_admitted_address_reaches_the_socket_and_the_rest_is_counted_apart(receiving):
    r = receiving(["127.0.0.1"])
    port = r.sock.getsockname()[1]
    assert r.where == admission.KERNEL and r.counter is not None
    diode, other = sender("127.0.0.1"), sender("127.0.0.2")
    for i in range(50):
        other.sendto(b"flood %d" % i, ("127.0.0.1", port))
        diode.sendto(b"diode %d" % i, ("127.0.0.1", port))
    got = received(r.sock)
    assert got == [(b"diode %d" % i, "127.0.0.1") for i in range(50)]
    assert drops(r.counter) == 50  # what the filter dropped, exactly
    assert drops(r.sock) == 0      # the socket's own drops stay those of a full buffer


def test_cidr_blocks_and_several_entries(receiving):
    r = receiving(["127.0.0.0/30", "127.0.0.8/29"])
    port = r.sock.getsockname()[1]
    admitted = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.8", "127.0.0.15"]
    refused = ["127.0.0.4", "127.0.0.7", "127.0.0.16", "127.0.1.1"]
    for address in admitted + refused:
        with sender(address) as s:
            s.sendto(address.encode(), ("127.0.0.1", port))
    assert sorted(a for _, a in received(r.sock)) == sorted(admitted)
    assert drops(r.counter) == len(refused)


def test_a_second_receiver_on_the_port_is_refused_not_let_into_the_group(receiving):
    r = receiving(["127.0.0.1"])
    port = r.sock.getsockname()[1]
    with pytest.raises(DiodeError, match=rf"cannot bind udp 127.0.0.1:{port} .*another "
                                         "receiver running"):
        admission.open_receiving("127.0.0.1", port, 1 << 20, ["127.0.0.1"])
    with sender("127.0.0.1") as s:  # and the first still gets every datagram
        s.sendto(b"still here", ("127.0.0.1", port))
    assert received(r.sock) == [(b"still here", "127.0.0.1")]


def test_without_addresses_every_sender_is_read_and_a_warning_says_so(receiving):
    r = receiving([])
    port = r.sock.getsockname()[1]
    assert (r.where, r.counter) == (admission.NONE, None)
    assert any(level == "warning" and "link.source.addresses is empty: any host that reaches "
               f"udp 127.0.0.1:{port} is read" in text for level, text in r.notes)
    with sender("127.0.0.2") as s:
        s.sendto(b"anyone", ("127.0.0.1", port))
    assert received(r.sock) == [(b"anyone", "127.0.0.2")]


def test_where_the_kernel_refuses_the_filter_the_reader_checks_each_source(receiving,
                                                                           monkeypatch):
    def refuse(sock, option, prog):
        raise OSError(1, "Operation not permitted")
    monkeypatch.setattr(admission, "attach", refuse)
    r = receiving(["127.0.0.0/31", "10.20.0.1"])
    assert (r.where, r.counter) == (admission.READER, None)
    assert any("the kernel refused a socket filter (Operation not permitted)" in text
               for _, text in r.notes)
    assert [r.admits(a) for a in ("127.0.0.1", "127.0.0.0", "10.20.0.1", "127.0.0.2",
                                  "10.20.0.2", "::1")] == [True, True, True, False, False,
                                                           False]


def test_where_steering_is_refused_the_kernel_still_filters_uncounted(receiving, monkeypatch):
    attach = admission.attach

    def no_steering(sock, option, prog):
        if option == admission.SO_ATTACH_REUSEPORT_CBPF:
            raise OSError(92, "Protocol not available")
        attach(sock, option, prog)
    monkeypatch.setattr(admission, "attach", no_steering)
    r = receiving(["127.0.0.1"])
    assert (r.where, r.counter) == (admission.KERNEL, None)
    port = r.sock.getsockname()[1]
    with sender("127.0.0.2") as s:
        s.sendto(b"flood", ("127.0.0.1", port))
    time.sleep(0.05)
    assert received(r.sock) == [] and drops(r.sock) == 1
    assert any("cannot count them apart" in text for _, text in r.notes)


@pytest.mark.parametrize("entries, says", [
    (["10.0.0.1/24"], ("'10.0.0.1/24' is not an IPv4 address or CIDR block: 10.0.0.1/24 "
                       "has host bits set (the block is 10.0.0.0/24)")),
    (["fd00::1"], "'fd00::1' is IPv6: the source filter takes IPv4 senders only"),
    (["diode-high"], "'diode-high' is not an IPv4 address or CIDR block"),
    ([7], "7 is not an address: give it as a string"),
    ([f"10.0.{i}.0/24" for i in range(65)], "65 entries: at most 64 (give CIDR blocks)"),
])
def test_the_setting_says_what_is_wrong(entries, says):
    assert says in admission.problems(entries)


def test_auto_binds_link_host_where_this_host_holds_it():
    assert admission.bind_address("127.0.0.1", "auto") == (
        "127.0.0.1", "auto: link.host, an address of this host")
    assert admission.bind_address("localhost", "auto")[0] in ("127.0.0.1", "::1")
    address, note = admission.bind_address("192.0.2.7", "auto")  # (TEST-NET-1: nobody's)
    assert address == "0.0.0.0" and "link.host 192.0.2.7 is not an address of this host" in note
    assert admission.bind_address("192.0.2.7", "0.0.0.0") == ("0.0.0.0", "")
