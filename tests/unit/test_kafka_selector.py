"""diode.kafka.clients.TopicSelector: which source partitions each kafka_reader owns."""

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from diode.kafka.clients import TopicSelector

CLUSTER = {
    "orders": 3, "orders-eu": 2, "payments": 4, "audit.log": 1, "audit_log": 1,
    "__consumer_offsets": 50, "__transaction_state": 50, "diode-dead-letter": 1,
}


def matching(selector):
    return {t for t in CLUSTER if selector.matches(t)}


def test_names_select_exactly_those_topics():
    s = TopicSelector(["orders", "payments", "absent"], [])
    assert matching(s) == {"orders", "payments"}


def test_patterns_match_the_whole_name():
    s = TopicSelector([], ["orders"])
    assert matching(s) == {"orders"}  # not orders-eu: fullmatch, not search
    s = TopicSelector([], ["orders.*"])
    assert matching(s) == {"orders", "orders-eu"}
    s = TopicSelector([], [r"audit\.log"])
    assert matching(s) == {"audit.log"}  # the escaped dot does not match audit_log


def test_names_and_patterns_combine():
    s = TopicSelector(["payments"], ["orders-.*", "audit.log"])
    assert matching(s) == {"payments", "orders-eu", "audit.log", "audit_log"}


def test_patterns_never_select_internal_topics():
    s = TopicSelector([], [".*"])
    assert matching(s) == set(CLUSTER) - {"__consumer_offsets", "__transaction_state"}
    assert not TopicSelector([], ["__.*"]).matches("__consumer_offsets")


def test_an_internal_topic_can_be_named_explicitly():
    assert TopicSelector(["__consumer_offsets"], [".*"]).matches("__consumer_offsets")


def test_excludes_win_over_names_and_patterns():
    s = TopicSelector(["orders", "diode-dead-letter"], [".*"],
                      exclude=["diode-dead-letter", "payments"])
    assert "diode-dead-letter" not in matching(s)  # never replicate our own dead letters
    assert "payments" not in matching(s)
    assert "orders" in matching(s)


def test_single_reader_owns_every_partition_of_selected_topics():
    s = TopicSelector(["orders"], ["payments"])
    assert s.owned(CLUSTER) == {("orders", p) for p in range(3)} | {
        ("payments", p) for p in range(4)}


@pytest.mark.parametrize("readers", [1, 2, 3, 7])
def test_partitions_split_across_readers_form_a_disjoint_cover(readers):
    owned = [TopicSelector([], [".*"], index=i, readers=readers).owned(CLUSTER)
             for i in range(readers)]
    everything = {(t, p) for t, n in CLUSTER.items() if not t.startswith("__")
                  for p in range(n)}
    assert set().union(*owned) == everything
    assert sum(len(o) for o in owned) == len(everything)  # no partition read twice


def test_split_is_stable_across_processes():
    """Every reader process must compute the same split (Python's hash() is salted)."""
    a = TopicSelector([], [".*"], index=1, readers=3).owned(CLUSTER)
    b = TopicSelector([], [".*"], index=1, readers=3).owned(CLUSTER)
    assert a == b
    code = ("from diode.kafka.clients import TopicSelector;"
            f"print(sorted(TopicSelector([], ['.*'], index=1, readers=3).owned({CLUSTER!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert out.strip() == repr(sorted(a))


def test_split_spreads_partitions():
    counts = {"big": 64}
    owned = [TopicSelector(["big"], [], index=i, readers=4).owned(counts) for i in range(4)]
    assert all(len(o) == 16 for o in owned)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_.\-]{1,12}", fullmatch=True),
                       st.integers(1, 40), max_size=8),
       st.integers(1, 9))
def test_split_is_a_disjoint_cover_for_any_cluster(cluster, readers):
    names = list(cluster)
    owned = [TopicSelector(names, [], index=i, readers=readers).owned(cluster)
             for i in range(readers)]
    everything = {(t, p) for t, n in cluster.items() for p in range(n)}
    assert set().union(*owned) == everything
    assert sum(len(o) for o in owned) == len(everything)
