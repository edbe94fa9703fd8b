"""``decisions.response`` stored as a difference from its own row (issue 20, form 3).

A Decision v1 answer spells its decision id, request id, args hash and policy revision,
and its permit's claims spell three of them again; the row holds all four as columns
(``id``, ``request_id``, ``args_hash``, ``policy_revision``). Stored form 3 is form 2
(:mod:`cosigner.db.compressed`: the answer with the token's place empty, the token's
decoded header and claims, its raw signature) with every occurrence of those column
texts in the answer, header and claims replaced by a two-byte reference
(``0x1A``, ``1..4``) before compression. Reads put the texts back from the row: the
bytes are exactly form 2's, so the token and the answer are rebuilt byte for byte.

Exactness: a part holding a ``0x1A`` byte (never in JSON text, which escapes control
characters) is not packed this way (form 2 instead); a column text that is not
printable (a byte below ``0x20``, among others) is not referenced; references are
replaced longest first in each part (``bytes.replace``: leftmost, not overlapping), and a
reference's second byte (``1..5``) cannot occur in a referenced text, so no later text
matches across one (tests/db/test_response_row.py, hypothesis).

Writing costs one search of the three parts per text: they are searched as one, joined
by a ``0x00`` byte, which no JSON text holds and no referenced (printable) text or
reference holds, so no text matches across it and a split gives the parts back (a
token's header or claims holding a ``0x00`` byte, so not JSON and not minted here, are
searched part by part).

Form 7 (migration ``0024_s12store_response_bare``) is form 3 in a frame without zstd's
4-byte magic number, compressed with :data:`~cosigner.db.compressed.STORE_PARAMS`, and
with a fifth reference (``0x1A 0x05``): the row's ``run_id``, which the permit's claims
spell as ``run``. What :func:`pack` writes. Form 3 values read as before (their frames
hold references 1..4 only).

Only the group commit's inserts know the row when the response is encoded
(:mod:`cosigner.db.row_encoders`); other writers store form 2. Every reader of
``decisions.response`` selects the four columns with it and calls :func:`answer`
(``ResponseJSON`` gives a :class:`~cosigner.db.compressed.RowBound` for form 3, which
is not a mapping: a reader that forgot fails rather than answering wrong).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cosigner.db import answer_facts, compressed

V3_ROW = compressed.V3_ROW
#: The row's columns an answer may refer to, in reference order (1..4).
REF_COLUMNS = ("id", "request_id", "args_hash", "policy_revision", "run_id")
_MARK = b"\x1a"
_MARK_BYTE = _MARK[0]
_MIN_REF = 8
#: Between the three parts while they are searched (module docstring).
_SEPARATOR = b"\x00"
_MARKS = tuple(_MARK + bytes([i + 1]) for i in range(len(REF_COLUMNS)))
V7_ROW_BARE = compressed.V7_ROW_BARE
_V7_PREFIX = bytes([V7_ROW_BARE])
_V8_PREFIX = bytes([compressed.V8_FACTS])


def pack(value: Any, refs: Sequence[str | None]) -> bytes | None:
    """``value`` in stored form 8 (:mod:`cosigner.db.answer_facts`) where it fits, else form 7
    (form 3's body in a bare frame), given its row's :data:`REF_COLUMNS` texts; ``None``
    when neither applies (no permit token, or a part holding ``0x1A``)."""
    parts = compressed.response_parts(value)
    if parts is None:
        return None
    facts = answer_facts.pack(value, parts, refs)
    return facts if facts is not None else _form_7(parts, refs)


def pack_form_7(value: Any, refs: Sequence[str | None]) -> bytes | None:
    """``value`` in stored form 7 only (what the code before form 8 wrote: migration
    ``0026_s14store_answer_facts``'s downgrade), or ``None`` as :func:`pack`."""
    parts = compressed.response_parts(value)
    return None if parts is None else _form_7(parts, refs)


def _form_7(parts: tuple[bytes, bytes, bytes, bytes], refs: Sequence[str | None]
            ) -> bytes | None:
    answer, header, claims, signature = parts
    # The byte as an int: ``bytes in bytes`` first tries the needle as an integer,
    # raising and clearing a TypeError each time (three per answer).
    if _MARK_BYTE in answer or _MARK_BYTE in header or _MARK_BYTE in claims:
        return None
    usable = [(len(text), mark, text.encode()) for mark, text in zip(_MARKS, refs, strict=False)
              if isinstance(text, str) and len(text) >= _MIN_REF and text.isprintable()]
    usable.sort(reverse=True)  # longest first
    if 0 in answer or 0 in header or 0 in claims:  # not JSON: a token not minted here
        for _, mark, text in usable:
            answer = answer.replace(text, mark)
            header = header.replace(text, mark)
            claims = claims.replace(text, mark)
    else:
        joined = _SEPARATOR.join((answer, header, claims))  # one search per text
        for _, mark, text in usable:
            joined = joined.replace(text, mark)
        answer, header, claims = joined.split(_SEPARATOR)
    return _V7_PREFIX + compressed.compress_bare_store(
        compressed.join_parts(answer, header, claims, signature))


def bind(value: Any, refs: Sequence[str | None]) -> bytes | None:
    """What the row's ``response`` column stores (form 8 or 7 where one applies, else what
    :class:`~cosigner.db.compressed.ResponseJSON` stores)."""
    if value is None:
        return None
    packed = pack(value, refs)
    return packed if packed is not None else compressed.bind_response(value)


def _restore(part: bytes, refs: Sequence[bytes | None]) -> bytes:
    if _MARK not in part:
        return part
    pieces = part.split(_MARK)
    out = [pieces[0]]
    for piece in pieces[1:]:
        text = refs[piece[0] - 1] if piece and 1 <= piece[0] <= len(refs) else None
        if text is None:
            raise ValueError("a form 3 response refers to a column its row does not hold")
        out += (text, piece[1:])
    return b"".join(out)


def unpack(stored: bytes | bytearray | memoryview, refs: Sequence[str | None]) -> Any:
    """The answer of a stored form 3, 7 or 8 value, given its row's :data:`REF_COLUMNS`
    texts.

    Raises:
        ValueError: not form 3, 7 or 8, a damaged frame, or a reference to a missing
            column.
    """
    data = bytes(stored)
    if data[:1] == _V8_PREFIX:
        return compressed.answer_of(*answer_facts.parts_of(data, refs))
    if data[:1] == _V7_PREFIX:
        body = compressed.decompress_bare(data[1:])
    elif data[:1] == bytes([V3_ROW]):
        body = compressed._unzstd(data)  # noqa: SLF001
    else:
        raise ValueError("not a form 3, 7 or 8 response")
    answer, header, claims, signature = compressed.split_parts(body)
    texts = [text.encode() if isinstance(text, str) else None for text in refs]
    return compressed.answer_of(_restore(answer, texts), _restore(header, texts),
                                _restore(claims, texts), signature)


def resolve(response: Any, refs: Sequence[str | None]) -> Any:
    """A ``ResponseJSON`` value as read, resolved against its row when it is form 3."""
    if isinstance(response, compressed.RowBound):
        return unpack(response.stored, refs)
    return response


def answer(row: Any) -> Any:
    """The answer of a row holding ``response`` and the :data:`REF_COLUMNS` (attributes,
    as SQLAlchemy rows give them)."""
    response = row.response
    if isinstance(response, compressed.RowBound):
        return unpack(response.stored, tuple(getattr(row, name) for name in REF_COLUMNS))
    return response
