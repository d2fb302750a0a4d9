"""Loss accounting: offset ranges (ranges), the receiver's per-partition order, duplicates and
gaps (ordering), and the audit's per-partition ledger (ledger). One set of rules for what is
missing, used by the kafka_writer and by `diode verify`."""
