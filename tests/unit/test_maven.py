"""diode.kafka.maven: Java artifacts are cached in the checkout's .cache/ (git-ignored), where
./scripts/install fetched them, not fetched again elsewhere."""

from pathlib import Path

from diode.kafka import maven

ROOT = Path(__file__).parents[2]


def test_the_cache_is_the_checkouts_own(monkeypatch):
    monkeypatch.delenv("DIODE_CACHE_DIR", raising=False)
    assert maven.cache_dir() == ROOT / ".cache"
    assert ".cache/" in (ROOT / ".gitignore").read_text().split()
    monkeypatch.setenv("DIODE_CACHE_DIR", "/somewhere/else")
    assert maven.cache_dir() == Path("/somewhere/else")
