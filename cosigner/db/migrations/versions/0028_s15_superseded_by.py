"""superseded requests name the request that replaced them

``approvals.superseded_by`` (nullable): set when a pending request is superseded
(:mod:`cosigner.approvals.superseding`: cancelled in favour of a new request of the same
call), so a reader of the old request (``GET /v1/approvals/{id}``, its long-poll, a
runtime asking again for review of the same decision) learns where the call went. Until
now the link was only in the decision log (the ``approval.superseded`` event's
``superseded_by``); the upgrade copies it from there for the requests superseded before
(both SQLite and PostgreSQL; an event whose body does not read is left out: its request
keeps ``NULL``, as a cancelled request without a successor).

Downgrade: the column is dropped (the link stays in the log).

Revision ID: 0028_s15_superseded_by
Revises: 0027_s15_approvals_partial_ix
Create Date: 2026-12-06 22:00:00
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028_s15_superseded_by"
down_revision: str | Sequence[str] | None = "0027_s15_approvals_partial_ix"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE on both databases (as 0025): a batch rebuild of ``approvals`` on
    # SQLite would have to carry its partial indexes over by hand.
    op.add_column("approvals", sa.Column("superseded_by", sa.String(length=36),
                                         nullable=True))
    _copy_from_log()


def downgrade() -> None:
    op.drop_column("approvals", "superseded_by")


def _copy_from_log() -> None:
    """``superseded_by`` of each superseded request, from its ``approval.superseded``
    event (the body read as the chain stores it, :mod:`cosigner.db.event_row`)."""
    from cosigner.db import event_row
    from cosigner.db.tables import audit_events

    bind = op.get_bind()
    found = bind.execute(sa.select(
        audit_events.c.tenant, audit_events.c.approval_id,
        event_row.lenient(audit_events.c.body)).where(
        audit_events.c.type == "approval.superseded")).all()
    approvals = sa.table("approvals", sa.column("id"), sa.column("tenant"),
                         sa.column("status"), sa.column("superseded_by"))
    for tenant, approval_id, body in found:
        if not isinstance(body, str) or approval_id is None:
            continue  # unreadable (event_row.Unreadable): left out
        try:
            payload = json.loads(body).get("payload")
        except (ValueError, AttributeError):
            continue  # not a JSON object (a damaged row): left out, never a failed upgrade
        successor = payload.get("superseded_by") if isinstance(payload, dict) else None
        if not isinstance(successor, str):
            continue
        bind.execute(approvals.update().where(
            approvals.c.id == approval_id, approvals.c.tenant == tenant,
            approvals.c.status == "cancelled").values(superseded_by=successor))
