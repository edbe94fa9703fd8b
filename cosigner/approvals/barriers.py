"""Program barriers: trusted runtime code opens an approval request over a context document.

``POST /v1/approvals`` with ``{run, context, require, timeout_ms, distinct_from}`` (role
``barrier``, distinct from ``runtime``: an agent's runtime key cannot open approvals of its
own choosing). The context is bound like tool arguments (RFC 8785 hash, ``args_hash``) and
shown and stored masked (the catalogue's entry for :data:`BARRIER_TOOL` if any, the
policy's ``mask``, always-secret keys).

The tenant's active policy sees the barrier as a call of the reserved tool
``cosigner.barrier`` with the context as ``input.args`` and the program's requirement as
``input.barrier``. It may only make the requirement stricter
(:func:`cosigner.policy.result.stricter`): ``require_approval`` merges its requirement
into the program's (more groups, larger counts, shorter timeout, both ``distinct_from``
rules); ``allow`` keeps the program's; ``deny`` (and every policy fault: fail closed)
refuses the barrier (403 ``barrier_denied``, logged). Once approved, the request's permit
is bound to the context hash and tool ``cosigner.barrier``; the program redeems it once
(``POST /v1/permits/redeem`` with the same context as ``args``) when it resumes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cosigner.approvals.opening import CallFacts, open_request
from cosigner.approvals.requests import load, reviews_of
from cosigner.approvals.views import view
from cosigner.audit.chain import Event, append
from cosigner.core.canonical import args_hash, canonicalize, hash_bytes
from cosigner.core.clock import isoformat
from cosigner.core.errors import Forbidden, InvalidRequest, PolicyError
from cosigner.core.ids import new_id
from cosigner.core.roles import BARRIER_ROLE, BARRIER_TOOL
from cosigner.db.tables import decisions
from cosigner.db.tables_approvals import call_inputs
from cosigner.identity.principals import Caller
from cosigner.permits import ledger as permit_ledger
from cosigner.policy.result import ApprovalRequirement, parse_requirement, stricter

if TYPE_CHECKING:
    from cosigner.context import AppContext

__all__ = ["open_barrier"]


def _requirement(raw: dict[str, Any]) -> ApprovalRequirement:
    try:
        return parse_requirement(raw)
    except PolicyError as exc:
        raise InvalidRequest(exc.detail, code="invalid_requirement") from exc


async def open_barrier(deps: AppContext, caller: Caller, *, run: dict[str, Any],
                       context: dict[str, Any], requirement: dict[str, Any],
                       principal: dict[str, Any] | None = None,
                       initiator: dict[str, Any] | None = None) -> dict[str, Any]:
    """Open (or join: same run and context while pending) a program barrier.

    ``requirement`` is ``{require, timeout_ms, distinct_from}`` as in a policy result.
    ``principal`` / ``initiator`` default to the calling program's subject.

    Returns the approval object (with ``barrier: {requested, effective, raised}``).

    Raises:
        Forbidden: no ``barrier`` role; ``barrier_denied`` when the policy denies it.
        InvalidRequest: ``invalid_requirement``; InvalidJSON/InvalidArgs: a context that
            cannot be hashed or fails the catalogue's schema for ``cosigner.barrier``.
    """
    caller.require(BARRIER_ROLE)
    asked = _requirement(requirement)
    context_hash = args_hash(context)  # raises for unhashable JSON (422)
    tenant, now = caller.tenant, deps.clock()
    program = {"id": caller.subject, "type": "program"}
    principal, initiator = principal or program, initiator or program
    snapshot = deps.store.snapshot
    bundle = snapshot.bundle_for(tenant)
    spec = bundle.catalogue.lookup(BARRIER_TOOL) if bundle and bundle.catalogue else None
    if spec is not None:
        spec.validate(context)
    input_doc = {"tenant": tenant, "principal": principal, "initiator": initiator,
                 "caller": {"subject": caller.subject, "roles": sorted(caller.roles)},
                 "tool": {"name": BARRIER_TOOL, "side_effect": "none"}, "args": context,
                 "context": {}, "run": run, "now": isoformat(now),
                 "barrier": asked.as_dict()}
    evaluation = await deps.store.evaluate(tenant, input_doc, snapshot=snapshot)
    result = evaluation.result
    mask = tuple(spec.mask if spec is not None else ()) + result.mask
    effective = None if result.effect == "deny" else (
        stricter(asked, result.approval) if result.approval is not None else asked)
    decision_id = new_id()
    summary = {"requested": asked.as_dict(),
               "effective": effective.as_dict() if effective else None,
               "raised": effective is not None and effective != asked}
    reasons = [r.as_dict() for r in result.reasons]
    effect = "deny" if effective is None else "require_approval"
    response = {"decision_id": decision_id, "effect": effect, "reasons": reasons,
                "policy": evaluation.policy, "args_hash": context_hash, "barrier": summary}
    policy = evaluation.policy or {}
    opened_event = Event(
        type="barrier.refused" if effective is None else "barrier.opened",
        actor=caller.actor(), decision_id=decision_id, run_id=str(run["id"]),
        tool=BARRIER_TOOL, args_hash=context_hash, effect=effect,
        principal=str(principal.get("id")), policy=evaluation.policy,
        payload={"run": run, "context": context, "reasons": reasons, **summary},
        mask=tuple("/context" + p for p in mask))
    async with deps.db.transaction() as conn:
        await conn.execute(decisions.insert(), {
            "id": decision_id, "tenant": tenant, "request_id": f"barrier-{decision_id}",
            "request_hash": hash_bytes(canonicalize({"run": run, "context": context,
                                                     "requirement": asked.as_dict()})),
            "run_id": str(run["id"]), "tool": BARRIER_TOOL, "args_hash": context_hash,
            "effect": effect, "caller": caller.subject,
            "policy_id": policy.get("id"), "policy_version": policy.get("version"),
            "policy_revision": policy.get("revision"), "response": response,
            "created_at": now})
        if effective is None:
            await append(conn, tenant, [opened_event], now=now)
            state = None
        else:
            await conn.execute(call_inputs.insert(), permit_ledger.call_input_row(
                tenant=tenant, decision_id=decision_id, input_doc=input_doc, mask=mask))
            call = CallFacts(
                tenant=tenant, decision_id=decision_id, run_id=str(run["id"]),
                tool=BARRIER_TOOL, args=context, args_hash=context_hash, mask=mask,
                initiator=initiator, principal=principal, policy=evaluation.policy,
                reasons=[{"code": "program_barrier", "message": "opened by the program"}]
                + reasons)
            brief, opened = await open_request(
                conn, deps.settings, call=call, requirement=effective,
                opened_by=caller.actor(), now=now, kind="barrier")
            await append(conn, tenant, [opened_event, *opened], now=now)
            row = await load(conn, tenant, brief["id"], lock=False)
            state = view(row, await reviews_of(conn, row.id),
                         public_url=deps.settings.public_url, now=now,
                         include_permit=caller.has_any("runtime"))
    if state is None:
        raise Forbidden("the active policy denies this barrier", code="barrier_denied")
    return {**state, "barrier": summary}
