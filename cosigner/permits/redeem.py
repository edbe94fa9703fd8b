"""Redeem: the single use of a permit, right before its call runs (invariant 4).

Checks the token (keyring signature, claims), its binding to the presented call (tenant,
tool, RFC 8785 args hash), the permit's row in the database (never the token's word, case
K10), and the currently active policy on the input recorded at decision time (a policy
tightened between approval and use stops the call); then one conditional ``UPDATE`` marks it
redeemed. Refusals are logged through :func:`refusal_writer`, one COMMIT per batch.
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import sqlite3
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import and_, bindparam, literal_column, select
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.audit.chain import Event, append
from cosigner.context import AppContext, Refusal
from cosigner.core import tracing
from cosigner.core.canonical import args_hash
from cosigner.core.clock import isoformat
from cosigner.core.errors import InvalidArgs, PermitRefused, PolicyError, Unavailable
from cosigner.core.load import Shedding
from cosigner.core.metrics import metrics
from cosigner.core.roles import BARRIER_TOOL
from cosigner.core.settings import Settings
from cosigner.db.batch import NeedsCore, RawWork, Write
from cosigner.db.database import Database
from cosigner.db.group_commit import GroupCommitter
from cosigner.db.raw_sql import RawStatement, has_raw_reader, read_connection
from cosigner.db.tables import permits as permits_table
from cosigner.db.tables_approvals import approvals, call_inputs, reviews, standing_approvals
from cosigner.identity.principals import Caller
from cosigner.permits.ledger import permit_row
from cosigner.permits.tokens import (
    PermitClaims,
    check_binding,
    stated_claims,
    token_digest,
    verify_permit_token,
)
from cosigner.policy.quorum import reviews_still_meet
from cosigner.policy.result import ApprovalRequirement, parse_requirement

_REDEEM = permits_table.update().where(
    permits_table.c.jti == bindparam("p_jti"), permits_table.c.tenant == bindparam("p_tenant"),
    permits_table.c.status == "issued").values(status="redeemed",
                                               redeemed_at=bindparam("p_at"))


_PERMIT_AND_INPUT = select(
    permits_table, call_inputs.c.input.label("call_input"),
    call_inputs.c.mask.label("call_mask"),
).select_from(permits_table.outerjoin(call_inputs, and_(
    call_inputs.c.decision_id == bindparam("decision_id"),
    call_inputs.c.tenant == permits_table.c.tenant))).where(
    permits_table.c.jti == bindparam("jti"), permits_table.c.tenant == bindparam("tenant"))


# The same read with only the columns redeem needs, for the raw driver.
_PERMIT_AND_INPUT_RAW = RawStatement(select(
    permits_table.c.status, permits_table.c.expires_at, permits_table.c.token_digest,
    call_inputs.c.input, call_inputs.c.mask,
).select_from(permits_table.outerjoin(call_inputs, and_(
    call_inputs.c.decision_id == bindparam("decision_id"),
    call_inputs.c.tenant == permits_table.c.tenant))).where(
    permits_table.c.jti == bindparam("jti"), permits_table.c.tenant == bindparam("tenant")))
_PERMIT_STATE_RAW = RawStatement(select(permits_table.c.status, permits_table.c.expires_at)
                                 .where(permits_table.c.jti == bindparam("jti"),
                                        permits_table.c.tenant == bindparam("tenant")))


_STATE_REFUSALS = {"redeemed": ("already_redeemed", "the permit was already redeemed"),
                   "revoked": ("revoked", "the permit was revoked"),
                   "expired": ("expired", "permit has expired")}


def _state_refusal(row: Any, now: datetime) -> PermitRefused | None:
    if row is None:
        return PermitRefused("no such permit was issued", code="unknown_permit")
    if row.status in _STATE_REFUSALS:
        code, text = _STATE_REFUSALS[row.status]
        return PermitRefused(text, code=code)
    expires_at = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=UTC)
    if now >= expires_at:
        return PermitRefused("permit has expired", code="expired")
    return None


async def _verify(deps: AppContext, token: str, now: datetime,
                  minted: _MintedRead | None = None) -> PermitClaims:
    """:func:`verify_permit_token`; a kid unknown here is looked up in the shared keyring
    once (another replica may have signed with a key this one has not loaded yet)."""
    settings = deps.settings
    stated = None if minted is None else minted.stated
    try:
        return verify_permit_token(deps.keyring, token, now=now, issuer=settings.issuer,
                                   audience=settings.audience, minted=minted,
                                   stated=stated)
    except PermitRefused as exc:
        if exc.code != "unknown_kid" or not await deps.keyring.refresh_for_unknown_kid():
            raise
    return verify_permit_token(deps.keyring, token, now=now, issuer=settings.issuer,
                               audience=settings.audience, minted=minted, stated=stated)


class _MintedRead:
    """The permit row's read done *before* the signature check, so the row's
    ``token_digest`` can vouch for the token (:func:`verify_permit_token`'s ``minted``):
    when the presented text is the minted token byte for byte, its signature is the one
    the server made, and libsodium's check (~45–75 µs, the largest cost of a redeem
    whose permit this process's memo does not hold: minted long ago, or by another
    replica) is skipped. On a SQLite file the row is read on the raw driver when the
    keyring asks (the memo missed); on the SQLAlchemy path (PostgreSQL) by
    :meth:`prefetch` before verification. The read, keyed by the claims the payload
    states, is kept and used after verification when the verified claims name the same
    permit (they are the same payload's)."""

    __slots__ = ("db", "key", "read", "stated", "tenant", "token")

    def __init__(self, db: Database, tenant: str, token: str) -> None:
        self.db, self.tenant, self.token = db, tenant, token
        self.key: tuple[str, str, str | None] | None = None
        self.read: _Read | None = None
        #: The payload's claims once :meth:`prefetch` parsed them (not parsed again).
        self.stated: PermitClaims | None = None

    async def prefetch(self) -> None:
        """Read the row the payload names through the SQLAlchemy path's shared reads
        (:class:`_Reads`), when the payload parses, names the caller's tenant and ids
        the database can bind (:func:`_readable`)."""
        stated = self.stated = stated_claims(self.token)
        if stated is not None and stated.tenant == self.tenant and _readable(stated):
            self.read = await _reads(self.db).read(self.tenant, stated)
            self.key = (stated.jti, stated.decision_id, stated.approval_id)

    def __call__(self, stated: PermitClaims) -> bool:
        if stated.tenant != self.tenant or not _readable(stated):
            return False  # another tenant's permit, or ids no permit has: refused after
            # the signature check, as before
        read = self.of(stated) or _read_raw(self.db, self.tenant, stated)
        if read is None:
            return False  # nothing read here: read after verification, as before
        self.key, self.read = (stated.jti, stated.decision_id, stated.approval_id), read
        row = read[0]
        return (row is not None and row.token_digest is not None
                and hmac.compare_digest(row.token_digest, token_digest(self.token)))

    def of(self, claims: PermitClaims) -> _Read | None:
        """The read kept for ``claims``' permit, or ``None``."""
        if self.key == (claims.jti, claims.decision_id, claims.approval_id):
            return self.read
        return None


def _readable(stated: PermitClaims) -> bool:
    """Whether the ids a not yet verified payload states can be looked up: ASCII without
    NUL, as every id this server mints. Other text (NUL: PostgreSQL refuses it; a lone
    surrogate: neither driver encodes it) is no permit's, and reading it would turn a
    forged token's ``bad_signature`` into a database error (503, no refusal logged)."""
    for text in (stated.jti, stated.decision_id, stated.approval_id or ""):
        if not text.isascii() or "\x00" in text:
            return False
    return True


async def redeem(deps: AppContext, caller: Caller, *, token: str, tool: str, args: dict[str, Any]
                 ) -> dict[str, Any]:
    """Redeem a permit for one exact call (:func:`_redeem`), counted and traced."""
    with tracing.span("permit.redeem") as current:
        try:
            result = await _redeem(deps, caller, token=token, tool=tool, args=args)
        except PermitRefused as exc:
            metrics().redeems[(exc.code,)].inc()
            tracing.set_attributes(current, {"cosigner.outcome": exc.code})
            raise
        metrics().redeems[("redeemed",)].inc()
        tracing.set_attributes(current, {"cosigner.outcome": "redeemed",
                                         "cosigner.decision_id": result["decision_id"]})
        return result


async def _redeem(deps: AppContext, caller: Caller, *, token: str, tool: str,
                  args: dict[str, Any]) -> dict[str, Any]:
    """Redeem a permit for one exact call, right before it runs (single use, invariant 4).

    Checks, in order: signature with the keyring key named by ``kid`` (Ed25519 only),
    ``iss``/``aud``/``exp``/``nbf`` (RFC 7519 §4.1.4: expired at ``now >= exp``); tenant
    (the caller's), tool and args hash of the presented ``args`` (RFC 8785); the permit's
    state in the server's database (never the token's word); the currently active policy
    on the recorded input; then ``UPDATE permits SET status='redeemed' WHERE jti=:jti AND
    status='issued'`` – of many concurrent redeems exactly one changes a row. Success and
    every refusal are events (``permit.redeemed`` / ``permit.refused`` with the code).
    The state change and its event go through the decision log's group committer
    (``deps.log_writer``), refusals found before it through ``deps.refusals``: one
    COMMIT per batch, and still durable before the answer or the error.

    Returns ``{status: "redeemed", jti, decision_id, approval_id, tool, args_hash,
    redeemed_at}``.

    Raises:
        PermitRefused: ``malformed_permit``, ``bad_signature``, ``unknown_kid``,
            ``wrong_token_type``, ``wrong_audience``, ``expired``, ``not_yet_valid``,
            ``tenant_mismatch``, ``tool_mismatch``, ``args_mismatch``, ``unknown_permit``,
            ``revoked``, ``already_redeemed``, ``invalid_args``, ``policy_changed``.
        InvalidJSON: the presented args cannot be hashed (422).
    """
    caller.require("runtime")
    now = deps.clock()
    now_text = isoformat(now)
    presented_hash = args_hash(args)
    claims: PermitClaims | None = None
    minted = _MintedRead(deps.db, caller.tenant, token)
    try:
        if not has_raw_reader(deps.db):
            await minted.prefetch()
        claims = await _verify(deps, token, now, minted)
        check_binding(claims, tenant=caller.tenant, tool=tool, args_hash=presented_hash)
        read = minted.of(claims) or _read_raw(deps.db, caller.tenant, claims)
        if read is None:
            read = await _reads(deps.db).read(caller.tenant, claims)
        row, stored, counted = read
        early = _state_refusal(row, now)
        if early is not None:
            raise early
        await _recheck_policy(deps, caller.tenant, claims, stored, args, counted, now,
                              now_text)
    except PermitRefused as exc:
        await _log(deps, caller.tenant,
                   _refusal_event(caller, exc, claims, tool, presented_hash), now)
        raise
    redeemed = claims
    values = {"p_jti": redeemed.jti, "p_tenant": caller.tenant, "p_at": now}

    async def work(conn: AsyncConnection) -> Write:
        # In the decision log's group commit: one COMMIT for many redeems and decisions.
        rejected = await _standing_rejection(conn, caller.tenant, redeemed)
        if rejected is not None:
            return await _revoke_rejected(conn, caller, redeemed, rejected, now)
        changed = (await conn.execute(_REDEEM, values)).rowcount
        if changed == 1:
            return _redeemed(caller, redeemed, now)
        # A concurrent redeem won (or the permit was revoked meanwhile).
        return _lost(caller, redeemed, await permit_row(conn, caller.tenant, redeemed.jti,
                                                         lock=False), now)

    def work_raw(conn: sqlite3.Connection, dialect: Dialect) -> Write:
        # The same on the batch's own sqlite3 connection (same transaction and lock), in
        # one statement for the common case: the UPDATE changes the row only when no
        # standing rejection exists (what `work` reads first); when it changed nothing,
        # the rejection is looked up as `work` does.
        call = {"tenant": caller.tenant, "run_id": redeemed.run, "tool": redeemed.tool,
                "args_hash": redeemed.args_hash}
        if _REDEEM_UNLESS_REJECTED_RAW.run(conn, dialect, {**values, **call})[1] == 1:
            return _redeemed(caller, redeemed, now)
        if _STANDING_REJECTION_RAW.run(conn, dialect, call)[0]:
            raise NeedsCore  # revoke the permit: the SQLAlchemy path does it
        rows = _PERMIT_STATE_RAW.run(conn, dialect, {"jti": redeemed.jti,
                                                     "tenant": caller.tenant})[0]
        return _lost(caller, redeemed, _PermitState(*rows[0]) if rows else None, now)

    written: Write = await deps.log_writer.submit(RawWork(work, work_raw),
                                                  key=caller.tenant)
    if isinstance(written.result, PermitRefused):
        raise written.result
    return {"status": "redeemed", "jti": claims.jti, "decision_id": claims.decision_id,
            "approval_id": claims.approval_id, "tool": claims.tool,
            "args_hash": claims.args_hash, "redeemed_at": now_text}


def _redeemed(caller: Caller, claims: PermitClaims, now: datetime) -> Write:
    return Write(caller.tenant, [_claims_event("permit.redeemed", caller, claims, {},
                                               time=now)], None)


def _lost(caller: Caller, claims: PermitClaims, row: Any, now: datetime) -> Write:
    """The refusal of a redeem whose ``UPDATE`` changed no row (``row``: the permit's
    state read after it)."""
    refusal = _state_refusal(row, now) or PermitRefused(
        "the permit was already redeemed", code="already_redeemed")
    return Write(caller.tenant, [_claims_event("permit.refused", caller, claims,
                                               {"code": refusal.code}, time=now)], refusal)


_STANDING_REJECTION = select(approvals.c.id).where(
    approvals.c.tenant == bindparam("tenant"), approvals.c.run_id == bindparam("run_id"),
    approvals.c.tool == bindparam("tool"), approvals.c.args_hash == bindparam("args_hash"),
    # A literal status, as the partial index's WHERE (cosigner.approvals.rejections:
    # ``status = ?`` made SQLite re-prepare the statement at each execution).
    approvals.c.status == literal_column("'rejected'"), approvals.c.withdrawn_at.is_(None)
).limit(1)


async def _standing_rejection(conn: AsyncConnection, tenant: str, claims: PermitClaims
                              ) -> str | None:
    """The id of a standing rejection of the permit's call (tenant, run, tool, args hash),
    read in the redeem's write transaction: a permit minted for the same call before a
    reviewer rejected it (a sibling decision, or one racing the rejection) never runs it
    (rejections stick, issue 13). One lookup in the partial index of standing
    rejections (``ix_approvals_rejected_call``)."""
    values = {"tenant": tenant, "run_id": claims.run, "tool": claims.tool,
              "args_hash": claims.args_hash}
    found = (await conn.execute(_STANDING_REJECTION, values)).scalar()
    return None if found is None else str(found)


_STANDING_REJECTION_RAW = RawStatement(_STANDING_REJECTION)
#: :data:`_REDEEM` where :data:`_STANDING_REJECTION` finds nothing, as one statement.
_REDEEM_UNLESS_REJECTED_RAW = RawStatement(_REDEEM.where(~_STANDING_REJECTION.exists()))


async def _revoke_rejected(conn: AsyncConnection, caller: Caller, claims: PermitClaims,
                           approval_id: str, now: datetime) -> Write:
    """Revoke the permit of a rejected call and refuse the redeem with ``revoked``."""
    events: list[Event] = []
    result = await conn.execute(permits_table.update().where(
        permits_table.c.jti == claims.jti, permits_table.c.tenant == caller.tenant,
        permits_table.c.status == "issued").values(status="revoked", revoked_at=now))
    if result.rowcount == 1:
        events.append(_claims_event("permit.revoked", caller, claims, {
            "reason": "rejected_by_reviewer", "rejected_approval_id": approval_id}))
    refusal = PermitRefused(f"a reviewer rejected this call in its run (approval "
                            f"{approval_id}); the permit was revoked", code="revoked")
    events.append(_claims_event("permit.refused", caller, claims, {"code": refusal.code}))
    return Write(caller.tenant, [replace(event, time=now) for event in events], refusal)


def _claims_event(kind: str, caller: Caller, claims: PermitClaims,
                  payload: dict[str, Any], time: datetime | None = None) -> Event:
    return Event(type=kind, actor=caller.actor(), decision_id=claims.decision_id,
                 approval_id=claims.approval_id, permit_jti=claims.jti, run_id=claims.run,
                 tool=claims.tool, args_hash=claims.args_hash,
                 policy={"id": claims.policy["id"], "version": claims.policy["version"],
                         "revision": claims.policy["revision"]},
                 payload=payload, time=time)


def _refusal_event(caller: Caller, exc: PermitRefused, claims: PermitClaims | None,
                   tool: str, presented_hash: str) -> Event:
    # Claims of another tenant are not linked into this tenant's log beyond the code.
    if claims is not None and claims.tenant == caller.tenant:
        return _claims_event("permit.refused", caller, claims,
                             {"code": exc.code, "presented_tool": tool,
                              "presented_args_hash": presented_hash})
    return Event(type="permit.refused", actor=caller.actor(), tool=tool,
                 args_hash=presented_hash, payload={"code": exc.code})


async def _log(deps: AppContext, tenant: str, event: Event, now: datetime) -> None:
    """Append one refusal event durably, batched through ``deps.refusals``."""
    await deps.refusals.submit((tenant, event, now), key=tenant)


def refusal_writer(db: Database, settings: Settings,
                   shedding: Shedding | None = None) -> GroupCommitter[Refusal]:
    """The group committer for refused redeems: each batch of refusal events is appended in
    one transaction, so a storm of replays or concurrent redeems costs one COMMIT per batch
    instead of one per refusal, and each refusal is still durable before its response."""

    async def run_batch(items: list[Refusal]) -> list[Any]:
        # Tenant heads are locked in one global order (sorted, as the decision log writer
        # does), so this batch and a concurrent decision batch never wait on each other in
        # a cycle (PostgreSQL would abort one: 503). Per tenant, events keep arrival order.
        async with db.transaction() as conn:
            for tenant, event, now in sorted(items, key=lambda item: item[0]):
                await append(conn, tenant, [event], now=now)
        return [None] * len(items)

    return GroupCommitter(run_batch, max_queue=settings.refusal_queue_max,
                          shedding=shedding, name="refusals")


#: The roles of an approval's counted reviews (one row each), with the requirement of the
#: stage they approved (the rules they were judged by: quorum.reviews_still_meet), when
#: each was given and when the request opened.
_COUNTED_ROLES = select(reviews.c.role, approvals.c.requirement, reviews.c.created_at,
                        approvals.c.created_at).join(
    approvals, approvals.c.id == reviews.c.approval_id).where(
    reviews.c.approval_id == bindparam("approval_id"), reviews.c.decision == "approved",
    reviews.c.role.is_not(None), reviews.c.stage == approvals.c.stage)
_COUNTED_ROLES_RAW = RawStatement(_COUNTED_ROLES)


class _PermitState(NamedTuple):
    status: str
    expires_at: datetime
    token_digest: bytes | None = None


class _Counted(NamedTuple):
    """An approval's counted reviews: their roles, the stored requirement of the stage
    that judged them (``None`` when no review counted), and the milliseconds from the
    request's opening to the earliest of them."""

    roles: list[str]
    held: dict[str, Any] | None
    elapsed_ms: int = 0


def _counted(found: Sequence[Any]) -> _Counted:
    if not found:
        return _Counted([], None)
    earliest = min(row[2] for row in found)
    elapsed = (earliest - found[0][3]) // timedelta(milliseconds=1)
    return _Counted([str(row[0]) for row in found], found[0][1], max(0, int(elapsed)))


_Read = tuple[_PermitState | None, tuple[dict[str, Any], list[str]] | None, _Counted | None]


def _read_raw(db: Database, tenant: str, claims: PermitClaims) -> _Read | None:
    """:func:`_read` on the raw ``sqlite3`` driver, in one snapshot; ``None`` when the
    database is not a SQLite file (:func:`cosigner.db.raw_sql.read_connection`)."""
    # One statement without an approval is its own snapshot: no BEGIN … ROLLBACK.
    with read_connection(db, snapshot=claims.approval_id is not None) as conn:
        if conn is None:
            return None
        dialect = db.engine.dialect
        rows = _PERMIT_AND_INPUT_RAW.run(conn, dialect, {
            "jti": claims.jti, "tenant": tenant, "decision_id": claims.decision_id})[0]
        if not rows:
            return None, None, None
        status, expires_at, digest, call_input, call_mask = rows[0]
        row = _PermitState(status, expires_at, digest)
        stored = None if call_input is None else (dict(call_input), list(call_mask))
        counted = None
        if claims.approval_id is not None:
            counted = _counted(_COUNTED_ROLES_RAW.run(conn, dialect,
                                                      {"approval_id": claims.approval_id})[0])
        return row, stored, counted


async def _read(db: Database, tenant: str, claims: PermitClaims) -> _Read:
    """:func:`_read_on` on a connection of its own."""
    async with db.read() as conn:
        return await _read_on(conn, tenant, claims.jti, claims.decision_id,
                              claims.approval_id)


async def _read_on(conn: AsyncConnection, tenant: str, jti: str, decision_id: str,
                   approval_id: str | None) -> _Read:
    """The permit's state, its call's recorded input ``(input, mask)`` and the roles of
    the approval's counted reviews (``None`` without an approval), read on ``conn``."""
    row = (await conn.execute(_PERMIT_AND_INPUT, {
        "jti": jti, "tenant": tenant, "decision_id": decision_id})).first()
    if row is None:
        return None, None, None
    stored = (None if row.call_input is None
              else (dict(row.call_input), list(row.call_mask)))
    counted = None
    if approval_id is not None:
        counted = _counted((await conn.execute(_COUNTED_ROLES, {
            "approval_id": approval_id})).all())
    return _PermitState(row.status, row.expires_at, row.token_digest), stored, counted


_ReadKey = tuple[str, str, str, str | None]  # tenant, jti, decision id, approval id


class _Reads:
    """The redeem reads of one :class:`Database` on the SQLAlchemy path (PostgreSQL, an
    in-memory SQLite), single-flight per permit: N concurrent redeems of one permit share
    one read (one pooled connection, not N), while reads of distinct permits run side by
    side, each on its own connection as before. A redeem joins a read only while that
    read still waits for its connection: once the read has one, a later redeem of the
    same permit starts its own, so every redeem's snapshot is taken after it arrived (as
    with a read of its own). Single use is still decided by the conditional ``UPDATE``
    under the write lock."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.loop = asyncio.get_running_loop()
        #: Reads not yet holding a connection, which a redeem of the same permit joins.
        self.queued: dict[_ReadKey, asyncio.Future[_Read]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def read(self, tenant: str, claims: PermitClaims) -> _Read:
        key = (tenant, claims.jti, claims.decision_id, claims.approval_id)
        future = self.queued.get(key)
        if future is None:
            future = self.queued[key] = self.loop.create_future()
            future.add_done_callback(_retrieved)
            task = self.loop.create_task(self._read(key, future))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            # Shielded: one waiter cancelled (its client left) cancels neither the read
            # nor the other waiters of the same permit.
            return await asyncio.shield(future)
        # A joiner: its own copy of the recorded input (policy code gets it as input).
        return copy.deepcopy(await asyncio.shield(future))

    def _started(self, key: _ReadKey, future: asyncio.Future[_Read]) -> None:
        if self.queued.get(key) is future:
            del self.queued[key]

    async def _read(self, key: _ReadKey, future: asyncio.Future[_Read]) -> None:
        try:
            async with self.db.read() as conn:
                self._started(key, future)  # later redeems read on their own
                read = await _read_on(conn, *key)
            if not future.done():
                future.set_result(read)
        except Exception as exc:  # every waiter of this read gets the error
            self._started(key, future)
            if not future.done():
                future.set_exception(exc)
        except BaseException:  # cancelled (the loop is closing): fail closed
            self._started(key, future)
            if not future.done():
                future.set_exception(Unavailable("the database is unavailable",
                                                 code="storage_unavailable"))
            raise


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a shared read's error as seen (its waiters may all have left)."""
    if not future.cancelled():
        future.exception()


def _reads(db: Database) -> _Reads:
    """``db``'s :class:`_Reads` for the running loop."""
    reads: _Reads | None = db.__dict__.get("_redeem_reads")
    if reads is None or reads.loop is not asyncio.get_running_loop():
        reads = db.__dict__["_redeem_reads"] = _Reads(db)
    return reads


async def _standing_live(deps: AppContext, tenant: str, standing_id: str) -> bool:
    """The standing approval that allowed the call is not revoked (a revoke wins over
    permits of it not yet redeemed)."""
    async with deps.db.read() as conn:
        revoked = (await conn.execute(select(standing_approvals.c.revoked_at).where(
            standing_approvals.c.id == standing_id,
            standing_approvals.c.tenant == tenant))).first()
    return revoked is not None and revoked.revoked_at is None


async def _recheck_policy(deps: AppContext, tenant: str, claims: PermitClaims,
                          stored: tuple[dict[str, Any], list[str]] | None,
                          args: dict[str, Any], counted: _Counted | None,
                          now: datetime, now_text: str) -> None:
    """Time-of-use check: the active policy must still give ``allow`` – or, for an
    approved permit, ``require_approval`` that its counted reviews still meet, judged no
    more loosely than it asks now (:func:`cosigner.policy.quorum.reviews_still_meet`: a
    policy that since asks a signature, a step-up or more separation of duties refuses).
    ``now_text``: ``now`` in RFC 3339 (:func:`cosigner.core.clock.isoformat`), the input's
    ``now``.

    Raises:
        PermitRefused ``policy_changed`` (also when the input was not recorded or the tool
        left the catalogue: fail closed); ``invalid_args`` when the presented args fail the
        tool catalogue's schema.
    """
    if stored is None:
        raise _policy_changed()
    snapshot = deps.store.snapshot
    bundle = snapshot.bundle_for(tenant)
    barrier = claims.tool == BARRIER_TOOL
    if barrier and claims.approval_id is None:
        raise _policy_changed()  # only a reviewed program barrier mints these (never decide)
    if bundle is not None and bundle.catalogue is not None:
        spec = bundle.catalogue.lookup(claims.tool)
        # A catalogue need not list the barrier tool (cosigner.approvals.barriers).
        if spec is None and not barrier:
            raise _policy_changed()
        try:
            if spec is not None:
                spec.validate(args)
        except InvalidArgs as exc:  # same hash, but e.g. 100000.0 for a strict integer
            raise PermitRefused("arguments fail the tool's schema",
                                code="invalid_args") from exc
    input_doc = {**stored[0], "args": args, "now": now_text}
    result = (await deps.store.evaluate(tenant, input_doc, snapshot=snapshot)).result
    if result.effect == "allow":
        return
    if (result.effect == "require_approval" and result.approval is not None
            and counted is not None and reviews_still_meet(
                result.approval, counted.roles, _held(counted), counted.elapsed_ms)):
        return
    if (result.effect == "require_approval" and result.approval is not None
            and claims.break_glass and result.approval.break_glass):
        return  # authorised by break-glass, which the current policy still allows
    if (result.effect == "require_approval" and result.approval is not None
            and claims.standing_id is not None and result.approval.standing is not None
            and await _standing_live(deps, tenant, claims.standing_id)):
        return  # allowed by a standing approval the policy still allows, not revoked
    raise _policy_changed()


def _held(counted: _Counted) -> ApprovalRequirement | None:
    """The requirement the counted reviews were judged by; ``None`` when unknown or no
    longer readable as one (the re-check then fails closed)."""
    if counted.held is None:
        return None
    try:
        return parse_requirement(counted.held)
    except PolicyError:
        return None


def _policy_changed() -> PermitRefused:
    """The refusal of a call the active policy no longer allows (built only when raised)."""
    return PermitRefused("the active policy no longer allows this call", code="policy_changed")
