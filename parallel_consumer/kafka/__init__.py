"""The only code of the engine that talks to the broker: the poller (the group consumer) with
its parts (assigned partitions, pauses, commit requests and their client calls, transactions,
the client's log), the committers, the output producer, the exact committed-offset reader and
the preparation of the dead-letter topics at start (docs/architecture.md)."""
