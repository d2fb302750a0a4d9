"""`diode tickets TOPOLOGY`: the resend tickets on the low side, and their signed manifest.

The receiver's writers open a ticket for every missing range they report and close it when the
range is filled or expired, each said on the missing-records topic
(diode.accounting.tickets). This command reads that topic on the destination cluster with the
topology's receiver.kafka settings (-X and --bootstrap over them: diode.kafka.cluster), and
lists the tickets with their age and state, or writes the manifest of the open ones, signed
with the link's key, for `diode resend` on the high side (which refuses a manifest that does
not check: see manifest_problem).
"""

import json
import sys
import time

from diode.accounting import tickets
from diode.errors import DiodeError
from diode.runtime import topology as topo


def _keys(t) -> tuple:
    """The link's (current key id, {key id: master key}); (None, {}) without a cipher."""
    from diode.runtime.supervisor import load_secrets
    secrets = load_secrets(t)
    if secrets.master_key is None:
        return None, {}
    return secrets.key_id, secrets.keys()


def signed(t, manifest: dict) -> dict:
    """The manifest signed with the topology's link key (unsigned, with a warning, when the
    link has no cipher: `diode resend` then takes it only from a topology without one too)."""
    key_id, keys = _keys(t)
    if key_id is None:
        print("warning: security.cipher is none: the manifest is not signed", file=sys.stderr)
        return manifest
    return tickets.sign(manifest, keys[key_id], key_id)


def manifest_problem(t, manifest: dict) -> str | None:
    """Why `diode resend` must refuse this manifest under topology `t`, or None. A link with a
    cipher takes only manifests signed with one of its keys; one without takes any."""
    _, keys = _keys(t)
    if not keys:
        return None
    return tickets.check(manifest, keys)


def cmd_tickets(args) -> int:
    from diode.kafka import recovery
    from diode.kafka.cluster import of_topology, reach
    t = topo.load(args.topology)
    r = t.receiver
    if not r.missing_records_topic:
        raise DiodeError("receiver.missing.records.topic is empty: the receiver keeps no "
                         "tickets without it")
    cluster = of_topology(t, "receiver", args.kafka, args.bootstrap)
    reach(cluster, args.timeout)
    book = tickets.Book()
    for event in recovery.all_events(cluster.settings, r.missing_records_topic, args.timeout):
        book.add(event)
    which = "open" if args.open or args.manifest else "closed" if args.closed else "all"
    chosen = book.select(which)
    now_ms = int(time.time() * 1000)
    if args.manifest:
        manifest = signed(t, tickets.manifest_of(chosen, now_ms, t.name))
        with open(args.manifest, "w") as f:
            json.dump(manifest, f, indent=1)
        print(f"wrote {args.manifest}: {len(chosen)} open ticket(s), "
              f"{sum(x.records for x in chosen)} record(s)", file=sys.stderr)
        return 0
    if args.json:
        print(json.dumps([x.as_json(now_ms) for x in chosen], indent=1))
        return 0
    print(f"{'ticket':<20}  {'state':<9} {'source':<28} {'offsets':<23} {'records':>8}  "
          f"{'age':>9}  reason")
    for x in chosen:
        where = f"{x.topic}[{x.partition}]"
        print(f"{x.id:<20}  {x.state:<9} {where:<28} {f'{x.first}..{x.last}':<23} "
              f"{x.records:>8}  {_age(x.age_seconds(now_ms)):>9}  "
              f"{x.reason}{' (partly expired)' if x.at_risk else ''}")
    opened = [x for x in book.tickets.values() if x.state == "open"]
    print(f"{len(opened)} open ({sum(x.records for x in opened)} records), "
          f"{len(book.tickets) - len(opened)} closed", file=sys.stderr)
    return 0


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def add_parser(sub) -> None:
    p = sub.add_parser("tickets", help="on the low side: the resend tickets (missing ranges "
                       "reported, until filled or expired), or their signed manifest")
    p.add_argument("topology", help="the receiver's topology file (its receiver.kafka "
                   "settings read the missing-records topic on the destination cluster, its "
                   "link key signs the manifest)")
    from diode.kafka.cluster import add_options
    add_options(p, "receiver", topology=False)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--open", action="store_true", help="only the open tickets")
    which.add_argument("--closed", action="store_true", help="only the closed tickets")
    p.add_argument("--json", action="store_true", help="as JSON, one object per ticket")
    p.add_argument("--manifest", metavar="FILE",
                   help="write the manifest of the open tickets, signed with the link's key, "
                   "for `diode resend` on the high side")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for the destination cluster (default 30)")
    p.set_defaults(func=cmd_tickets)
