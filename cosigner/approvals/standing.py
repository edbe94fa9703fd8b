"""Bounded standing approvals: one approval extended to later matching calls.

When the requirement allows it (``standing: {max_ttl_s, max_uses}``), the approver whose
approval meets a one-person requirement may attach a grant to it (:func:`parse_grant`)::

    {"scope": "run" | "ttl", "ttl_s": int <= max_ttl_s, "max_uses": int <= max_uses,
     "constraints": [{"pointer": "/order_id", "op": "equals", "value": "ord_8472"},
                     {"pointer": "/amount_minor", "op": "max", "value": 200000}]}

Scope ``run``: later calls in the same run; ``ttl``: in any run of the tenant. Either way
the same tool on behalf of the same principal, until ``ttl_s`` has passed (``now >=
expires_at`` ends it) and at most ``max_uses`` times. Constraints are JSON pointers (RFC
6901) into the arguments with ``equals`` (RFC 8785 equality), ``max`` and ``min`` (numbers);
at least one, all must hold, the approved call itself must meet them, and none may read a
masked path (the approver must see what they confirm). A quorum of several people is never
extended by one of them: the grant needs a stage that one person meets.

A later ``require_approval`` decision of a matching call (:func:`use`, under the decision's
write lock; the policy must still allow ``standing``) becomes ``allow`` with reason
``approved_by_standing`` naming the standing approval, and gets its own single-use permit
bound to its own args (claim ``standing_id``; K09). A policy ``deny`` never reaches it, a
standing rejection of the call is checked before it, and a revoked standing approval
(:func:`revoke`, an approver holding one of its roles or an admin) is never used, nor is
a permit of it redeemed. Events: ``standing.granted``, ``standing.used`` (every use, with
the count), ``standing.revoked``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals.requests import aware
from cosigner.approvals.views import MASK
from cosigner.audit.chain import Event, append
from cosigner.core.canonical import canonicalize
from cosigner.core.clock import isoformat
from cosigner.core.errors import CosignerError, InvalidRequest, NotFound, ReviewRefused
from cosigner.core.ids import new_id
from cosigner.core.pointer import unescape
from cosigner.db.tables_approvals import standing_approvals
from cosigner.identity.principals import Caller
from cosigner.policy.result import ApprovalRequirement

if TYPE_CHECKING:
    from cosigner.context import AppContext

__all__ = ["REASON_CODE", "check_grant", "grant", "list_standing", "matches", "parse_grant",
           "revoke", "use"]

REASON_CODE = "approved_by_standing"
OPS = ("equals", "max", "min")
MAX_CONSTRAINTS = 16
_MISSING = object()


def _invalid(detail: str, code: str = "invalid_standing") -> InvalidRequest:
    return InvalidRequest(detail, code=code)


def _resolve(doc: Any, pointer: str) -> Any:
    """The value at ``pointer`` in ``doc`` (RFC 6901), or ``_MISSING``."""
    if pointer == "":
        return doc
    for segment in pointer[1:].split("/"):
        key = unescape(segment)
        if isinstance(doc, dict) and key in doc:
            doc = doc[key]
        elif isinstance(doc, list) and key.isdigit() and int(key) < len(doc) and (
                key == "0" or not key.startswith("0")):
            doc = doc[int(key)]
        else:
            return _MISSING
    return doc


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _holds(constraint: dict[str, Any], args: Any) -> bool:
    found = _resolve(args, constraint["pointer"])
    if found is _MISSING:
        return False
    op, bound = constraint["op"], constraint["value"]
    if op == "equals":
        try:
            return canonicalize(found) == canonicalize(bound)
        except (TypeError, ValueError):
            return False
    if not _number(found):
        return False
    return bool(found <= bound) if op == "max" else bool(found >= bound)


def matches(constraints: list[dict[str, Any]], args: Any) -> bool:
    """Do ``args`` meet every constraint? (A missing path or a non-number fails.)"""
    return bool(constraints) and all(_holds(c, args) for c in constraints)


def parse_grant(raw: Any, requirement: ApprovalRequirement) -> dict[str, Any]:
    """Validate an approver's grant against the requirement's ``standing`` bounds.

    Returns ``{scope, ttl_s, max_uses, constraints}``.

    Raises:
        InvalidRequest: ``standing_not_allowed`` (the policy allows none here),
            ``standing_needs_one_approver`` (the stage needs several people),
            ``invalid_standing`` (shape, bounds, operators).
    """
    rule = requirement.standing
    if rule is None:
        raise _invalid("the policy allows no standing approval for this call",
                       "standing_not_allowed")
    if sum(group.count for group in requirement.require) != 1:
        raise _invalid("a standing approval needs a stage one person meets; a quorum of "
                       "several people is not extended by one of them",
                       "standing_needs_one_approver")
    if not isinstance(raw, dict) or not set(raw) <= {"scope", "ttl_s", "max_uses",
                                                     "constraints"}:
        raise _invalid("standing must be {scope, ttl_s?, max_uses?, constraints}")
    scope = raw.get("scope")
    if scope not in ("run", "ttl"):
        raise _invalid("standing.scope must be run or ttl")
    ttl_s = raw.get("ttl_s", rule.max_ttl_s if scope == "run" else None)
    if not isinstance(ttl_s, int) or isinstance(ttl_s, bool) or not 1 <= ttl_s <= rule.max_ttl_s:
        raise _invalid(f"standing.ttl_s must be an integer in 1..{rule.max_ttl_s}")
    max_uses = raw.get("max_uses", rule.max_uses)
    if (not isinstance(max_uses, int) or isinstance(max_uses, bool)
            or not 1 <= max_uses <= rule.max_uses):
        raise _invalid(f"standing.max_uses must be an integer in 1..{rule.max_uses}")
    constraints = raw.get("constraints")
    if not isinstance(constraints, list) or not 1 <= len(constraints) <= MAX_CONSTRAINTS:
        raise _invalid(f"standing.constraints must list 1..{MAX_CONSTRAINTS} constraints")
    parsed = []
    for item in constraints:
        if (not isinstance(item, dict) or set(item) != {"pointer", "op", "value"}
                or not isinstance(item["pointer"], str) or not item["pointer"].startswith("/")
                or item["op"] not in OPS):
            raise _invalid("each constraint is {pointer: \"/json/pointer\", "
                           "op: equals|max|min, value}")
        if item["op"] != "equals" and not _number(item["value"]):
            raise _invalid("max and min take a number")
        parsed.append({"pointer": item["pointer"], "op": item["op"], "value": item["value"]})
    return {"scope": scope, "ttl_s": ttl_s, "max_uses": max_uses, "constraints": parsed}


def _reads_masked(pointer: str, shown: Any, mask: list[str]) -> bool:
    if any(pointer == m or pointer.startswith(m + "/") or m == "" for m in mask):
        return True
    return bool(_resolve(shown, pointer) == MASK)


def check_grant(row: Any, parsed: dict[str, Any]) -> None:
    """The grant must be about what the approver sees, and fit the call approved.

    Raises:
        InvalidRequest: ``standing_masked_path`` (a constraint reads a masked path),
            ``standing_mismatch`` (the approved call itself does not meet them).
    """
    shown = json.loads(row.args)  # stored masked: masked values are not there to match
    mask = list(row.mask)
    if any(_reads_masked(c["pointer"], shown, mask) for c in parsed["constraints"]):
        raise _invalid("a constraint reads a masked path the approver cannot see",
                       "standing_masked_path")
    if not matches(parsed["constraints"], shown):
        raise _invalid("the approved call does not meet the constraints", "standing_mismatch")


async def grant(conn: AsyncConnection, row: Any, caller: Caller, requirement:
                ApprovalRequirement, parsed: dict[str, Any], now: datetime) -> Event:
    """Store the grant (checked by :func:`check_grant`) of an approval that met its
    requirement, in the review's transaction; returns its ``standing.granted`` event."""
    standing_id = new_id()
    expires_at = now + timedelta(seconds=parsed["ttl_s"])
    values = {
        "id": standing_id, "tenant": row.tenant, "approval_id": row.id, "tool": row.tool,
        "principal_id": str(row.principal.get("id")),
        "run_id": row.run_id if parsed["scope"] == "run" else None,
        "constraints": parsed["constraints"],
        "roles": sorted({g.role for g in requirement.require}),
        "max_uses": parsed["max_uses"], "uses": 0, "created_by": caller.actor(),
        "created_at": now, "expires_at": expires_at, "revoked_at": None, "revoked_by": None}
    await conn.execute(standing_approvals.insert(), values)
    return Event(type="standing.granted", actor=caller.actor(), decision_id=row.decision_id,
                 approval_id=row.id, run_id=row.run_id, tool=row.tool,
                 args_hash=row.args_hash, payload={**_public(values)})


