"""The kafka_writer's rooms (stages.kafka_writer keeps the loop and hands each its part):

- reporter: missing ranges, fills and closed tickets as the operator sees them (events, logs,
  metrics). Where a range is decided missing: diode.accounting.ordering, nowhere else.
- destination: the destination cluster: the backlog, produce, acknowledgements, dead letters
  and refusals, destination topics and their trouble, the events producer.
- recovery: restarts: the checkpoints, and what the destination already holds.
- link_watch (writer 0): the sender's heartbeats, a silent link, a clean stop.
- source_view: the source as the sender sees it (lag, risk, expired ranges, digests) and, for
  writer 0, its metadata handed to the sync.
"""
