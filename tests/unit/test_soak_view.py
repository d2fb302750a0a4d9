"""diode.soak.view: the live view shows what an operator watches during a soak."""

import io
from types import SimpleNamespace

from rich.console import Console

from diode.soak.view import View


def test_live_view_shows_progress_counts_faults_and_workers():
    samples = [{"t": float(t), "produced": 1000 * t, "delivered": 990 * t, "missing": 7,
                "backlog": 120, "restarts": 2, "behind": 0,
                "workers": {"receiver/unpacker-0": {"pid": 42, "rss": 48 * 2 ** 20,
                                                    "cpu": 31.0}}} for t in range(30)]
    soak = SimpleNamespace(timeline=samples, duration=3600.0,
                           fault_log=[{"kind": "link-down", "at": 12.0}])
    plan = SimpleNamespace(faults=[object()] * 14)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with View(soak, plan, live=True, console=console) as view:
        view.update()
    text = out.getvalue()
    for shown in ("29s", "59m31s", "29,000", "1,000/s", "backlog", "120",
                  "link-down at 12s", "1 of 14", "receiver/unpacker-0", "48.0"):
        assert shown in text, shown
