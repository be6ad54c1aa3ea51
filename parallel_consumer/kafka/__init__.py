"""The only code of the engine that talks to the broker: the poller (the group consumer), the
committers, the output producer, the exact committed-offset reader and the preparation of the
dead-letter topics at start (docs/architecture.md)."""
