"""Stage tests drive one stage in this process, its queues in-memory (inproc) in a ZeroMQ
context of the test's own."""

import pytest
import zmq


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)
