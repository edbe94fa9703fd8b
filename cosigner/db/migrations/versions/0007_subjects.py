"""one identity per person (canonical subjects); rejections stick until withdrawn

Revision ID: 0007_subjects
Revises: 0006_linear
Create Date: 2026-12-02 09:00:00

* ``principals.subject`` and ``reviews.subject`` become their canonical form (NFKC, case
  fold, NFKC: ``cosigner.core.subjects``); the spelling a principal was created with is kept in
  the new ``principals.display_name``.
* Two rows that become one in canonical form (two principals of a tenant, or two reviews
  of one approval request) are never merged: the migration stops before changing anything
  and its error lists the colliding rows, for an operator to resolve (disable and rename
  one principal, for example) before migrating again.
* ``approvals.withdrawn_at`` / ``withdrawn_by`` and the partial index
  ``ix_approvals_rejected_call``: a rejection stands until an approver withdraws it.

The folding is written out here rather than imported, so this revision means the same
thing whatever later code does.
"""

import unicodedata
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0007_subjects"
down_revision: str | Sequence[str] | None = "0006_linear"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


class SubjectCollision(RuntimeError):
    """Rows that would become one subject: nothing was migrated."""


def _canonical(value: str) -> str:
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", value).casefold())


def _collisions(rows: Sequence[Any], what: str) -> list[str]:
    """``rows`` are ``(id, scope, subject)``; a report line per group of two or more."""
    groups: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for row in rows:
        row_id, scope, subject = row[0], row[1], row[2]
        groups[(scope, _canonical(subject))].append((row_id, subject))
    return [f"  {what} {scope!r}, canonical subject {canonical!r}: "
            + ", ".join(f"id {row_id} subject {subject!r}" for row_id, subject in members)
            for (scope, canonical), members in sorted(groups.items()) if len(members) > 1]


def upgrade() -> None:
    bind = op.get_bind()
    principal_rows = bind.execute(sa.text(
        "SELECT id, tenant, subject FROM principals ORDER BY tenant, subject, id")).all()
    review_rows = bind.execute(sa.text(
        "SELECT id, approval_id, subject FROM reviews ORDER BY approval_id, subject, id")).all()
    report = (_collisions(principal_rows, "principals of tenant")
              + _collisions(review_rows, "reviews of approval"))
    if report:
        raise SubjectCollision(
            "0007_subjects stopped, nothing changed: these rows name one person in "
            "canonical form (NFKC + case fold) and will not be merged silently; resolve "
            "them (e.g. rename or delete the extra principal) and migrate again:\n"
            + "\n".join(report))

    op.add_column("principals", sa.Column("display_name", sa.String(256), nullable=True))
    bind.execute(sa.text("UPDATE principals SET display_name = subject"))
    for table, rows in (("principals", principal_rows), ("reviews", review_rows)):
        for row in rows:
            if _canonical(row[2]) != row[2]:
                bind.execute(sa.text(f"UPDATE {table} SET subject = :subject WHERE id = :id"),
                             {"subject": _canonical(row[2]), "id": row[0]})

    op.add_column("approvals", sa.Column("withdrawn_at", sa.DateTime(timezone=True),
                                         nullable=True))
    op.add_column("approvals", sa.Column("withdrawn_by", sa.JSON(), nullable=True))
    op.create_index("ix_approvals_rejected_call", "approvals",
                    ["tenant", "run_id", "tool", "args_hash"],
                    sqlite_where=sa.text("status = 'rejected' AND withdrawn_at IS NULL"),
                    postgresql_where=sa.text("status = 'rejected' AND withdrawn_at IS NULL"))


def downgrade() -> None:
    # Canonical subjects stay canonical: the original spellings are in display_name.
    op.drop_index("ix_approvals_rejected_call", table_name="approvals")
    with op.batch_alter_table("approvals") as batch:
        batch.drop_column("withdrawn_by")
        batch.drop_column("withdrawn_at")
    with op.batch_alter_table("principals") as batch:
        batch.drop_column("display_name")
