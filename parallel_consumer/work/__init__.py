"""Work state and the pure policies over it: no threads, no Kafka client, no OpenTelemetry.

Owned by the controller thread; nothing here is thread-safe, by design.
"""