def _public(row: Any) -> dict[str, Any]:
    item = row if isinstance(row, dict) else row._asdict()
    return {
        "id": item["id"], "approval_id": item["approval_id"], "tool": item["tool"],
        "principal_id": item["principal_id"],
        "scope": "run" if item["run_id"] is not None else "ttl", "run_id": item["run_id"],
        "constraints": item["constraints"], "roles": item["roles"],
        "max_uses": item["max_uses"], "uses": item["uses"],
        "created_by": item["created_by"]["subject"],
        "created_at": isoformat(aware(item["created_at"])),
        "expires_at": isoformat(aware(item["expires_at"])),
        "revoked_at": isoformat(aware(item["revoked_at"])) if item["revoked_at"] else None}


async def use(conn: AsyncConnection, *, tenant: str, run_id: str, tool: str,
              principal_id: str, args: dict[str, Any], now: datetime
              ) -> tuple[str, int, int] | None:
    """Spend one use of a live standing approval matching this call, if any: returns
    ``(id, uses after this one, max_uses)``. Runs under the decision's write lock; the
    conditional ``UPDATE ... WHERE uses < max_uses AND revoked_at IS NULL`` keeps replicas
    from overspending."""
    c = standing_approvals.c
    candidates = (await conn.execute(select(standing_approvals).where(
        c.tenant == tenant, c.tool == tool, c.principal_id == principal_id,
        c.revoked_at.is_(None), c.expires_at > now, c.uses < c.max_uses,
        or_(c.run_id.is_(None), c.run_id == run_id)).order_by(c.created_at, c.id))).all()
    for row in candidates:
        if not matches(row.constraints, args):
            continue
        spent = await conn.execute(standing_approvals.update().where(
            c.id == row.id, c.uses < c.max_uses, c.revoked_at.is_(None))
            .values(uses=c.uses + 1))
        if spent.rowcount == 1:
            return row.id, row.uses + 1, row.max_uses
    return None


