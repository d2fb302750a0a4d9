"""Writes deploy/grafana/diode.json, the Grafana dashboard of diode's Prometheus metrics
(docs/metrics.md): one row per question an operator asks. Run it after changing a panel; the
test suite checks that every metric it queries is exported by a running pipeline
(tests/integration/test_metrics_endpoint.py)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "grafana" / "diode.json"

# (row, [(title, unit, [(expr, legend)])])
ROWS = [
    ("Throughput", [
        ("Records/s per stage", "ops", [
            ('sum by (side, stage) (rate(diode_records_total{job=~"$job"}[1m]))',
             "{{side}}/{{stage}}")]),
        ("Datagrams/s per stage", "ops", [
            ('sum by (side, stage) (rate(diode_datagrams_total{job=~"$job"}[1m]))',
             "{{side}}/{{stage}}")]),
        ("Link Mbit/s", "Mbits", [
            ('sum by (side) (rate(diode_bytes_total{job=~"$job",stage=~"udp_.*"}[1m])) * 8 '
             '/ 1e6', "{{side}}")]),
    ]),
    ("Loss and integrity", [
        ("Records reported missing /min", "short", [
            ('sum (increase(diode_missing_records_total{job=~"$job"}[1m]))', "missing"),
            ('sum (increase(diode_late_records_total{job=~"$job"}[1m]))', "filled late")]),
        ("Datagrams rejected /min, by reason", "short", [
            ('sum by (reason) (increase(diode_rejects_total{job=~"$job"}[1m]))',
             "{{reason}}")]),
        ("Dropped by the receiver's socket /min", "short", [
            ('sum (increase(diode_socket_drops_total{job=~"$job"}[1m]))', "socket drops")]),
        ("Duplicates dropped /min", "short", [
            ('sum (increase(diode_duplicates_total{job=~"$job"}[1m]))', "duplicates")]),
        ("Missing in the last hour", "short", [
            ('sum (diode_missing_records_last_hour{job=~"$job"})', "records"),
            ('sum (diode_missing_ranges_last_hour{job=~"$job"})', "ranges")]),
        ("Behind the source, by topic (records)", "short", [
            ('sum by (topic) (diode_source_lag_records{job=~"$job"})', "{{topic}}")]),
        ("Still held by the source, by topic (records)", "short", [
            ('sum by (topic) (diode_source_held_records{job=~"$job"})', "{{topic}}")]),
        ("Missing records at risk, and expired /min", "short", [
            ('sum by (topic) (diode_missing_at_risk_records{job=~"$job"})', "at risk {{topic}}"),
            ('sum (increase(diode_missing_expired_records_total{job=~"$job"}[1m]))',
             "expired")]),
        ("Resend tickets: open, the oldest's age (s), closed /min", "short", [
            ('sum (diode_tickets_open{job=~"$job"})', "open"),
            ('max (diode_ticket_oldest_age_seconds{job=~"$job"})', "oldest age"),
            ('sum by (reason) (increase(diode_tickets_closed_total{job=~"$job"}[1m]))',
             "closed {{reason}}")]),
        ("Mean time to repair a ticket (s)", "s", [
            ('sum (rate(diode_ticket_repair_seconds_total{job=~"$job"}[1h])) / sum (rate('
             'diode_tickets_closed_total{reason="filled",job=~"$job"}[1h]))', "mean")]),
    ]),
    ("Latency and the link", [
        ("End-to-end latency", "s", [
            ('histogram_quantile(0.5, sum by (le) (rate('
             'diode_end_to_end_latency_seconds_bucket{job=~"$job"}[5m])))', "p50"),
            ('histogram_quantile(0.99, sum by (le) (rate('
             'diode_end_to_end_latency_seconds_bucket{job=~"$job"}[5m])))', "p99")]),
        ("Sender heartbeat age", "s", [
            ('max (diode_link_heartbeat_age_seconds{job=~"$job"})', "age")]),
        ("Sender sessions", "short", [
            ('max (diode_sessions_active{job=~"$job"})', "sessions")]),
        ("From addresses not admitted /min (the source filter)", "short", [
            ('sum (increase(diode_source_filtered_datagrams_total{job=~"$job"}[1m]))',
             "filtered")]),
    ]),
    ("Queues and backlog", [
        ("Records waiting for the destination", "short", [
            ('sum (diode_backlog_records{job=~"$job"})', "backlog"),
            ('sum (diode_pending_records{job=~"$job"})', "reordering")]),
        ("Receive journal", "bytes", [
            ('sum (diode_journal_bytes{job=~"$job"})', "size"),
            ('sum (diode_journal_unforwarded_bytes{job=~"$job"})', "not yet forwarded")]),
        ("Backpressure: share of time the next stage took nothing", "percentunit", [
            ('sum by (side, stage) (rate(diode_output_blocked_seconds_total{job=~"$job"}'
             '[1m]))', "{{side}}/{{stage}}")]),
        ("Sent, not yet committed", "short", [
            ('sum (diode_inflight_records{job=~"$job"})', "in flight")]),
    ]),
    ("Workers", [
        ("CPU per worker (share of a core)", "percentunit", [
            ('rate(diode_cpu_seconds_total{job=~"$job"}[1m])', "{{side}}/{{stage}}-{{index}}")]),
        ("Workers up", "short", [
            ('sum by (side, stage) (diode_worker_up{job=~"$job"})', "{{side}}/{{stage}}")]),
        ("Restarts /10 min", "short", [
            ('sum by (side, stage) (increase(diode_worker_restarts_total{job=~"$job"}[10m]))',
             "{{side}}/{{stage}}")]),
        ("Errors /min, by reason", "short", [
            ('sum by (stage, reason) (increase(diode_errors_total{job=~"$job"}[1m]))',
             "{{stage}} {{reason}}")]),
        ("Longest steps of the loop (p99; over 0.1 s breaks the contract)", "s", [
            ('histogram_quantile(0.99, sum by (side, stage, le) (rate('
             'diode_step_seconds_bucket{job=~"$job"}[5m])))', "{{side}}/{{stage}}")]),
    ]),
]


def dashboard() -> dict:
    panels, y, pid = [], 0, 1
    for row, graphs in ROWS:
        panels.append({"type": "row", "title": row, "id": pid, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        width = 24 // len(graphs)
        for i, (title, unit, targets) in enumerate(graphs):
            panels.append({
                "type": "timeseries", "title": title, "id": pid,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": width, "x": i * width, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [{"expr": expr, "legendFormat": legend, "refId": chr(65 + n),
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                            for n, (expr, legend) in enumerate(targets)]})
            pid += 1
        y += 8
    return {
        "title": "diode", "uid": "diode", "schemaVersion": 39, "version": 1,
        "tags": ["diode", "kafka"], "timezone": "", "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Prometheus"},
            {"name": "job", "type": "query", "label": "job", "multi": True,
             "includeAll": True, "allValue": ".*",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(diode_worker_up, job)", "refresh": 2}]},
        "panels": panels,
    }


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dashboard(), indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
