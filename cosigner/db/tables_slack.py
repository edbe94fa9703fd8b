"""Tables of Slack approvals (migration ``0014_slack``, README § Slack approvals).

* ``slack_messages``: one row per approval request posted to a tenant's Slack channel, and
  the durable outbox of that message: ``state`` ``posting`` (claimed or waiting for a
  retry) → ``open`` (posted with buttons; ``channel`` + ``ts`` name it) → ``done`` (updated
  to its terminal outcome, buttons removed) or ``failed`` (gave up after the last retry).
  ``shown_status``/``shown_stage`` are what the message shows; the sync loop updates it
  when the request's differ. ``claimed_until`` is the claim of the one replica working on it.
* ``slack_link_tokens``: one-time link URLs sent to an unlinked Slack user. Only SHA-256 of
  the token and its random seed are stored (the token is derived from the seed under the
  tenant's signing secret, which the database does not hold); bound to (tenant, team,
  user); single use, short-lived; at most one per Slack user (a live unused one is sent
  again rather than a new one made).
* ``slack_links``: a Slack user (team, user) of one tenant → the Cosigner principal that
  confirmed the link while signed in. A link never applies outside its tenant.
"""

from __future__ import annotations

from sqlalchemy import (
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
)

from cosigner.db.tables import metadata

slack_messages = Table(
    "slack_messages",
    metadata,
    Column("approval_id", String(36), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("state", String(16), nullable=False),  # posting | open | done | failed
    Column("channel", String(80), nullable=True),  # channel id Slack answered with
    Column("ts", String(32), nullable=True),  # the message's timestamp id
    Column("shown_status", String(16), nullable=True),
    Column("shown_stage", Integer, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("claimed_until", DateTime(timezone=True), nullable=True),
    Column("last_error", String(200), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_slack_messages_state", "state", "next_attempt_at"),
)

slack_link_tokens = Table(
    "slack_link_tokens",
    metadata,
    Column("token_hash", String(64), primary_key=True),  # SHA-256 hex of the URL token
    Column("tenant", String(128), nullable=False),
    Column("team_id", String(32), nullable=False),
    Column("user_id", String(32), nullable=False),
    Column("user_name", String(256), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("used_at", DateTime(timezone=True), nullable=True),
    # Random; the token is HMAC-SHA256 of it under the tenant's signing secret, so a live
    # unused token can be sent again (links.issue_token; migration 0019).
    Column("seed", String(64), nullable=True),
)

slack_links = Table(
    "slack_links",
    metadata,
    Column("tenant", String(128), primary_key=True),
    Column("team_id", String(32), primary_key=True),
    Column("user_id", String(32), primary_key=True),
    Column("user_name", String(256), nullable=True),
    Column("principal_id", String(36), ForeignKey("principals.id"), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_slack_links_principal", "principal_id"),
)

__all__ = ["slack_link_tokens", "slack_links", "slack_messages"]
