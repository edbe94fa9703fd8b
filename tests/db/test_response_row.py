"""Decision responses stored as a difference from their row (issue 20, stored form 3,
migration 0022_s7store_response_row; form 7, the same body in a bare frame compressed
harder, 0024_s12store_response_bare): read back exactly, on both databases, and the
migrations rewrite existing rows up, down and up again."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import orjson
import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from cosigner.db import compressed, response_row
from cosigner.db.migrate import alembic_config, upgrade
from cosigner.db.tables import decisions
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture

DECISION = "01a232bb-8747-71dd-9f29-1804dc82d966"
ARGS = "sha256:" + "7d" * 32
REVISION = "sha256:" + "df" * 32
RUN = "run-seed10951x1796205892-3"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def answer(decision: str, request: str, args: str, revision: str | None,
           claims: bytes | None = None, signature: bytes = b"\x9f" * 64,
           header: bytes = b'{"alg":"Ed25519","kid":"k"}', run: str = RUN) -> dict[str, Any]:
    claims = claims if claims is not None else orjson.dumps({
        "jti": "j", "decision_id": decision, "args_hash": args,
        "policy": {"revision": revision}, "request": request, "run": run})
    token = ".".join(b64url(raw) for raw in (header, claims, signature))
    return {"decision_id": decision, "request_id": request, "effect": "allow",
            "policy": {"id": "p", "version": "1", "revision": revision},
            "args_hash": args, "permit": {"token": token, "jti": "j",
                                          "expires_at": "2026-12-02T08:11:42Z"},
            "approval": None}


TEXTS = st.text(max_size=40) | st.sampled_from([DECISION, ARGS, REVISION, RUN, "r-1", "a" * 8])


@settings(max_examples=300, deadline=None)
@given(decision=TEXTS, request=TEXTS, args=TEXTS, revision=st.none() | TEXTS, run=TEXTS,
       refs=st.lists(st.none() | TEXTS, min_size=5, max_size=5),
       claims=st.none() | st.binary(max_size=200), signature=st.binary(max_size=80),
       same=st.booleans())
def test_form_3_reads_back_exactly(decision: str, request: str, args: str,
                                   revision: str | None, run: str, refs: list[str | None],
                                   claims: bytes | None, signature: bytes, same: bool) -> None:
    value = answer(decision, request, args, revision, claims, signature, run=run)
    row = (decision, request, args, revision, run) if same else tuple(refs)
    stored = response_row.bind(value, row)
    assert stored is not None
    if stored[0] in compressed.ROW_FORMS:
        assert stored[0] == compressed.V7_ROW_BARE  # what is written since 0024
        assert orjson.dumps(response_row.unpack(stored, row)) == orjson.dumps(value)
        read = compressed.ResponseJSON().process_result_value(stored, None)  # type: ignore[arg-type]
        assert isinstance(read, compressed.RowBound)  # not a mapping without its row
        assert orjson.dumps(response_row.resolve(read, row)) == orjson.dumps(value)
        with pytest.raises(ValueError):
            compressed.decompress(stored)
    else:  # a part holding 0x1A: form 2
        assert orjson.dumps(compressed.ResponseJSON().process_result_value(
            stored, None)) == orjson.dumps(value)  # type: ignore[arg-type]


def _pack_as_before(value: Any, refs: Any) -> bytes | None:
    """Form 3 as it was first written (session 7): the three parts joined by
    ``0x1A 0x00``, each text replaced by a search of its first 12 bytes, then split."""
    parts = compressed.response_parts(value)
    if parts is None:
        return None
    answer_, header, claims, signature = parts
    if b"\x1a" in answer_ or b"\x1a" in header or b"\x1a" in claims:
        return None
    usable = [(len(text_), b"\x1a" + bytes([i + 1]), text_.encode())
              for i, text_ in enumerate(refs)
              if isinstance(text_, str) and len(text_) >= 8 and text_.isprintable()]
    usable.sort(reverse=True)
    joined = b"\x1a\x00".join((answer_, header, claims))
    for _, mark, needle in usable:
        head, at, out, start = needle[:12], joined.find(needle[:12]), [], 0
        if at < 0:
            continue
        while at >= 0:
            if joined.startswith(needle, at):
                out += (joined[start:at], mark)
                start = at + len(needle)
                at = joined.find(head, start)
            else:
                at = joined.find(head, at + 1)
        out.append(joined[start:])
        joined = b"".join(out)
    answer_, header, claims = joined.split(b"\x1a\x00")
    # In form 7's frame since 0024 (the body is what was compared before).
    return bytes([compressed.V7_ROW_BARE]) + compressed.compress_bare_store(
        compressed.join_parts(answer_, header, claims, signature))


#: Texts that meet each other: prefixes and overlaps of one another, controls, DEL,
#: characters beyond ASCII (printable or not), lone surrogates.
_PIECES = ["ab", "abab", "a", "b", "\x00", "\x7f", "\x1f", " ", "é", "\u2028", "\x1a",
           "sha256:", "7d", "-"]
#: The answer's texts (JSON: no lone surrogate) and the row's (any string).
NEAR_TEXTS = st.lists(st.sampled_from(_PIECES), max_size=12).map("".join) | TEXTS
ROW_TEXTS = st.lists(st.sampled_from([*_PIECES, "\ud800"]), max_size=12).map("".join) | TEXTS


@settings(max_examples=500, deadline=None)
@given(decision=NEAR_TEXTS, request=NEAR_TEXTS, args=NEAR_TEXTS,
       revision=st.none() | NEAR_TEXTS, run=NEAR_TEXTS,
       refs=st.lists(st.none() | ROW_TEXTS, min_size=5, max_size=5),
       claims=st.none() | st.binary(max_size=120) | NEAR_TEXTS.map(str.encode),
       signature=st.binary(max_size=80), same=st.booleans(),
       header=st.binary(max_size=60) | NEAR_TEXTS.map(str.encode), zero=st.booleans())
def test_form_3_is_the_bytes_it_was(decision: str, request: str, args: str,
                                    revision: str | None, run: str, refs: list[str | None],
                                    claims: bytes | None, signature: bytes, same: bool,
                                    header: bytes, zero: bool) -> None:
    """The one-search-per-text packing stores exactly the bytes the first one stored
    (separator ``0x00``, or part by part when one holds a ``0x00``)."""
    # The header holding row texts too, with or without a 0x00 byte (parts searched
    # one by one, or joined).
    header = header + (b"\x00" if zero else b"") + decision.encode() + args.encode()
    value = answer(decision, request, args, revision, claims, signature, header, run)
    row = (decision, request, args, revision, run) if same else tuple(refs)
    assert response_row.pack(value, row) == _pack_as_before(value, row)
    stored = response_row.bind(value, row)  # and it reads back from its own row
    if same and stored is not None and stored[0] in compressed.ROW_FORMS:
        assert orjson.dumps(response_row.unpack(stored, row)) == orjson.dumps(value)


def test_the_row_texts_are_not_in_the_frame() -> None:
    value = answer(DECISION, "req-seed-1", ARGS, REVISION)
    row = (DECISION, "req-seed-1", ARGS, REVISION, RUN)
    stored = response_row.pack(value, row)
    assert stored is not None and stored[0] == compressed.V7_ROW_BARE
    frame = compressed.decompress_bare(stored[1:])
    for text_ in row:
        assert text_.encode() not in frame
    assert len(stored) < len(compressed.pack_response(value) or b"")
    assert orjson.dumps(response_row.unpack(stored, row)) == orjson.dumps(value)
    with pytest.raises(ValueError):  # a reference to a column the reader did not give
        response_row.unpack(stored, (DECISION, None, ARGS, REVISION, RUN))
    with pytest.raises(ValueError):  # form 7's run id, to a reader of form 3's four
        response_row.unpack(stored, row[:4])


def _to(connection: Any, url: str, revision: str, down: bool = False) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(cfg, revision)


async def test_upgrade_down_and_up_again_with_rows(empty_database: str) -> None:  # noqa: F811
    url = empty_database
    engine = create_async_engine(url)
    ids = [f"01a232bb-8747-71dd-9f29-1804dc82d9{i:02x}" for i in range(5)] + ["plain-id-1"]
    values = {key: answer(key, f"req-{i}", ARGS, REVISION if i % 2 else None)
              for i, key in enumerate(ids)}
    values[ids[2]] = {"decision_id": ids[2], "effect": "deny", "permit": None}  # form 1
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0021_s7store_compact_ids")
            await conn.execute(decisions.insert(), [  # Core: stored form 2 (or 1)
                {"id": key, "tenant": "t-s7r", "request_id": f"req-{i}",
                 "request_hash": ARGS, "run_id": "r", "tool": "t", "args_hash": ARGS,
                 "effect": "allow", "caller": "c", "policy_id": None, "policy_version": None,
                 "policy_revision": REVISION if i % 2 else None, "response": values[key],
                 "created_at": __import__("datetime").datetime(2026, 12, 1)}
                for i, key in enumerate(ids)])

        async def forms() -> dict[str, int]:
            async with engine.connect() as conn:
                rows = (await conn.execute(select(decisions.c.id, text("response")).where(
                    decisions.c.tenant == "t-s7r"))).all()
            return {key: bytes(stored)[0] for key, stored in rows}

        async def answers() -> dict[str, Any]:
            async with engine.connect() as conn:
                rows = (await conn.execute(select(
                    decisions.c.id, decisions.c.request_id, decisions.c.args_hash,
                    decisions.c.policy_revision, decisions.c.run_id, decisions.c.response).where(
                        decisions.c.tenant == "t-s7r"))).all()
            return {row.id: orjson.dumps(response_row.answer(row)) for row in rows}

        expected = {key: orjson.dumps(value) for key, value in values.items()}
        form_2 = {key: 1 if key == ids[2] else 2 for key in ids}
        assert await forms() == form_2 and await answers() == expected
        form_3 = {key: 1 if key == ids[2] else 3 for key in ids}
        form_7 = {key: 1 if key == ids[2] else 7 for key in ids}
        async with engine.begin() as conn:  # form 3 as 0022 wrote it before 0024 existed
            await conn.run_sync(_to, url, "0024_s12store_response_bare")
            await conn.run_sync(_to, url, "0023_s8store_event_row", True)
        assert await forms() == form_3 and await answers() == expected
        await upgrade(url)  # 0024: form 3 → 7
        assert await forms() == form_7 and await answers() == expected
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0023_s8store_event_row", True)
        assert await forms() == form_3 and await answers() == expected
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0021_s7store_compact_ids", True)
        assert await forms() == form_2 and await answers() == expected
        await upgrade(url)
        assert await forms() == form_7
        assert await answers() == expected
    finally:
        await engine.dispose()
        await asyncio.sleep(0)


async def test_0024_steps_over_a_damaged_response(empty_database: str) -> None:  # noqa: F811
    """A form 3 value whose frame does not decode (its header declares 2**56 bytes) is
    left as it is by 0024 up and down; the rows around it are rewritten."""
    url = empty_database
    engine = create_async_engine(url)
    ids = [f"01a232bb-8747-71dd-9f29-1804dc82d9{i:02x}" for i in range(3)]
    damaged = bytes([compressed.V3_ROW]) + b"\x28\xb5\x2f\xfd\xc0" + b"\x00" * 8 + b"\x01"
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0023_s8store_event_row")
            await conn.execute(decisions.insert(), [
                {"id": key, "tenant": "t-s12d", "request_id": f"req-{i}",
                 "request_hash": ARGS, "run_id": "r", "tool": "t", "args_hash": ARGS,
                 "effect": "allow", "caller": "c", "policy_id": None, "policy_version": None,
                 "policy_revision": REVISION, "response": answer(key, f"req-{i}", ARGS,
                                                                 REVISION),
                 "created_at": __import__("datetime").datetime(2026, 12, 2)}
                for i, key in enumerate(ids)])
            await conn.execute(decisions.update().where(decisions.c.id == ids[1]).values(
                response=text(":v").bindparams(v=damaged)))

        async def stored() -> dict[str, bytes]:
            async with engine.connect() as conn:
                rows = (await conn.execute(select(decisions.c.id, text("response")).where(
                    decisions.c.tenant == "t-s12d"))).all()
            return {key: bytes(value) for key, value in rows}

        before = await stored()
        assert before[ids[1]] == damaged and before[ids[0]][0] == compressed.V2_TOKEN
        await upgrade(url)  # 0024 after 0022-0023 wrote nothing in form 3 here: form 2 stays
        async with engine.begin() as conn:  # the two good rows in form 3 (as 0022 left them)
            await conn.run_sync(_to, url, "0023_s8store_event_row", True)
            for key in (ids[0], ids[2]):
                value = answer(key, f"req-{ids.index(key)}", ARGS, REVISION)
                form_3 = bytes([compressed.V3_ROW]) + compressed._LEVEL1_COMPRESSOR.compress(
                    compressed.decompress_bare(response_row.pack(
                        value, (key, f"req-{ids.index(key)}", ARGS, REVISION))[1:]))
                await conn.execute(decisions.update().where(decisions.c.id == key).values(
                    response=text(":v").bindparams(v=form_3)))
        await upgrade(url)
        after = await stored()
        assert after[ids[1]] == damaged
        assert after[ids[0]][0] == after[ids[2]][0] == compressed.V7_ROW_BARE
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0023_s8store_event_row", True)
        down = await stored()
        assert down[ids[1]] == damaged
        assert down[ids[0]][0] == down[ids[2]][0] == compressed.V3_ROW
    finally:
        await engine.dispose()
        await asyncio.sleep(0)


async def test_0024_downgrade_puts_the_run_id_back(empty_database: str) -> None:  # noqa: F811
    """Form 7 refers to the row's run_id (reference 5), which form 3's readers (the code of
    0022-0023) do not know: the downgrade writes the run id back into the frame."""
    url = empty_database
    engine = create_async_engine(url)
    key, request = DECISION, "req-run-1"
    value = answer(key, request, ARGS, REVISION)
    try:
        await upgrade(url)
        async with engine.begin() as conn:
            await conn.execute(decisions.insert(), [
                {"id": key, "tenant": "t-s12r", "request_id": request, "request_hash": ARGS,
                 "run_id": RUN, "tool": "t", "args_hash": ARGS, "effect": "allow",
                 "caller": "c", "policy_id": None, "policy_version": None,
                 "policy_revision": REVISION, "response": value,
                 "created_at": __import__("datetime").datetime(2026, 12, 2)}])
            packed = response_row.pack(value, (key, request, ARGS, REVISION, RUN))
            assert packed is not None and b"\x1a\x05" in compressed.decompress_bare(packed[1:])
            await conn.execute(decisions.update().where(decisions.c.id == key).values(
                response=text(":v").bindparams(v=packed)))

        async def stored() -> bytes:
            async with engine.connect() as conn:
                return bytes((await conn.execute(select(text("response")).select_from(
                    decisions).where(decisions.c.id == key))).scalar_one())

        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0023_s8store_event_row", True)
        down = await stored()
        assert down[0] == compressed.V3_ROW and b"\x1a\x05" not in compressed._unzstd(down)
        # Read as 0022-0023's code reads it: four references.
        assert orjson.dumps(response_row.unpack(down, (key, request, ARGS, REVISION))) == \
            orjson.dumps(value)
        await upgrade(url)
        up = await stored()
        assert up[0] == compressed.V7_ROW_BARE
        assert orjson.dumps(response_row.unpack(up, (key, request, ARGS, REVISION, RUN))) == \
            orjson.dumps(value)
    finally:
        await engine.dispose()
        await asyncio.sleep(0)
