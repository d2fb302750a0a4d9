"""diode: replicate Apache Kafka topics across a one-way UDP data diode."""

__version__ = "0.1.0"
