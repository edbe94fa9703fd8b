"""The raw inserts' column encoders give exactly what SQLAlchemy's bind processing gives.

:mod:`cosigner.db.row_encoders` replaces SQLAlchemy's per-value processor chain on the
group commit's inserts; every stored byte must stay the same. Checked on both dialects'
processors (no database needed) for every column of every table, with values of the
column's kind and values beside it (``None``, other types, repeats, equal instants in
other zones); and through a database, rows written by the raw path and by SQLAlchemy
Core read back byte for byte alike. ``digest.pack`` and the token re-spelling check of
``compressed.pack_response`` are checked against their previous implementations.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import JSON, Boolean, Column, DateTime, LargeBinary, Table, text
from sqlalchemy.engine import Dialect

from cosigner.db import compressed, digest, event_row, response_row, sqlite_compact
from cosigner.db.database import Database
from cosigner.db.raw_insert import insert_many
from cosigner.db.row_encoders import column_encoder, table_encoders
from cosigner.db.tables import audit_events, decisions, metadata, permits
from cosigner.db.tables_approvals import call_inputs

DIALECTS = {name: Database(url).engine.dialect for name, url in (
    ("sqlite", "sqlite+aiosqlite:////tmp/never-opened.db"),
    ("postgresql", "postgresql+asyncpg://nobody@127.0.0.1:1/never"))}

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
ZONES = st.none() | st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)),
                                     timezone(timedelta(hours=-8)),
                                     timezone(timedelta(seconds=-3661))])
DATETIMES = st.builds(lambda moment, zone: moment.replace(tzinfo=zone),
                      st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
                      ZONES)
DIGESTS = (st.binary(min_size=32, max_size=32).map(lambda raw: "sha256:" + raw.hex())
           | st.binary(min_size=32, max_size=32).map(lambda raw: "sha256:" + raw.hex().upper())
           | st.text(max_size=80)
           | st.text(alphabet="0123456789abcdefABCDEF \n", min_size=60, max_size=66).map(
               lambda tail: "sha256:" + tail))
IDS = (st.uuids().map(str) | st.uuids().map(lambda u: u.hex)
       | st.uuids().map(lambda u: str(u).upper()) | st.text(max_size=40))


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


SEGMENTS = (st.binary(max_size=90).map(b64url)
            | st.text(alphabet="ABCDEFabcdef0123456789-_+/=$é", max_size=12))
TOKENS = st.lists(SEGMENTS, min_size=2, max_size=4).map(".".join)
RESPONSES = st.builds(lambda token, extra: {"effect": "allow", **extra,
                                            "permit": {"token": token, "jti": "j"}},
                      TOKENS | st.integers(), st.dictionaries(st.text(max_size=5), JSON_VALUES,
                                                              max_size=3))


def values_for(column: Column[Any]) -> st.SearchStrategy[Any] | None:
    """Values of ``column``'s kind and beside it, or ``None`` for a column SQLAlchemy
    passes through (no processor on either dialect)."""
    kind = type(column.type)
    if kind is digest.Sha256Digest:
        found: st.SearchStrategy[Any] = DIGESTS
    elif kind is compressed.CompressedText:
        found = st.text(max_size=200)
    elif kind is event_row.EventBody:  # a stored form as the chain packed it, or a text
        found = st.binary(max_size=60) | st.text(max_size=200)
    elif kind is compressed.ResponseJSON:
        found = RESPONSES | JSON_VALUES
    elif kind is compressed.CompressedJSON or isinstance(column.type, JSON):
        found = JSON_VALUES
    elif kind is sqlite_compact.UuidText or kind is sqlite_compact.HexId:
        found = IDS
    elif isinstance(column.type, DateTime) or kind is sqlite_compact.Instant:
        found = DATETIMES | st.dates(min_value=date(1, 1, 2))
    else:
        return None
    return found | st.none()


def columns_with_values() -> list[tuple[str, Table, Column[Any]]]:
    """One column of every column type (as declared) in the schema, on each dialect."""
    kinds: dict[tuple[str, str], tuple[str, Table, Column[Any]]] = {}
    for dialect in DIALECTS:
        for table in metadata.sorted_tables:
            for column in table.columns:
                if values_for(column) is not None:
                    kinds.setdefault((dialect, repr(column.type)), (dialect, table, column))
    return list(kinds.values())


def sqlalchemy_bind(dialect: Dialect, column: Column[Any], value: Any) -> Any:
    process = column.type.dialect_impl(dialect).bind_processor(dialect)
    return value if process is None else process(value)


@pytest.mark.parametrize(("dialect", "table", "column"), columns_with_values(),
                         ids=lambda x: getattr(x, "name", x))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_encoder_gives_what_sqlalchemy_binds(dialect: str, table: Table,
                                                   column: Column[Any],
                                                   data: st.DataObject) -> None:
    kind = values_for(column)
    assert kind is not None
    values = data.draw(st.lists(kind, max_size=6))
    if values:  # repeats, as one batch's rows share instants and hashes
        values += data.draw(st.lists(st.sampled_from(values), max_size=4))
    # The same instants elsewhere: equal datetimes, other wall-clock fields.
    values += [value.astimezone(timezone(timedelta(hours=3))) for value in values
               if isinstance(value, datetime) and value.tzinfo is not None]
    encode = column_encoder(DIALECTS[dialect], column)
    expected = [sqlalchemy_bind(DIALECTS[dialect], column, value) for value in values]
    assert (values if encode is None else encode(values)) == expected


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_equal_instants_in_other_zones_keep_their_own_wall_clock(dialect: str) -> None:
    noon = datetime(2026, 12, 1, 12, 0, 0, 7, tzinfo=UTC)
    same = [noon, noon.astimezone(timezone(timedelta(hours=1))), noon.replace(tzinfo=None),
            noon, date(2026, 12, 1)]
    column = decisions.c.created_at
    encode = column_encoder(DIALECTS[dialect], column)
    expected = [sqlalchemy_bind(DIALECTS[dialect], column, value) for value in same]
    assert (same if encode is None else encode(same)) == expected


def expected_row(dialect: Dialect, table: Table, keys: tuple[str, ...],
                 row: dict[str, Any]) -> tuple[Any, ...]:
    """What SQLAlchemy binds for ``row``, column by column (``decisions.response`` beside
    its reference columns: stored form 3 where it applies, :mod:`cosigner.db.response_row`)."""
    out = []
    for key in keys:
        if table is decisions and key == "response" and all(
                name in keys for name in response_row.REF_COLUMNS):
            out.append(response_row.bind(row[key], tuple(
                row[name] for name in response_row.REF_COLUMNS)))
        else:
            out.append(sqlalchemy_bind(dialect, table.columns[key], row[key]))
    return tuple(out)


def plain_values(column: Column[Any], other: st.SearchStrategy[Any]
                 ) -> st.SearchStrategy[Any]:
    """Values of a column :func:`values_for` leaves out (SQLAlchemy's processors refuse
    a value of another kind: Boolean, LargeBinary)."""
    if isinstance(column.type, Boolean):
        return st.none() | st.booleans()
    if isinstance(column.type, LargeBinary):
        return st.none() | st.binary(max_size=20)
    return other


TABLES = [(dialect, table) for dialect in DIALECTS for table in metadata.sorted_tables]


@pytest.mark.parametrize(("dialect", "table"), TABLES, ids=lambda x: getattr(x, "name", x))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_table_encoders_give_what_sqlalchemy_binds_row_by_row(
        dialect: str, table: Table, data: st.DataObject) -> None:
    """The generated encoders of every table (a subset of its columns, in any order):
    each row is what SQLAlchemy binds column by column, and the columns are the rows
    laid out by column."""
    names = [c.name for c in table.columns]
    keys = tuple(data.draw(st.permutations(names)))[:data.draw(
        st.integers(1, len(names)))]
    if table is decisions and data.draw(st.booleans()):  # the form 3 response with its refs
        keys = tuple(dict.fromkeys((*keys, "response", *response_row.REF_COLUMNS)))
    other = st.none() | st.integers() | st.text(max_size=10)
    found = {key: values_for(table.columns[key]) for key in keys}
    kinds = {key: kind if kind is not None else plain_values(table.columns[key], other)
             for key, kind in found.items()}
    rows = data.draw(st.lists(st.fixed_dictionaries(kinds), max_size=5))
    if rows:  # repeats, as one batch's rows share ids, instants and hashes
        rows += data.draw(st.lists(st.sampled_from(rows), max_size=3))
    engine_dialect = DIALECTS[dialect]
    encoders = table_encoders(engine_dialect, table, keys)
    expected = [expected_row(engine_dialect, table, keys, row) for row in rows]
    assert encoders.rows(rows) == expected
    assert [encoders.row(row) for row in rows] == expected


# -- against the previous implementations ------------------------------------------------

_HEX = frozenset("0123456789abcdef")


def previous_pack(value: str) -> bytes:
    if len(value) == 71 and value.startswith("sha256:") and _HEX.issuperset(value[7:]):
        return bytes.fromhex(value[7:])
    raw = b"\x00" + value.encode()
    return raw if len(raw) != 32 else b"\x01\x01" + value.encode()


@settings(max_examples=500, deadline=None)
@given(value=DIGESTS)
def test_digest_pack_is_the_previous_pack(value: str) -> None:
    assert digest.pack(value) == previous_pack(value)


def previous_segments(token: str) -> list[bytes] | None:
    parts = token.split(".")
    try:
        decoded = [base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)) for part in parts]
    except (ValueError, binascii.Error):
        return None
    if [b64url(raw) for raw in decoded] != parts:
        return None
    return decoded


@settings(max_examples=500, deadline=None)
@given(token=TOKENS)
def test_token_segments_are_read_as_before(token: str) -> None:
    segments = [compressed._b64url_exact(part) for part in token.split(".")]
    assert (None if None in segments else segments) == previous_segments(token)


# -- through the database ----------------------------------------------------------------

AT = datetime(2026, 12, 1, 5, 0, 0, 123456, tzinfo=UTC)
TOKEN = ".".join(b64url(raw) for raw in (b'{"alg":"EdDSA"}', b'{"jti":"j"}', b"\x01" * 64))


def hot_rows(tenant: str, tag: str) -> list[tuple[Table, list[dict[str, Any]]]]:
    """A decision's rows in the shapes the batch writes, with edge values."""
    ids = [f"{tenant}-{tag}-{i}" for i in range(2)]
    return [
        (decisions, [{"id": ident, "tenant": tenant, "request_id": ident,
                      "request_hash": "sha256:" + "ab" * 32, "run_id": "run", "tool": "t",
                      "args_hash": ["sha256:" + "AB" * 32, "x"][i], "effect": "allow",
                      "caller": "c", "policy_id": None, "policy_version": None,
                      "policy_revision": None if i else "sha256:" + "0" * 64,
                      "response": {"permit": {"token": TOKEN if i else "a.b"}, "n": 2**70},
                      "created_at": [AT, AT.astimezone(timezone(timedelta(hours=2)))][i]}
                     for i, ident in enumerate(ids)]),
        (permits, [{"jti": ident, "tenant": tenant, "decision_id": ident, "approval_id": None,
                    "run_id": "run", "tool": "t", "args_hash": "sha256:" + "cd" * 32,
                    "status": "issued", "issued_at": AT.replace(tzinfo=None),
                    "expires_at": AT + timedelta(days=1), "redeemed_at": None,
                    "revoked_at": None} for ident in ids]),
        (call_inputs, [{"decision_id": ident, "tenant": tenant, "input": {"args": {"é": i}},
                        "mask": ["/a"] if i else []} for i, ident in enumerate(ids)]),
        (audit_events, [{"tenant": f"{tenant}-{tag}", "seq": i + 1, "type": "x", "time": AT,
                         "decision_id": ident, "approval_id": None, "permit_jti": None,
                         "run_id": "run", "tool": "t", "effect": None, "principal": None,
                         "policy_id": None, "policy_version": None, "mode": None,
                         "body": '{"é":"✓"}', "hash": "sha256:" + "ef" * 32}
                        for i, ident in enumerate(ids)]),
    ]


