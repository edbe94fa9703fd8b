"""Outgoing approval notifications: an outbox table, HMAC signatures, a retrying worker."""
