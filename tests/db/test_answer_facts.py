"""Allow answers stored as the facts they are built from (stored form 8,
:mod:`cosigner.db.answer_facts`, migration 0026_s14store_answer_facts): an answer is stored
in form 8 only when it reads back byte for byte, anything else falls back to form 7, and
the migration rewrites rows up, down and up again on both databases."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from cosigner.db import answer_facts, compressed, response_row
from cosigner.db.migrate import alembic_config, upgrade
from cosigner.db.tables import decisions
from cosigner.permits import tokens
from cosigner.permits.tokens import PermitClaims, PolicyRef
from tests.db.test_migrate import empty_database  # noqa: F401 - fixture

DECISION = "01a24289-09bd-71c2-8064-52c3fd4e8e87"
ARGS = "sha256:" + "85" * 32
REVISION = "sha256:" + "df" * 32
RUN = "run-r0x9030-5"
KID = "3rVv09h39dpR9lymsqFYdBzGaH14e_JqO64zHt9CalI"
JTI = "01a2428909bd71c2806452c4529046f6"
#: As random as a real Ed25519 signature (zstd makes nothing of it).
SIGNATURE = hashlib.sha512(b"permit").digest()
REASONS = [{"code": "within_auto_limit", "message": "refund within the automatic limit"}]


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def minted(*, decision: str = DECISION, request: str = "req-1", args: str = ARGS,
           revision: str = REVISION, run: str = RUN, iss: str = "cosigner",
           aud: str = "cosigner-executor", kid: str = KID, tenant: str = "bench",
           tool: str = "issue_refund", jti: str = JTI, iat: int = 1_796_412_606,
           ttl: int = 86_400, reasons: Any = REASONS, policy_id: str = "refunds",
           version: str = "1.0.0", signature: bytes = SIGNATURE, alg: str = "Ed25519",
           standing_id: str | None = None, effect: str = "allow"
           ) -> tuple[dict[str, Any], tuple[bytes, bytes, bytes, bytes], tuple[str, ...]]:
    """``(answer, its response_parts, its row's reference texts)`` as the allow path builds
    them: the claims by :meth:`PermitClaims.to_json`, the header as the keyring spells it,
    the answer in DecisionPlan's key order."""
    policy = {"id": policy_id, "version": version, "revision": revision}
    claims = orjson.dumps(PermitClaims(
        iss, aud, jti, iat, iat, iat + ttl, tenant, run, decision, None, tool, args,
        PolicyRef(**policy), (), False, standing_id).to_json())
    header = orjson.dumps({"alg": alg, "kid": kid, "typ": tokens.PERMIT_TYP})
    token = ".".join(b64url(raw) for raw in (header, claims, signature))
    expires = datetime.fromtimestamp(iat + ttl, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    value = {"decision_id": decision, "request_id": request, "effect": effect,
             "reasons": reasons, "policy": policy, "args_hash": args,
             "permit": {"token": token, "jti": jti, "expires_at": expires},
             "approval": None}
    parts = compressed.response_parts(value)
    assert parts is not None
    return value, parts, (decision, request, args, revision, run)


def test_the_typ_is_the_permits() -> None:
    assert answer_facts.PERMIT_TYP == tokens.PERMIT_TYP


def test_the_usual_issuer_and_audience_take_a_byte_each() -> None:
    """The format's own spellings (today's settings defaults) are one byte each in the
    row; any other issuer or audience is spelled out, and both read back."""
    from cosigner.core.settings import Settings

    defaults = Settings.model_fields
    assert (defaults["issuer"].default, defaults["audience"].default) == (
        answer_facts.SPELLED[0], answer_facts.SPELLED[1])
    usual, parts, refs = minted()
    other, other_parts, other_refs = minted(iss="https://pdp.example", aud="tools")
    short = answer_facts.pack(usual, parts, refs)
    long_ = answer_facts.pack(other, other_parts, other_refs)
    assert short is not None and long_ is not None
    assert b"cosigner-executor" not in short and b"https://pdp.example" in long_
    assert len(long_) - len(short) == len("https://pdp.example") + len("tools")
    assert answer_facts.parts_of(short, refs) == parts
    assert answer_facts.parts_of(long_, other_refs) == other_parts
    # A spelling byte where the format has no spelling (the kid's place) is damage.
    at = 1 + 1 + 1  # prefix, issuer and audience as spelled
    with pytest.raises(ValueError):
        answer_facts.parts_of(short[:at] + b"\xff" + short[at + 1 + len(KID):], refs)


def test_the_allow_path_answer_is_form_8_and_reads_back() -> None:
    value, parts, refs = minted()
    stored = response_row.bind(value, refs)
    assert stored is not None and stored[0] == compressed.V8_FACTS
    assert answer_facts.parts_of(stored, refs) == parts
    assert orjson.dumps(response_row.unpack(stored, refs)) == orjson.dumps(value)
    read = compressed.ResponseJSON().process_result_value(stored, None)  # type: ignore[arg-type]
    assert isinstance(read, compressed.RowBound)  # not a mapping without its row
    assert orjson.dumps(response_row.resolve(read, refs)) == orjson.dumps(value)
    for fact in (value["permit"]["token"].encode(), DECISION.encode(), ARGS.encode(),
                 REVISION.encode(), RUN.encode(), b"req-1", JTI.encode()):
        assert fact not in stored  # the row's texts, the token and the hex jti: not stored
    assert len(stored) < len(response_row.pack_form_7(value, refs) or b"")


TEXT = st.text(max_size=30) | st.text(min_size=250, max_size=300) | st.sampled_from(
    ["", "é", "\u2028", "\U0001f600", "a\x00b", '"', "\\"])


@settings(max_examples=400, deadline=None)
@given(iss=TEXT, aud=TEXT, kid=TEXT, tenant=TEXT, tool=TEXT, policy_id=TEXT, version=TEXT,
       run=TEXT, request=TEXT,
       jti=st.sampled_from([JTI, JTI.upper(), JTI[:-1], "j", "0" * 32 + "0"]),
       iat=st.sampled_from([0, 1_796_412_606, -1, 2**40, 2**63 - 1]),
       ttl=st.sampled_from([1, 86_400, 0, -5, 2**32]),
       reasons=st.sampled_from([REASONS, [], [{"code": "x" * 70_000}], None, "r",
                                [{"code": "é", "n": 1.5}]]),
       alg=st.sampled_from(["Ed25519", "EdDSA"]),
       standing=st.none() | st.just("standing-1"),
       effect=st.sampled_from(["allow", "deny"]))
def test_form_8_is_exact_or_not_used(iss: str, aud: str, kid: str, tenant: str, tool: str,
                                     policy_id: str, version: str, run: str, request: str,
                                     jti: str, iat: int, ttl: int, reasons: Any, alg: str,
                                     standing: str | None, effect: str) -> None:
    try:
        value, parts, refs = minted(iss=iss, aud=aud, kid=kid, tenant=tenant, tool=tool,
                                    policy_id=policy_id, version=version, run=run,
                                    request=request, jti=jti, iat=iat, ttl=ttl,
                                    reasons=reasons, alg=alg, standing_id=standing,
                                    effect=effect)
    except (OverflowError, ValueError, OSError):
        return  # a date no answer can hold
    packed = answer_facts.pack(value, parts, refs)
    if packed is not None:
        assert answer_facts.parts_of(packed, refs) == parts
    stored = response_row.bind(value, refs)
    assert stored is not None
    back = (response_row.unpack(stored, refs) if stored[0] in compressed.ROW_FORMS
            else compressed.ResponseJSON().process_result_value(stored, None))  # type: ignore[arg-type]
    assert orjson.dumps(back) == orjson.dumps(value)
    fits = (jti == JTI and alg == "Ed25519" and standing is None and effect == "allow"
            and 0 <= ttl < 2**32 and iat + ttl < 253_402_300_800
            and all(len(t.encode()) < 255 or t in ("cosigner", "cosigner-executor")
                    for t in (iss, aud, kid, tenant, tool, policy_id, version))
            and len(orjson.dumps(reasons)) < 2**16)
    assert (packed is not None) == fits


@pytest.mark.parametrize("change", [
    lambda v: v.update(approval={"status": "pending"}),
    lambda v: v.update(mode="shadow"),
    lambda v: v["permit"].update(expires_at="2026-12-05T19:30:06+00:00"),
    lambda v: v["permit"].update(jti="01a2428909bd71c2806452c4529046f7"),
    lambda v: v["policy"].update(extra="1"),
    lambda v: v.update(request_id="req-other"),
    lambda v: v.pop("approval"),
])
def test_an_answer_off_the_template_is_form_7(change: Any) -> None:
    value, _, refs = minted()
    change(value)
    parts = compressed.response_parts(value)
    assert parts is not None
    assert answer_facts.pack(value, parts, refs) is None
    stored = response_row.bind(value, refs)
    assert stored is not None and stored[0] == compressed.V7_ROW_BARE
    assert orjson.dumps(response_row.unpack(stored, refs)) == orjson.dumps(value)


@pytest.mark.parametrize("claims", [
    {"nbf": 1}, {"approvers": [{"id": "a"}]}, {"approval_id": "ap-1"}, {"break_glass": True},
])
def test_claims_off_the_template_are_form_7(claims: dict[str, Any]) -> None:
    value, (answer, header, stated, signature), refs = minted()
    altered = orjson.dumps({**orjson.loads(stated), **claims})
    value["permit"]["token"] = ".".join(b64url(raw) for raw in (header, altered, signature))
    parts = compressed.response_parts(value)
    assert parts is not None and parts[2] == altered
    assert answer_facts.pack(value, parts, refs) is None
    stored = response_row.bind(value, refs)
    assert stored is not None and stored[0] == compressed.V7_ROW_BARE


def test_damaged_or_unrooted_form_8_is_a_value_error() -> None:
    value, _, refs = minted()
    stored = response_row.bind(value, refs)
    assert stored is not None and stored[0] == compressed.V8_FACTS
    for damaged in (stored[:-1], stored + b"\x00", stored[:40], stored[:1],
                    stored[:1] + b"\xfe" + stored[2:], b"\x07" + stored[1:]):
        with pytest.raises(ValueError):
            answer_facts.parts_of(damaged, refs)
    with pytest.raises(ValueError):  # a reader without the row's run id
        response_row.unpack(stored, (*refs[:4], None))
    with pytest.raises(ValueError):
        compressed.decompress(stored)  # read only with its row


def _to(connection: Any, url: str, revision: str, down: bool = False) -> None:
    cfg = alembic_config(url)
    cfg.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(cfg, revision)


async def test_0026_up_down_and_up_again(empty_database: str) -> None:  # noqa: F811
    """Form 7 allow answers become form 8 on upgrade and form 7 again on downgrade; an answer
    off the template and a damaged value stay as they are; every answer reads the same."""
    url = empty_database
    engine = create_async_engine(url)
    ids = [f"01a242a9-09bd-71c2-8064-52c3fd4e8e{i:02x}" for i in range(4)]
    values = {key: minted(decision=key, request=f"req-{i}")[0] for i, key in enumerate(ids)}
    values[ids[1]]["approval"] = {"status": "pending"}  # off the template: form 7 for good
    damaged = bytes([compressed.V7_ROW_BARE]) + b"\xc0" + b"\x00" * 8 + b"\x01"
    refs = {key: (key, f"req-{i}", ARGS, REVISION, RUN) for i, key in enumerate(ids)}
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0025_s13_permit_token_digest")
            await conn.execute(decisions.insert(), [
                {"id": key, "tenant": "t-s14f", "request_id": f"req-{i}",
                 "request_hash": ARGS, "run_id": RUN, "tool": "issue_refund",
                 "args_hash": ARGS, "effect": "allow", "caller": "c", "policy_id": "refunds",
                 "policy_version": "1.0.0", "policy_revision": REVISION,
                 "response": {"placeholder": True}, "created_at": datetime(2026, 12, 4)}
                for i, key in enumerate(ids)])
            for key in ids:  # form 7, as the code of 0024-0025 wrote allow answers
                form_7 = damaged if key == ids[3] else response_row.pack_form_7(
                    values[key], refs[key])
                assert form_7 is not None and form_7[0] == compressed.V7_ROW_BARE
                await conn.execute(decisions.update().where(decisions.c.id == key).values(
                    response=text(":v").bindparams(v=form_7)))

        async def stored() -> dict[str, bytes]:
            async with engine.connect() as conn:
                rows = (await conn.execute(select(decisions.c.id, text("response")).where(
                    decisions.c.tenant == "t-s14f"))).all()
            return {key: bytes(value) for key, value in rows}

        async def answers() -> dict[str, bytes]:
            async with engine.connect() as conn:
                rows = (await conn.execute(select(
                    decisions.c.id, *response_row_columns()).where(
                        decisions.c.tenant == "t-s14f", decisions.c.id != ids[3]))).all()
            return {row.id: orjson.dumps(response_row.answer(row)) for row in rows}

        expected = {key: orjson.dumps(values[key]) for key in ids[:3]}
        before = await stored()
        assert await answers() == expected
        await upgrade(url)
        up = await stored()
        assert [up[key][0] for key in ids[:3]] == [8, 7, 8] and up[ids[3]] == damaged
        assert up[ids[1]] == before[ids[1]]
        assert await answers() == expected
        async with engine.begin() as conn:
            await conn.run_sync(_to, url, "0025_s13_permit_token_digest", True)
        down = await stored()
        assert down == before  # form 7 is deterministic: the very bytes 0024-0025 wrote
        await upgrade(url)
        assert await stored() == up and await answers() == expected
    finally:
        await engine.dispose()
        await asyncio.sleep(0)


def response_row_columns() -> tuple[Any, ...]:
    from cosigner.db.tables import DECISION_ANSWER
    return DECISION_ANSWER
