"""diode.link.offload: datagrams batched at the syscall boundary, each still a datagram."""

import errno
import socket

import pytest

from diode.link import offload


def test_gso_batches_are_runs_of_one_size_the_last_maybe_shorter():
    sizes = [1472] * 5 + [900] + [1472, 1472, 1500, 600, 600, 600]
    dgs = [bytes(n) for n in sizes]
    assert offload.batches(dgs) == [(0, 6, 1472), (6, 8, 1472), (8, 10, 1500), (10, 12, 600)]
    assert offload.batches([bytes(10)] * 100) == [(0, 64, 10), (64, 100, 10)]
    # never past 64 KiB of payload
    assert offload.batches([bytes(8972)] * 10) == [(0, 7, 8972), (7, 10, 8972)]
    assert offload.batches([]) == []


def test_gro_receives_are_cut_back_into_their_datagrams():
    view = memoryview(bytes(range(10)) * 3)
    assert offload.segments(view, 25, 10) == [bytes(range(10)), bytes(range(10)),
                                              bytes(range(5))]
    assert offload.segments(view, 25, None) == [bytes(view[:25])]
    assert offload.segments(view, 7, 10) == [bytes(range(7))]


@pytest.mark.skipif(bool(offload.gso_refused()), reason="this kernel refuses UDP_SEGMENT")
def test_a_gso_send_arrives_as_its_datagrams_and_gro_takes_them_in_one_receive():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        sent = [bytes([i]) * 1000 for i in range(9)] + [b"z" * 300]
        # without GRO: one datagram per receive, as sent
        offload.send_batch(tx, sent, 1000, rx.getsockname())
        rx.settimeout(2)
        assert [rx.recv(2000) for _ in sent] == sent
        # with GRO: fewer receives, cut back into the same datagrams
        assert offload.enable_gro(rx) == ""
        offload.send_batch(tx, sent, 1000, rx.getsockname())
        buf = bytearray(offload.GRO_BUFFER)
        got, calls = [], 0
        while len(got) < len(sent):
            n, anc, _, _ = rx.recvmsg_into([buf], offload.GRO_CMSG_SPACE)
            got += offload.segments(memoryview(buf), n, offload.segment_size(anc))
            calls += 1
        assert got == sent and calls < len(sent)
    finally:
        rx.close()
        tx.close()


def test_a_refusing_socket_is_said_so():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        assert "UDP_GRO refused" in offload.enable_gro(tcp)


def test_routing_keys_that_step_evenly_spread_over_the_unpackers():
    """A 10 KiB record crosses in 8 fragments routed by their group id, which then steps by 8:
    `key % 2` sent every record to one unpacker (seen in the bench: one at 57 %, the other
    idle); the lane spreads them."""
    from stages.udp_reader import lane
    for step, n in ((8, 2), (8, 4), (1, 3), (44, 2)):
        counts = [0] * n
        for key in range(1, 100_000, step):
            counts[lane(key) % n] += 1
        assert max(counts) < 1.1 * min(counts), (step, n, counts)


def test_a_batch_the_kernel_refuses_is_told_from_a_network_failure():
    """Refusals (sent again one datagram per call) against failures (retried as they are)."""
    for code in (errno.EINVAL, errno.EMSGSIZE, errno.EIO):
        assert offload.refused(OSError(code, "x"), 8)
        assert not offload.refused(OSError(code, "x"), 1)  # (one datagram: no batch to refuse)
    for code in (errno.ECONNREFUSED, errno.ENETUNREACH, errno.ENOBUFS):
        assert not offload.refused(OSError(code, "x"), 8)