async def stored(db: Database, table: Table, key: str, prefix: str) -> list[tuple[Any, ...]]:
    column = "tenant" if table is audit_events else key
    async with db.read() as conn:
        rows = (await conn.execute(text(f"SELECT * FROM {table.name} ORDER BY {key}"))).all()

    rows = [row for row in rows if str(text_of(row._mapping[column])).startswith(prefix)]
    names = [c.name for c in table.columns if c.name not in ("id", key, "tenant",
                                                               "decision_id", "request_id",
                                                               "jti")]
    out = [tuple(bytes(row._mapping[n]) if isinstance(row._mapping[n], memoryview)
                 else row._mapping[n] for n in names) for row in rows]
    if table is decisions:  # the raw path stores form 3 (0022), 7 (0024): compare answers
        at = names.index("response")
        out = [(*values[:at], _answer(row, values[at]), *values[at + 1:])
               for row, values in zip(rows, out, strict=True)]
    return out


def _answer(row: Any, stored: Any) -> tuple[int, bytes]:
    """(stored form, the answer read with its row's texts)."""
    data = stored.encode() if isinstance(stored, str) else bytes(stored)
    refs = tuple(None if v is None else text_of(v) for v in (
        row._mapping["id"], row._mapping["request_id"]))
    hashes = tuple(None if v is None else digest.unpack(v) for v in (
        row._mapping["args_hash"], row._mapping["policy_revision"]))
    value = (response_row.unpack(data, (*refs, *hashes, row._mapping["run_id"]))
             if data[0] in compressed.ROW_FORMS
             else compressed.ResponseJSON().process_result_value(data, None))  # type: ignore[arg-type]
    return min(data[0], 2), json.dumps(value, sort_keys=True).encode()