def _may_manage(caller: Caller, row: Any) -> bool:
    return caller.has_any("admin") or bool(caller.roles & set(row.roles))


async def list_standing(deps: AppContext, caller: Caller, *, active_only: bool = True,
                        limit: int = 100) -> list[dict[str, Any]]:
    """Standing approvals of the caller's tenant the caller may see (admins, auditors,
    runtimes: all; approvers: those of their roles), newest first; ``active_only``: not
    revoked, not expired, uses left."""
    now = deps.clock()
    c = standing_approvals.c
    query = select(standing_approvals).where(c.tenant == caller.tenant)
    if active_only:
        query = query.where(c.revoked_at.is_(None), c.expires_at > now, c.uses < c.max_uses)
    async with deps.db.read() as conn:
        rows = (await conn.execute(query.order_by(c.created_at.desc()).limit(500))).all()
    readers = caller.has_any("admin", "auditor", "runtime")
    return [_public(r) for r in rows if readers or _may_manage(caller, r)][:limit]


async def revoke(deps: AppContext, caller: Caller, standing_id: str) -> dict[str, Any]:
    """Revoke a standing approval (an admin, or an approver holding one of its roles):
    no later call uses it and no unredeemed permit of it redeems.

    Raises:
        NotFound: no such standing approval in the caller's tenant.
        ReviewRefused: ``not_eligible`` (logged).
    """
    now = deps.clock()
    who = caller.actor()
    refusal: CosignerError | None = None
    async with deps.db.transaction() as conn:
        row = (await conn.execute(select(standing_approvals).where(
            standing_approvals.c.id == standing_id,
            standing_approvals.c.tenant == caller.tenant))).first()
        if row is None:
            raise NotFound("no such standing approval")
        if not _may_manage(caller, row):
            refusal = ReviewRefused("only an admin or an approver holding one of its roles "
                                    "may revoke it", code="not_eligible")
            events = [Event(type="standing.revoke_refused", actor=who, tool=row.tool,
                            approval_id=row.approval_id,
                            payload={"id": row.id, "code": refusal.code})]
        else:
            await conn.execute(standing_approvals.update().where(
                standing_approvals.c.id == row.id, standing_approvals.c.revoked_at.is_(None))
                .values(revoked_at=now, revoked_by=who))
            events = [Event(type="standing.revoked", actor=who, tool=row.tool,
                            approval_id=row.approval_id, payload={"id": row.id})]
        await append(conn, caller.tenant, events, now=now)
        fresh = (await conn.execute(select(standing_approvals).where(
            standing_approvals.c.id == standing_id))).first()
    if refusal is not None:
        raise refusal
    return _public(fresh)
