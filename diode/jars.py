"""The Java artifacts diode uses, and `python -m diode.jars`, which fetches them all (what
./scripts/install runs, so that later runs need no network and no mvn).

Two bundles, resolved through diode.kafka.maven into its cache: the embedded Apache Kafka broker
(diode.kafka.brokers) and Spark's own Kafka connector for the installed Spark version
(diode.spark.kafka_source, `--source native`). They are defined here, above both, so that
diode.kafka.maven stays a leaf that knows nothing of brokers or Spark.
"""

import sys

from diode.errors import DiodeError
from diode.kafka import maven

KAFKA_VERSION = "4.1.1"
KAFKA = maven.Bundle(
    f"kafka_2.13-{KAFKA_VERSION}",
    (f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
     "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3"),  # its logging backend
    f"the embedded Apache Kafka broker {KAFKA_VERSION}")


def connector_bundle() -> maven.Bundle:
    """Spark's own Kafka connector, spark-sql-kafka-0-10, for the installed Spark version
    (ImportError without pyspark: the `spark` extra is not installed)."""
    import pyspark
    v = pyspark.__version__
    return maven.Bundle(f"spark-sql-kafka-0-10_2.13-{v}",
                        (f"org.apache.spark:spark-sql-kafka-0-10_2.13:{v}",),
                        f"Spark's Kafka connector for Spark {v}")


def main() -> int:
    """Fetch every bundle diode uses into the cache; exit 1 with the reason when one cannot
    be fetched."""
    bundles = [KAFKA]
    try:
        bundles.append(connector_bundle())
    except ImportError:  # no pyspark: the `spark` extra is not installed
        pass
    for bundle in bundles:
        fresh = not maven.cached(bundle)
        try:
            found = maven.jars(bundle)
        except DiodeError as exc:
            print(f"diode: {exc}", file=sys.stderr)
            return 1
        if fresh:
            print(f"fetched {bundle.why}: {len(found)} jars in {maven.cache_dir() / bundle.name}",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