def text_of(value: Any) -> Any:
    """An id as read from SQLite (packed since 0021) or PostgreSQL."""
    return sqlite_compact.unpack_uuid(value) if isinstance(value, bytes | memoryview) else value


async def test_raw_rows_read_back_as_core_rows(database_url: str, tenant: str) -> None:
    db = Database(database_url)
    try:
        async with db.transaction() as conn:
            for table, rows in hot_rows(tenant, "raw"):
                await insert_many(conn, table, rows)  # the raw driver on SQLite files
            for table, rows in hot_rows(tenant, "core"):
                await conn.execute(table.insert(), rows)  # SQLAlchemy Core
        for table, key in ((decisions, "id"), (permits, "jti"),
                           (call_inputs, "decision_id"), (audit_events, "seq")):
            raw = await stored(db, table, key, f"{tenant}-raw")
            core = await stored(db, table, key, f"{tenant}-core")
            assert raw == core and len(raw) == 2
    finally:
        await db.dispose()


def test_the_shared_packings_stay_bounded_and_exact() -> None:
    """A batch's repeated ids are packed once (:class:`row_encoders._Memo`); the memo is
    cleared when full, never grows without bound, and gives what the packing gives."""
    from cosigner.db.row_encoders import _Memo

    memo = _Memo(sqlite_compact.pack_uuid)
    ids = [f"00000000-0000-7000-8000-{i:012x}" for i in range(_Memo.MAX + 10)]
    for ident in ids + ids[:5]:
        assert memo[ident] == sqlite_compact.pack_uuid(ident)
        assert len(memo) <= _Memo.MAX
    assert len(memo) < _Memo.MAX


