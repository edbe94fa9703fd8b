"""approvals: the decided and after-review indexes hold only the rows they serve

``ix_approvals_tenant_decided`` (the approver pages' history, newest decision first) and
``ix_approvals_after_review`` (break-glass requests whose mandatory review is open) held an
entry for every request, pending ones included (``decided_at`` and ``after_review`` NULL),
though every query that reads them names ``decided_at IS NOT NULL`` or compares
``after_review`` (:mod:`cosigner.approvals.listing`, :mod:`cosigner.approvals.queries`).
As partial indexes (``WHERE decided_at IS NOT NULL``, ``WHERE after_review IS NOT NULL``,
on SQLite and PostgreSQL alike) a request opening writes two index entries fewer (the
hot ``require_approval`` path: bench/README.md, session 15); a request enters the history
index when it is decided, as before. Downgrade restores the full indexes.

Revision ID: 0027_s15_approvals_partial_ix
Revises: 0026_s14store_answer_facts
Create Date: 2026-12-06 21:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027_s15_approvals_partial_ix"
down_revision: str | Sequence[str] | None = "0026_s14store_answer_facts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (index, columns, the rows it holds)
_PARTIAL = (("ix_approvals_tenant_decided", ["tenant", "decided_at"], "decided_at IS NOT NULL"),
            ("ix_approvals_after_review", ["tenant", "after_review"],
             "after_review IS NOT NULL"))


def upgrade() -> None:
    for name, columns, rows in _PARTIAL:
        op.drop_index(name, table_name="approvals")
        op.create_index(name, "approvals", columns, sqlite_where=sa.text(rows),
                        postgresql_where=sa.text(rows))


def downgrade() -> None:
    for name, columns, _ in _PARTIAL:
        op.drop_index(name, table_name="approvals")
        op.create_index(name, "approvals", columns)
