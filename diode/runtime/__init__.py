"""The runtime: the topology (settings registry, validation, the plan and the pipeline's
wiring), the supervisor and the worker boot it forks, ZeroMQ queues (transport), the receive
journal and the writers' checkpoints, metrics, and the registry of running launches."""
