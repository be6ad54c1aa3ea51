"""The only code of the engine that talks to the broker: the poller (the group consumer) with
its parts (assigned partitions, pauses, commit requests and their client calls, transactions,
the client's log), the committers, the output producer and the exact committed-offset reader
(docs/architecture.md)."""
