"""The pieces of scripts/bench.py, one concern per module:

- resources: brokers and processes started by the bench, and their clean-up; logging;
- net: what the kernel says about UDP sockets (/proc/net/udp, /proc/net/snmp);
- workload: source topics and the records pre-produced to them;
- meter: how a run's progress is read (destination watermarks, committed offsets), the
  --verify count, and the loop that waits for a run to end;
- cpu: CPU seconds per process (psutil), diode's workers named by their process titles;
- launch: a diode topology written and launched (one side or both), its metrics files;
- profile: py-spy on every diode worker, collapsed stacks, self time per stage;
- udp: the UDP sink (counts or captures datagrams) and the replayer (sends a capture);
- baselines: the plain processes diode is compared with (relay, consumer, producer);
- e2e, sender, receiver: the measurement modes; memory: RSS per worker over a reordering link;
- spread: --partitions, end to end over many partitions; writer_cost: --mode writer, a
  kafka_writer's CPU per call by partitions held; startup: --mode startup, startup's parts
  alone over many partitions;
- report: the table per mode and the JSON line.
"""
