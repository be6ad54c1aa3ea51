"""Share groups (KIP-932): the poller that owns the ``ShareConsumer`` clients and acknowledges
each record, and the checks of the group's settings at start (docs/share-groups.md)."""
