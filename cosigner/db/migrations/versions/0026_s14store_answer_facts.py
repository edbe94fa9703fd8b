"""allow answers stored as the facts they are built from (stored form 8)

``decisions.response`` in stored form 7 (:mod:`cosigner.db.response_row`) whose answer is
an allow with a permit this server minted is rewritten in form 8
(:mod:`cosigner.db.answer_facts`): the issuer, audience, kid, tenant, tool, policy id and
version, the reasons, the jti, issue time, lifetime and signature; the answer, the
token's header and claims are rebuilt from them and the row's columns. A value is
rewritten only when the rebuilt answer is byte for byte the one read from form 7
(``answer_facts.pack`` checks it); anything else, and a value whose frame does not decode
(damaged outside Cosigner), is left as it is. No schema change; both SQLite and
PostgreSQL, rows rewritten in pages of 2,000 ordered by id (0022's loop).

Downgrade: form 8 back to form 7, which the code of 0024-0025 reads.

Revision ID: 0026_s14store_answer_facts
Revises: 0025_s13_permit_token_digest
Create Date: 2026-12-04 19:50:00
"""

import importlib
from collections.abc import Sequence

revision: str = "0026_s14store_answer_facts"
down_revision: str | Sequence[str] | None = "0025_s13_permit_token_digest"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LOOP = "cosigner.db.migrations.versions.0022_s7store_response_row"


def upgrade() -> None:
    from cosigner.db import answer_facts, compressed, response_row

    def to_form_8(stored: bytes, refs: tuple[str | None, ...]) -> bytes | None:
        if stored[:1] != bytes([compressed.V7_ROW_BARE]):
            return None
        try:
            value = response_row.unpack(stored, refs)
        except ValueError:  # damaged: left as it is
            return None
        parts = compressed.response_parts(value)
        return None if parts is None else answer_facts.pack(value, parts, refs)

    importlib.import_module(_LOOP)._rewrite(to_form_8)  # noqa: SLF001


def downgrade() -> None:
    from cosigner.db import compressed, response_row

    def to_form_7(stored: bytes, refs: tuple[str | None, ...]) -> bytes | None:
        if stored[:1] != bytes([compressed.V8_FACTS]):
            return None
        try:
            value = response_row.unpack(stored, refs)
        except ValueError:  # damaged: left as it is
            return None
        return response_row.pack_form_7(value, refs)

    importlib.import_module(_LOOP)._rewrite(to_form_7)  # noqa: SLF001
