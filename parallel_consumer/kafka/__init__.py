"""The only code of the engine that talks to the broker: the poller (the group consumer), the
committers, the output producer and the exact committed-offset reader (docs/architecture.md)."""
