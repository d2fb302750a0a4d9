"""The verification plane on Spark (docs/verification.md): a Kafka data source for PySpark that
needs no Maven package, and the `diode verify` audit of what crossed the diode."""
