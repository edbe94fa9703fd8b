"""decision responses in a bare frame, compressed harder (stored form 7)

``decisions.response`` in stored form 3 (:mod:`cosigner.db.response_row`: the answer and
its permit token as a difference from the row, in a zstd frame) is rewritten in form 7:
the same uncompressed body in a frame without zstd's 4-byte magic number, compressed
with :data:`cosigner.db.compressed.STORE_PARAMS` instead of level 1 (~36 bytes less per
allow answer on the bench's calls). The body is moved as is (no JSON is parsed), so
every answer reads back byte for byte. A value whose frame does not decode (damaged
outside Cosigner) is left as it is, and reads as damaged as before. No schema change;
both SQLite and PostgreSQL, rows rewritten in pages of 2,000 ordered by id (0022's
loop).

Form 7 also refers to the row's ``run_id`` (reference 5, written by the code since this
migration; rows moved from form 3 hold none). Downgrade: form 7 back to form 3 (level 1,
with the magic number) with every reference 5 replaced by the row's run id again, which
the code of 0022-0023 reads.

Revision ID: 0024_s12store_response_bare
Revises: 0023_s8store_event_row
Create Date: 2026-12-02 10:50:00
"""

import importlib
from collections.abc import Sequence

revision: str = "0024_s12store_response_bare"
down_revision: str | Sequence[str] | None = "0023_s8store_event_row"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LOOP = "cosigner.db.migrations.versions.0022_s7store_response_row"
#: Form 7's reference to the row's run_id (cosigner.db.response_row).
_RUN_MARK = b"\x1a\x05"


def upgrade() -> None:
    from cosigner.db import compressed

    def to_form_7(stored: bytes, refs: tuple[str | None, ...]) -> bytes | None:
        if stored[:1] != bytes([compressed.V3_ROW]):
            return None
        try:
            body = compressed._unzstd(stored)  # noqa: SLF001
        except ValueError:  # damaged: left as it is
            return None
        return bytes([compressed.V7_ROW_BARE]) + compressed.compress_bare_store(body)

    importlib.import_module(_LOOP)._rewrite(to_form_7)  # noqa: SLF001


def downgrade() -> None:
    from cosigner.db import compressed

    def to_form_3(stored: bytes, refs: tuple[str | None, ...]) -> bytes | None:
        if stored[:1] != bytes([compressed.V7_ROW_BARE]):
            return None
        try:
            answer, header, claims, signature = compressed.split_parts(
                compressed.decompress_bare(stored[1:]))
        except ValueError:  # damaged: left as it is
            return None
        run = refs[4]
        if run is None:
            return None  # run_id is NOT NULL: not reached
        # 0x1A occurs in a form 3/7 part only as the first byte of a reference.
        text = run.encode()
        body = compressed.join_parts(answer.replace(_RUN_MARK, text),
                                     header.replace(_RUN_MARK, text),
                                     claims.replace(_RUN_MARK, text), signature)
        return bytes([compressed.V3_ROW]) + compressed._LEVEL1_COMPRESSOR.compress(body)  # noqa: SLF001

    importlib.import_module(_LOOP)._rewrite(to_form_3)  # noqa: SLF001
