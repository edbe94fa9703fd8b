"""The decision log: append-only, per-tenant hash-chained events."""
