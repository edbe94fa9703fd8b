"""approver pages: indexes for the paged, sorted inbox and the filtered history

``ix_approvals_tenant_created`` serves the inbox sorted by creation (``ix_approvals_tenant_status``
already covers time left); ``ix_approvals_tenant_decided`` serves the history, newest
decision first, with its date-range filter (:mod:`cosigner.approvals.listing`, keyset
paging on ``(column, id)``).

Revision ID: 0015_pages
Revises: 0014_slack
Create Date: 2026-12-01 05:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015_pages"
down_revision: str | Sequence[str] | None = "0014_slack"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_approvals_tenant_created", "approvals",
                    ["tenant", "status", "created_at"])
    op.create_index("ix_approvals_tenant_decided", "approvals", ["tenant", "decided_at"])


def downgrade() -> None:
    op.drop_index("ix_approvals_tenant_decided", table_name="approvals")
    op.drop_index("ix_approvals_tenant_created", table_name="approvals")
