"""Java artifacts from Maven Central, resolved once through `mvn` into a local cache.

The embedded Apache Kafka broker and Spark's own Kafka connector are Java. `jars(bundle)` returns
a bundle's jar files, resolving them (with their runtime dependencies) into
`<cache>/<bundle name>/` the first time: a small pom, `mvn dependency:copy-dependencies`, a
stamp when complete. Once the stamp is there no network and no `mvn` is needed. Maven's own
repository lives in the cache too (`<cache>/m2`), so nothing is written outside it.

The cache is $DIODE_CACHE_DIR, else `.cache/` of the source checkout diode runs from (git
ignores it), else ~/.cache/diode. Which bundles diode uses, and the fetch of them all that
./scripts/install runs, are diode.jars's: this module imports nothing of diode but its errors.
"""

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from diode.errors import DiodeError

CHECKOUT = Path(__file__).resolve().parents[2]  # (diode/kafka/maven.py)


@dataclass(frozen=True)
class Bundle:
    name: str                    # directory under the cache, versioned
    artifacts: tuple             # "group:artifact:version" coordinates
    why: str                     # for error messages: what needs it


def cache_dir() -> Path:
    if os.environ.get("DIODE_CACHE_DIR"):
        return Path(os.environ["DIODE_CACHE_DIR"])
    if (CHECKOUT / "pyproject.toml").exists() and os.access(CHECKOUT, os.W_OK):
        return CHECKOUT / ".cache"
    return Path.home() / ".cache" / "diode"


def cached(bundle: Bundle) -> bool:
    """Whether the bundle is in the cache already (then `jars` needs no network)."""
    return (cache_dir() / bundle.name / "complete").exists()


def jars(bundle: Bundle) -> list[str]:
    """The bundle's jar files, resolved through mvn the first time (a clear DiodeError when
    that cannot be done)."""
    home = cache_dir() / bundle.name
    if not cached(bundle):
        home.mkdir(parents=True, exist_ok=True)
        with open(home / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be resolving it too
            if not cached(bundle):
                _resolve(bundle, home, home / "lib")
    return sorted(str(p) for p in (home / "lib").glob("*.jar"))


def _resolve(bundle: Bundle, home: Path, lib: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DiodeError(f"{bundle.why} comes from Maven Central through mvn, and there is no "
                         f"mvn on PATH: install Maven (Debian: apt-get install maven) once; "
                         f"afterwards the cache {home} is enough")
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in (c.split(":") for c in bundle.artifacts))
    (home / "pom.xml").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>diode.cache</groupId><artifactId>{bundle.name}</artifactId>"
        f"<version>1</version><packaging>pom</packaging><dependencies>{deps}</dependencies>"
        "</project>\n")
    shutil.rmtree(lib, ignore_errors=True)
    log_path = home / "mvn.log"
    with open(log_path, "wb") as out:
        r = subprocess.run(
            [mvn, "-B", "-f", str(home / "pom.xml"), f"-Dmaven.repo.local={cache_dir() / 'm2'}",
             "dependency:copy-dependencies", f"-DoutputDirectory={lib}",
             "-DincludeScope=runtime"], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        reason = _first_error(log_path)
        raise DiodeError(f"could not fetch {bundle.why} ({', '.join(bundle.artifacts)}) from "
                         f"Maven Central: {reason} (mvn's output: {log_path})")
    (home / "complete").write_text("\n".join(bundle.artifacts) + "\n")


def _first_error(log_path: Path) -> str:
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("[ERROR]") and len(line) > 8:
            return line[8:].strip()
    return "mvn failed"
