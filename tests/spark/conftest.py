import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the whole Spark part of the suite (local[2]: this machine), with
    Spark's own Kafka connector on its classpath (fetched through mvn if not cached)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from diode.spark.verify import session
    s = session("local[2]", "diode tests", source="native")
    yield s
    s.stop()
