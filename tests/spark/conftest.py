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


@pytest.fixture
def verify_here(spark, capsys, monkeypatch):
    """`diode verify ARGS` as the command runs it (the parser, the audit, the table, the
    report, the exit status), but in this process on the shared session, kept from stopping it:
    each `diode verify` or spark-submit subprocess is a JVM of its own, some 20 s to start.
    For the tests about what the audit finds; a test of the command as a process runs it as
    one. Returns (returncode, stdout, stderr) as subprocess.run does."""
    import signal
    import subprocess

    from diode import cli
    monkeypatch.setattr(spark, "stop", lambda: None)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    sigterm = signal.getsignal(signal.SIGTERM)  # (a --stream run sets its own)

    def run(*argv) -> subprocess.CompletedProcess:
        argv = ["verify", *map(str, argv)]
        capsys.readouterr()
        try:
            args = cli.build_parser().parse_args(argv)
            code = args.func(args)
        finally:
            signal.signal(signal.SIGTERM, sigterm)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out.out, out.err)
    return run
