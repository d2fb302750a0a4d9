"""Kafka: what diode writes to Kafka and reads back, defined, built and parsed once (messages:
the provenance headers, the missing-range events, heartbeats, digests, group checkpoints),
client settings and topic discovery (clients), which incarnation of a source partition
records come from (identity: the topic id), what a reader looks for off its loop (refresh) and
remembers across its restarts (lineage), the sender's committed prefix (offsets), what a restarted
writer reads back from the destination (recovery), and the embedded brokers for the demo, the
tests and the bench (brokers, fetched through maven)."""