class _Moment(datetime):
    """A datetime subclass (its fields are read as a datetime's)."""


#: Zones of every kind: none, fixed offsets, a region with daylight saving.
ANY_ZONES = ZONES | st.just(ZoneInfo("Europe/Berlin"))


@settings(max_examples=500, deadline=None)
@given(moment=st.datetimes(min_value=datetime(1, 1, 1),
                           max_value=datetime(9999, 12, 31, 23, 59, 59, 999999),
                           timezones=ANY_ZONES, allow_imaginary=True),
       fold=st.integers(0, 1), subclass=st.booleans(), day=st.dates())
def test_instant_micros_are_sqlite_compact_micros(moment: datetime, fold: int,
                                                  subclass: bool, day: date) -> None:
    """The encoders' instant integer is exactly :func:`sqlite_compact.micros`'s (the
    wall-clock fields whatever the zone or fold; dates; subclasses)."""
    from cosigner.db.row_encoders import _micros

    moment = moment.replace(fold=fold)
    if subclass:
        moment = _Moment(*moment.timetuple()[:6], moment.microsecond, moment.tzinfo,
                         fold=moment.fold)
    assert _micros(moment) == sqlite_compact.micros(moment)
    assert _micros(day) == sqlite_compact.micros(day)
    with pytest.raises(TypeError):
        _micros("2026-12-02 04:00:59")
