"""The shipped alert rules in a real Prometheus (Debian's prometheus package, which
./scripts/install installs): it scrapes a running launch's two metrics endpoints, the sender is
killed uncleanly, and Prometheus' HTTP API says DiodeLinkSilent is firing."""

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from diode.kafka.brokers import free_port
from tests.conftest import ROOT, consume, create_topic, produce, wait_for, write_topology

PROMETHEUS = shutil.which("prometheus")
RULES = ROOT / "deploy" / "prometheus" / "diode-rules.yml"


def rules_with_short_for(path, alert: str, wait: str) -> None:
    """The shipped rules at `path`, but `alert`'s `for:` is `wait`: its expression, labels and
    annotations as shipped, without a test waiting a minute for its `for:`."""
    data = yaml.safe_load(RULES.read_text())
    [rule] = [r for g in data["groups"] for r in g["rules"] if r["alert"] == alert]
    rule["for"] = wait
    path.write_text(yaml.safe_dump(data, sort_keys=False))


class Prometheus:
    """A Prometheus server of the test's own: its config, data and log in `directory`,
    scraping `targets` (job name -> host:port) and evaluating `rules` every second."""

    def __init__(self, directory, targets: dict, rules):
        self.url = f"http://127.0.0.1:{free_port()}"
        config = directory / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                               for job, target in targets.items()]}))
        self.log = directory / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        wait_for(self.ready, 30, f"Prometheus ready (its log: {self.log})")

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, **query):
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=5) as r:
            answer = json.load(r)
        assert answer["status"] == "success", answer
        return answer["data"]

    def alerts(self, name: str) -> list:
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def prometheus(tmp_path):
    started = []

    def start(targets: dict, rules) -> Prometheus:
        started.append(Prometheus(tmp_path, targets, rules))
        return started[-1]

    yield start
    for p in started:
        p.stop()


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed "
                    "(./scripts/install installs Debian's prometheus package)")
def test_a_sender_killed_uncleanly_fires_the_silent_link_alert_in_prometheus(
        tmp_path, start_brokers, launch, prometheus):
    src, dst = start_brokers("tansu", "source", "destination")
    listen = {side: f"127.0.0.1:{free_port()}" for side in ("sender", "receiver")}
    path = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          sender={"metrics.listen": listen["sender"],
                                  "heartbeat.interval.ms": 300},
                          receiver={"metrics.listen": listen["receiver"]})
    create_topic(src.bootstrap, "src", 1)
    launch(path, side="receiver", workers=3)
    sender = launch(path, side="sender", workers=3)
    produce(src.bootstrap, "src", [{"value": b"v%d" % i} for i in range(20)])
    assert len(consume(dst.bootstrap, "dst_src", 20)) == 20

    rules = tmp_path / "diode-rules.yml"
    rules_with_short_for(rules, "DiodeLinkSilent", "2s")
    prom = prometheus({f"diode-{side}": target for side, target in listen.items()}, rules)

    def heard_the_sender():  # both endpoints scraped, the rule evaluated on a live link
        up = {r["metric"]["job"]: r["value"][1] for r in prom.api("query", query="up")["result"]}
        silent = prom.api("query", query="diode_link_silent")["result"]
        evaluated = [r for g in prom.api("rules")["groups"] for r in g["rules"]
                     if r["name"] == "DiodeLinkSilent" and r["health"] == "ok"]
        return up == {"diode-sender": "1", "diode-receiver": "1"} and silent and \
            all(r["value"][1] == "0" for r in silent) and evaluated
    wait_for(heard_the_sender, 30, "Prometheus to scrape both sides and evaluate the rules")
    assert prom.alerts("DiodeLinkSilent") == []

    sender.kill()  # SIGKILL to its supervisor, workers and endpoint: no clean-stop heartbeat
    killed = time.monotonic()
    [alert] = wait_for(lambda: [a for a in prom.alerts("DiodeLinkSilent")
                                if a["state"] == "firing"], 30, "DiodeLinkSilent firing")
    assert alert["labels"] == {"alertname": "DiodeLinkSilent", "severity": "critical",
                               "job": "diode-receiver", "instance": listen["receiver"],
                               "side": "receiver"}
    assert listen["receiver"] in alert["annotations"]["summary"]
    assert alert["annotations"]["runbook"] == "docs/alerts.md#diodelinksilent"
    print(f"DiodeLinkSilent firing {time.monotonic() - killed:.1f} s after the kill")
