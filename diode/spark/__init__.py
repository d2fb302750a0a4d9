"""The verification plane on Spark (DESIGN.md §5): a Kafka data source for PySpark that needs no
Maven package, and the `diode verify` audit of what crossed the diode."""
