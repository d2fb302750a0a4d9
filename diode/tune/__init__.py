"""`diode tune`: worker counts and core pinning from each stage's measured CPU cost, proved by
a short bench; and advice for a running launch. docs/tuning.md is the guidance behind it.

- decide: instances per stage and a core per worker for a rate (pure);
- machine: this machine's cores, their load, the NIC's interrupt cores, the network sysctls;
- measure: each stage's CPU per record and per datagram, on the topology's real pipeline;
- edit: the plan as a change to the topology file, comments and layout kept (ruamel.yaml);
- live: which stage of a running launch to widen or narrow, from its metrics;
- partitions: what the source's partition count changes (heartbeat claims, the writers' share,
  a checkpoint's cost);
- command: the CLI.
"""

from diode.tune.command import add_parser, advise, table  # noqa: F401
from diode.tune.decide import Decision, Machine, StagePlan, decide, place  # noqa: F401
from diode.tune.machine import irq_cores, read_machine, sysctl_advice  # noqa: F401
from diode.tune.measure import Measured, Window  # noqa: F401
