"""The engine: the controller thread and the parts it routes events to (docs/architecture.md)."""
