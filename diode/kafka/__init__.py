"""Kafka: client settings and topic discovery (clients), the sender's committed prefix
(offsets), what a restarted writer reads back from the destination (recovery), and the embedded
brokers for the demo, the tests and the bench (brokers, fetched through maven)."""
