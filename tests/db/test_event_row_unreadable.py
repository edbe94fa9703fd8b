"""An audit event that does not read, in the event_row mechanism itself (session 9): one
exception type (:class:`cosigner.db.event_row.EventUnreadable`) for every way a body
fails to read back, a lenient selection that marks such a row instead of failing the
result, and the problem it is answered with where nobody catches it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from cosigner.core.canonical import hash_bytes
from cosigner.core.errors import IntegrityFault
from cosigner.db import compressed, event_row
from cosigner.db.tables import audit_events
from cosigner.http import problems
from tests.audit.conftest import decide
from tests.audit.damage import KINDS, damage, stored
from tests.conftest import Harness

ev = audit_events.c


async def _seed(h: Harness, tenant: str) -> dict[int, bytes]:
    runtime = await h.headers(tenant, "runtime")
    for amount in (5000, 150000, 250000, 5000, 5000):
        await decide(h, runtime, amount)
    return await stored(h, tenant)


def _target(rows: dict[int, bytes], kind: str) -> int:
    """An event past the first few whose damage by ``kind`` is meaningful: one stored in
    form 4 (a head: its tail goes too) for every kind."""
    return next(s for s in sorted(rows) if s > 2 and rows[s][0] == event_row.V4_PAIR)


@pytest.mark.parametrize("kind", KINDS)
async def test_every_damage_is_one_exception_type_and_lenient_reads_the_rest(
        harness: Harness, tenant: str, kind: str) -> None:
    rows = await _seed(harness, tenant)
    seq = _target(rows, kind)
    hit = await damage(harness, tenant, seq, kind)
    left = [s for s in sorted(rows) if s not in hit]
    # the column as is: the first unreadable row fails the result, with EventUnreadable
    # (garbled text decodes: it is document() that refuses it)
    if kind != "text_garbled":
        with pytest.raises(event_row.EventUnreadable):
            async with harness.db.read() as conn:
                (await conn.execute(select(ev.body).where(ev.tenant == tenant))).all()
    # lenient: every row comes back, the damaged ones as markers
    async with harness.db.read() as conn:
        got = (await conn.execute(select(ev.seq, event_row.lenient(ev.body), ev.hash).where(
            ev.tenant == tenant).order_by(ev.seq))).all()
    readable = {}
    for row in got:
        try:
            readable[int(row.seq)] = event_row.document(row.body, tenant=tenant,
                                                        seq=int(row.seq), digest=row.hash)
        except event_row.EventUnreadable as exc:
            assert int(row.seq) in hit and exc.seq == int(row.seq) and exc.tenant == tenant
    assert sorted(readable) == left
    assert all(body["seq"] == s for s, body in readable.items())


async def test_texts_in_order_marks_what_does_not_read(harness: Harness, tenant: str) -> None:
    rows = await _seed(harness, tenant)
    seq = _target(rows, "frame_damaged")
    await damage(harness, tenant, seq, "frame_damaged")
    rows = await stored(harness, tenant)
    async with harness.db.read() as conn:
        hashes = dict((await conn.execute(select(ev.seq, ev.hash).where(
            ev.tenant == tenant))).all())
    texts = event_row.texts_in_order([(s, rows[s], hashes[s]) for s in sorted(rows)])
    marks = {s: t for s, t in zip(sorted(rows), texts, strict=True)
             if isinstance(t, event_row.Unreadable)}
    assert sorted(marks) == [seq, seq + 1]
    assert all(m.error.seq == s for s, m in marks.items())
    assert all(hash_bytes(t.encode()) == hashes[s]
               for s, t in zip(sorted(rows), texts, strict=True) if s not in marks)


@settings(max_examples=200, deadline=None)
@given(junk=st.binary(max_size=64), lead=st.sampled_from([1, 4, 6]))
def test_damaged_stored_bytes_never_raise_anything_else(junk: bytes, lead: int) -> None:
    """Whatever bytes a row holds, the readers' decoders give a text or EventUnreadable
    (never a zstd, Unicode or index error, nor the MemoryError of a header claiming
    petabytes: see the next test)."""
    for reader in (lambda b: event_row.text_with(b, None, None),
                   lambda b: event_row.text_of(bytes([0x1F, 0]) + b)):
        try:
            text = reader(bytes([lead]) + junk)
        except event_row.EventUnreadable:
            continue
        try:
            event_row.document(text)
        except event_row.EventUnreadable:
            pass


@pytest.mark.parametrize("lead", [1, 4, 6])
def test_a_frame_header_claiming_petabytes_does_not_read(lead: int) -> None:
    """A damaged frame header declaring 2**56 bytes (which zstd tries to allocate)."""
    frame = b"\xc0" + b"\x00" * 8 + b"\x01"  # single segment, 8-byte content size
    data = bytes([lead]) + (b"\x28\xb5\x2f\xfd" if lead == 1 else b"") + frame
    with pytest.raises(event_row.EventUnreadable, match="more bytes than can be allocated"):
        event_row.text_with(data, "sha256:" + "0" * 64, None)
    if lead == 1:
        with pytest.raises(event_row.EventUnreadable, match="more bytes than"):
            event_row.text_of(data)


def test_document_refuses_what_is_no_event_body() -> None:
    body = {"seq": 3, "actor": {"subject": "a"}}
    text = json.dumps(body)
    assert event_row.document(text, digest=hash_bytes(text.encode())) == body
    for bad in ("{not json", "[1, 2]", "", "null"):
        with pytest.raises(event_row.EventUnreadable):
            event_row.document(bad)
    with pytest.raises(event_row.EventUnreadable, match="does not hash"):
        event_row.document(text, digest=hash_bytes(b"something else"))
    with pytest.raises(event_row.EventUnreadable):
        event_row.document(event_row.Unreadable(event_row.EventUnreadable("gone")))
    # a form 1 frame that does not decompress, a text that is not UTF-8
    with pytest.raises(event_row.EventUnreadable):
        event_row.text_of(b"\x01" + b"\xff" * 10)
    with pytest.raises(event_row.EventUnreadable):
        event_row.text_of(compressed.compress(b"\xff\xfe"))
    # a form 4-6 value read without EventRead is a reader's bug, not damage
    with pytest.raises(ValueError) as raised:
        event_row.text_of(b"\x06abc")
    assert not isinstance(raised.value, event_row.EventUnreadable)


def test_a_lenient_read_is_cached_apart_from_another_type() -> None:
    """The statement cache must not hand a lenient select the result processors of the
    same SQL selected with another type (a label's cache key leaves its type out)."""
    from cosigner.db.driver_types import RawBlob

    raw = event_row.EventRead(ev.body, ev.tenant, ev.seq, RawBlob()).label("body")
    first, again, other = (select(column)._generate_cache_key() for column in (
        event_row.lenient(ev.body), event_row.lenient(ev.body), raw))
    assert first == again and first != other


def test_lenient_refuses_a_column_of_no_table() -> None:
    with pytest.raises(ValueError):
        event_row.lenient(select(ev.body).subquery().c.body.label("x"))


def test_the_problem_names_the_fault_and_no_internals() -> None:
    """Where nobody catches it: a 500 with its own stable code and a fixed detail (the
    decoder's reason, which may quote stored bytes, goes to the log only)."""
    exc = event_row.EventUnreadable("damaged compressed column: Unknown frame descriptor "
                                    "sha256:0123", tenant="t", seq=7)
    assert isinstance(exc, IntegrityFault) and isinstance(exc, ValueError)
    response = problems.to_response(exc)
    doc = json.loads(bytes(response.body))
    assert response.status_code == 500
    assert doc["code"] == "audit_event_unreadable" and doc["status"] == 500
    assert doc["type"].endswith("/audit_event_unreadable")
    for internal in ("sha256", "frame", "compressed", "Unknown", "t/7"):
        assert internal not in json.dumps(doc), internal
    assert "t/7" in str(exc) and "Unknown frame" in str(exc)  # the log's text
