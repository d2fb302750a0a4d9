"""udp_reader: the receiver's one UDP socket. It does nothing but read and forward.

Datagrams go to unpackers by the routing key of their fixed header (routing key % unpackers),
several per ZeroMQ message. A datagram too short or not ours (wrong magic or version) is counted
and dropped here; nothing else in it is trusted or even looked at.
"""

import errno
import socket
import time


from diode import transport, wire
from diode.errors import DiodeError, RejectedDatagram
from diode.worker import Stage as BaseStage

BATCH_DATAGRAMS = 64


def open_socket(bind_address: str, port: int, rcvbuf: int, log=None) -> socket.socket:
    """A UDP socket with as large a receive buffer as the kernel grants (warns when less)."""
    family = socket.AF_INET6 if ":" in bind_address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    granted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2  # Linux doubles it
    if granted < rcvbuf and log is not None:
        log.warning("the kernel granted a %d-byte receive buffer, not the %d asked for "
                    "(link.receive.buffer.bytes): bursts will be dropped. Raise the limit with: "
                    "sysctl -w net.core.rmem_max=%d net.core.rmem_default=%d",
                    granted, rcvbuf, rcvbuf, rcvbuf)
    try:
        sock.bind((bind_address, port))
    except OSError as exc:
        sock.close()
        raise DiodeError(f"cannot bind udp {bind_address}:{port} (link.bind.address, link.port): "
                         f"{exc.strerror}; is another receiver running?") from None
    sock.settimeout(0.1)
    return sock


class Stage(BaseStage):
    def open(self):
        ctx = self.ctx
        link = self.t.link
        n = ctx.instances("unpacker")
        self.outs = [transport.Outbox(transport.push(ctx.zmq, [ctx.endpoint("unpacker", i)],
                                                     ctx.hwm)) for i in range(n)]
        self.sock = open_socket(link.bind_address, link.port, link.receive_buffer_bytes, self.log)
        self.metrics.set("receive_buffer_bytes",
                         self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2)
        self.buf = bytearray(65536)
        self.log.info("listening on udp %s:%d", link.bind_address, link.port)

    def step(self):
        if self.stopping:
            return False  # nothing to drain from a UDP socket that would not also keep coming
        if not all(o.flush() for o in self.outs):
            # an unpacker is behind: stop reading; the kernel buffer absorbs the burst
            time.sleep(0.001)
            return True
        batches = [[] for _ in self.outs]
        got = 0
        try:
            nbytes = self.sock.recv_into(self.buf)
            self._route(batches, nbytes)
            got = 1
            while got < BATCH_DATAGRAMS * len(self.outs):
                nbytes = self.sock.recv_into(self.buf, 0, socket.MSG_DONTWAIT)
                self._route(batches, nbytes)
                got += 1
        except (socket.timeout, BlockingIOError):
            pass
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EINTR):
                self.log.warning("recv failed: %s", exc)
        for out, batch in zip(self.outs, batches):
            if batch:
                out.put(batch)
        return True

    def _route(self, batches, nbytes):
        datagram = bytes(self.buf[:nbytes])
        self.metrics.inc("datagrams")
        self.metrics.inc("bytes", nbytes)
        try:
            key = wire.routing_key(datagram)
        except RejectedDatagram as exc:
            self.metrics.inc("rejects", reason=exc.reason)
            return
        batches[key % len(batches)].append(datagram)

    def close(self):
        self.sock.close()
