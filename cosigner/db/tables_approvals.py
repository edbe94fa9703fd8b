"""Tables of approval requests, their reviews, and the stored input of decided calls.

``approvals`` holds the exact canonical arguments (``args``) next to the policy ``mask``;
anything shown or exported goes through :func:`cosigner.approvals.reviews.display_args`. The partial
unique index ``uq_approvals_pending_call`` is the join rule: one *pending* request per
(tenant, run, tool, args hash), enforced by the database across replicas. The partial index
``ix_approvals_rejected_call`` finds the standing rejections of a call
(:mod:`cosigner.approvals.rejections`).

``call_inputs`` keeps the policy input of every ``allow`` / ``require_approval`` decision
(without ``now``) so a redeem can re-evaluate the currently active policy on the same input.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from cosigner.db.compressed import CompressedJSON
from cosigner.db.sqlite_compact import HexId, UuidText
from cosigner.db.tables import metadata

approvals = Table(
    "approvals",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("kind", String(16), nullable=False),  # policy | runtime_review
    Column("decision_id", UuidText, nullable=False),  # 16 bytes on SQLite (0021)
    Column("run_id", String(256), nullable=False),
    Column("tool", String(256), nullable=False),
    Column("args_hash", String(71), nullable=False),
    Column("args", Text, nullable=False),  # RFC 8785 canonical JSON of the exact arguments
    Column("mask", JSON, nullable=False),  # JSON pointers never displayed in clear
    # The current stage's {require, timeout_ms, distinct_from, on_expired?, break_glass?}
    Column("requirement", JSON, nullable=False),
    Column("stage", Integer, nullable=False, server_default=text("1")),  # escalation stage
    Column("status", String(16), nullable=False),  # pending|approved|rejected|expired|cancelled
    Column("initiator", JSON, nullable=False),
    Column("principal", JSON, nullable=False),
    Column("opened_by", JSON, nullable=False),  # actor (authenticated runtime) that opened it
    Column("reasons", JSON, nullable=False),
    Column("policy", JSON, nullable=True),  # {id, version, revision}
    Column("reason", Text, nullable=True),  # runtime_review: why the runtime asked
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("decided_at", DateTime(timezone=True), nullable=True),
    Column("permit_jti", HexId, nullable=True),
    Column("permit", JSON, nullable=True),  # {token, jti, expires_at} once approved
    # A rejection sticks (cosigner.approvals.rejections) until withdrawn: when, and by whom (actor).
    Column("withdrawn_at", DateTime(timezone=True), nullable=True),
    Column("withdrawn_by", JSON, nullable=True),
    # Break-glass (cosigner.approvals.breakglass): {by: actor, reason, at}; then the
    # mandatory after-the-fact review: "open" until an approver records it ("done").
    Column("break_glass", JSON, nullable=True),
    Column("after_review", String(8), nullable=True),  # open | done
    Column("after_reviewed", JSON, nullable=True),  # {by: actor, verdict, comment, at}
    # A superseded request (cancelled: cosigner.approvals.superseding): the request of
    # the same call that replaced it, for its readers to follow (0028).
    Column("superseded_by", String(36), nullable=True),
    # Partial indexes: the migrations (0002, 0007, 0027) create them with the same WHERE on
    # PostgreSQL too. Here only the SQLite form: a ``postgresql_where`` makes SQLAlchemy load
    # the PostgreSQL dialect to check it, ~2.3 MB in every SQLite server (issue 20).
    Index("uq_approvals_pending_call", "tenant", "run_id", "tool", "args_hash", unique=True,
          sqlite_where=text("status = 'pending'")),
    # The standing rejections: tiny, read by every decision batch that allows a call.
    Index("ix_approvals_rejected_call", "tenant", "run_id", "tool", "args_hash",
          sqlite_where=text("status = 'rejected' AND withdrawn_at IS NULL")),
    Index("ix_approvals_tenant_status", "tenant", "status", "expires_at"),
    # The approver pages' lists (cosigner.approvals.listing): inbox by creation, history.
    Index("ix_approvals_tenant_created", "tenant", "status", "created_at"),
    # Only decided requests, and only break-glass ones (0027): an opening writes neither.
    Index("ix_approvals_tenant_decided", "tenant", "decided_at",
          sqlite_where=text("decided_at IS NOT NULL")),
    Index("ix_approvals_decision", "tenant", "decision_id"),
    Index("ix_approvals_after_review", "tenant", "after_review",
          sqlite_where=text("after_review IS NOT NULL")),
)

reviews = Table(
    "reviews",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("approval_id", String(36), nullable=False),
    Column("tenant", String(128), nullable=False),
    Column("run_id", String(256), nullable=False),
    Column("subject", String(256), nullable=False),  # stable subject id from authentication
    Column("principal_id", String(36), nullable=False),
    Column("roles", JSON, nullable=False),  # required roles the reviewer held at review time
    Column("role", String(64), nullable=True),  # group the approval counts for
    Column("stage", Integer, nullable=False, server_default=text("1")),  # of the request
    Column("decision", String(16), nullable=False),  # approved | rejected
    Column("comment", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # A signed review's statement and verified WebAuthn assertion (migration 0016_webauthn).
    Column("signature", JSON, nullable=True),
    UniqueConstraint("approval_id", "subject", name="uq_reviews_approval_subject"),
    Index("ix_reviews_run", "tenant", "run_id", "decision"),
)
#: Reviews joined to their request in the same tenant: what the separation-of-duties
#: reads select the reviewed call (``approvals.c.tool``, ``approvals.c.args_hash``) from.
REVIEWED_REQUESTS = reviews.join(approvals, (approvals.c.id == reviews.c.approval_id)
                                 & (approvals.c.tenant == reviews.c.tenant))

#: Bounded standing approvals (cosigner.approvals.standing): an approver extends one
#: approval to later calls of the same tool on behalf of the same principal (in one run, or
#: in any run of the tenant until ``expires_at``) whose args meet ``constraints``, at most
#: ``max_uses`` times. ``uses`` is counted under the decision's write lock.
standing_approvals = Table(
    "standing_approvals",
    metadata,
    Column("id", String(36), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("approval_id", String(36), nullable=False),  # the request it was granted on
    Column("tool", String(256), nullable=False),
    Column("principal_id", String(256), nullable=False),
    Column("run_id", String(256), nullable=True),  # scope "run"; null: scope "ttl"
    Column("constraints", JSON, nullable=False),  # [{pointer, op, value}]
    Column("roles", JSON, nullable=False),  # the roles of the requirement it extends
    Column("max_uses", Integer, nullable=False),
    Column("uses", Integer, nullable=False),
    Column("created_by", JSON, nullable=False),  # actor
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    Column("revoked_by", JSON, nullable=True),
    Index("ix_standing_call", "tenant", "tool", "principal_id"),
)

call_inputs = Table(
    "call_inputs",
    metadata,
    Column("decision_id", UuidText, primary_key=True),
    Column("tenant", String(128), nullable=False),
    # The policy input document without "now", zstd-compressed (cosigner.db.compressed).
    Column("input", CompressedJSON, nullable=False),
    Column("mask", JSON, nullable=False),
    # SQLite: stored in its primary key's B-tree (no rowid table plus unique index; the
    # decision id is a UUIDv7, so rows go in at the end) (0020_s5store_facts_once).
    sqlite_with_rowid=False,
)
