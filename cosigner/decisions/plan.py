"""The decision plan: everything one decision writes, built once, written one of two ways.

A :class:`DecisionPlan` holds what :func:`cosigner.decisions.pdp.decide` evaluated (the
policy's result, the input document, the mask) and turns it into the writes of one
decision: the ``decisions`` row, its ``decision.made`` event, for ``allow`` the permit (row
and ``permit.minted`` event), for ``allow`` and ``require_approval`` the stored call input
(what redeem re-evaluates), for ``require_approval`` the approval request to open or join,
and the run contract's counters. The group committer (:mod:`cosigner.db.batch`) takes the
plan's :meth:`DecisionPlan.item`:

* :meth:`prepared` — an ``allow`` or ``deny`` outside any run contract and not known to be
  rejected: the rows and events only, bulk-inserted with the batch's other decisions;
  what it assumes (no run contract, no standing rejection) is confirmed by the batch under
  the write lock, and a refuted assumption decides again on the locked path.
* :meth:`apply` — everything else, run under the write lock: a standing rejection and the
  run contract's counters are checked first (either may turn the effect into ``deny``),
  then the same rows as :meth:`prepared` are written, plus the approval request.

Both build their rows with :meth:`_writes`, so the two paths cannot drift apart. ``apply``
may run more than once (a batch redone item by item after a failure); every run starts
from the plan's initial response.

The plan and its parts are ``NamedTuple``s: immutable like the frozen dataclasses they
were, but built in one tuple allocation instead of one ``object.__setattr__`` per field
(several µs per decision, issue 20).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Table
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from cosigner.approvals import opening as approval_requests
from cosigner.approvals import rejections
from cosigner.approvals import standing as standing_approvals
from cosigner.audit.chain import Event
from cosigner.context import AppContext
from cosigner.db.batch import Item, NeedsCore, RawWork, Write
from cosigner.db.tables import decisions, permits
from cosigner.db.tables_approvals import call_inputs
from cosigner.decisions import guard_sql
from cosigner.identity.principals import Caller
from cosigner.permits import ledger as permit_ledger
from cosigner.policy.result import ApprovalRequirement
from cosigner.policy.store import Evaluation
from cosigner.runs import contracts


class Assumed(NamedTuple):
    """What a prepared decision took for granted, confirmed by its group-commit batch:
    ``run`` has no contract; ``call`` (an ``allow``) has no standing rejection;
    ``request`` = ``(tenant, request_id)`` was not decided before (a retry is answered
    with the first decision instead, :class:`cosigner.decisions.pdp.AlreadyDecided`)."""

    run: tuple[str, str]
    call: rejections.Call | None
    request: tuple[str, str] = ("", "")


class Call(NamedTuple):
    """The request as decided: who asked, on whose behalf, which tool with which args."""

    caller: Caller
    request_id: str
    request_hash: str
    run: dict[str, Any]
    principal: dict[str, Any]
    initiator: dict[str, Any]
    tool: dict[str, Any]
    args: dict[str, Any]
    context: dict[str, Any]
    args_hash: str
    mode: str = "on"

    @property
    def shadow(self) -> bool:
        """A shadow decision: recorded, never enforced (no permit, no approval request)."""
        return self.mode == "shadow"


class DecisionPlan(NamedTuple):
    """What one decision writes (see the module docstring). ``now`` is the decision time
    (UTC); ``mask`` the JSON pointers under ``args`` never stored in clear; ``contract``
    whether the run's contract was read (its counters are then checked under the lock)."""

    deps: AppContext
    call: Call
    decision_id: str
    now: datetime
    evaluation: Evaluation
    input_doc: dict[str, Any]
    mask: tuple[str, ...]
    contract: bool
    locked: bool
    #: W3C trace id of the request's span, when tracing is on (README § Tracing).
    trace_id: str | None = None

    @property
    def tenant(self) -> str:
        return self.call.caller.tenant

    @property
    def run_id(self) -> str:
        return str(self.call.run["id"])

    def initial_response(self) -> dict[str, Any]:
        """The Decision v1 object as the policy answered, before any write-time check."""
        result = self.evaluation.result
        approval = None
        if (result.effect == "require_approval" and result.approval is not None
                and not self.call.shadow):
            approval = {"status": "pending", **result.approval.as_dict()}
        response = {"decision_id": self.decision_id, "request_id": self.call.request_id,
                    "effect": result.effect, "reasons": [r.as_dict() for r in result.reasons],
                    "policy": self.evaluation.policy, "args_hash": self.call.args_hash,
                    "permit": None, "approval": approval}
        if self.call.shadow:
            response["mode"] = "shadow"
        return response

    def item(self) -> Item:
        """What the group committer runs: the prepared rows, or :meth:`apply` (with its
        raw twin :meth:`apply_raw` for a plain ``require_approval``)."""
        simple = (not self.locked and not self.contract
                  and (self.call.shadow
                       or self.evaluation.result.effect in ("allow", "deny")))
        if simple:
            return self.prepared()
        requirement = self.evaluation.result.approval
        if (self.evaluation.result.effect == "require_approval" and not self.call.shadow
                and not self.contract and requirement is not None
                and requirement.standing is None):
            return RawWork(self.apply, self.apply_raw)
        return self.apply

    def prepared(self) -> Write:
        """The rows and events of an ``allow``/``deny`` (or any shadow decision) outside any
        run contract."""
        response = self.initial_response()
        events, rows = self._writes(response)
        # A shadow require_approval is written here too: like an allow, it must not
        # outlive a reviewer's rejection of the same call (confirmed by the batch).
        allowed = response["effect"] == "allow" or (
            self.call.shadow and response["effect"] == "require_approval")
        call = (self.tenant, self.run_id, self.call.tool["name"], self.call.args_hash)
        return Write(self.tenant, events, response, rows, assumes=Assumed(
            run=(self.tenant, self.run_id), call=call if allowed else None,
            request=(self.tenant, self.call.request_id)))

    async def apply(self, conn: AsyncConnection) -> Write:
        """Check, then write, under the write lock (the batch's transaction)."""
        response = self.initial_response()
        tool = self.call.tool["name"]
        # A person rejected this call in this run: deny whatever the policy said, open
        # nothing, count nothing (one indexed read; standing rejections are few).
        rejected = None if response["effect"] == "deny" else await rejections.standing(
            conn, tenant=self.tenant, run_id=self.run_id, tool=tool,
            args_hash=self.call.args_hash)
        if rejected is not None:
            response.update(effect="deny", reasons=[rejected.as_dict()], approval=None)
        # Re-check and count the run contract here: concurrent calls cannot overspend.
        # A shadow decision never runs under Cosigner's permit: it spends nothing.
        refused = await contracts.check_and_count(
            conn, tenant=self.tenant, run_id=self.run_id, tool=tool, now=self.now,
            count=response["effect"] != "deny" and not self.call.shadow,
            assumed_none=not self.contract, args=self.call.args)
        if refused is not None and rejected is None:
            response.update(effect="deny", reasons=[refused.as_dict()], approval=None)
        requirement = self.evaluation.result.approval
        standing_id, approval_events = await self._use_standing(conn, response, requirement)
        gated = (response["effect"] == "require_approval" and requirement is not None
                 and not self.call.shadow)
        if gated and requirement is not None:  # (gated implies it; mypy cannot see that)
            approval_events = await approval_requests.record_gate(
                conn, self.deps.settings, self.call.caller, response=response,
                requirement=requirement, input_doc=self.input_doc, mask=self.mask,
                now=self.now)
        return self._gated_write(response, approval_events, gated, standing_id)

    def apply_raw(self, raw: sqlite3.Connection, dialect: Dialect) -> Write:
        """:meth:`apply` on a raw batch transaction's ``sqlite3`` connection, for what
        :meth:`item` gives it (a ``require_approval`` outside any known contract, no
        standing approvals): its common cases, a new request or a join of a pending
        one, in a run with no contract and no standing rejection of the call.

        Raises:
            NeedsCore: anything else (a rejection, a contract, a due twin, webhooks on a
                new request): :meth:`apply` decides it.
        """
        response = self.initial_response()
        tool = self.call.tool["name"]
        if rejections.standing_raw(raw, dialect, tenant=self.tenant, run_id=self.run_id,
                                   tool=tool, args_hash=self.call.args_hash) is not None:
            raise NeedsCore
        if guard_sql.contracted(raw, {(self.tenant, self.run_id)}):
            raise NeedsCore
        requirement = self.evaluation.result.approval
        assert requirement is not None
        approval_events = approval_requests.record_gate_raw(
            raw, dialect, self.deps.settings, self.call.caller, response=response,
            requirement=requirement, input_doc=self.input_doc, mask=self.mask, now=self.now)
        return self._gated_write(response, approval_events, True, None)

    def _gated_write(self, response: dict[str, Any], approval_events: list[Event],
                     gated: bool, standing_id: str | None) -> Write:
        events, rows = self._writes(response, standing_id=standing_id)
        if gated:
            rows.append((call_inputs, self._call_input_row()))
        # The rows go in with the batch's bulk insert (or, redone item by item, in this
        # item's savepoint): nothing in the batch reads them back before the commit.
        return Write(self.tenant, events[:1] + approval_events + events[1:], response, rows)

    async def _use_standing(self, conn: AsyncConnection, response: dict[str, Any],
                            requirement: ApprovalRequirement | None
                            ) -> tuple[str | None, list[Event]]:
        """A ``require_approval`` whose requirement allows standing approvals, matched by a
        live one: spend one use and turn it into ``allow`` citing it. Runs after the
        standing-rejection and policy checks, so a reject or a deny always wins."""
        if (response["effect"] != "require_approval" or requirement is None
                or requirement.standing is None or self.call.shadow):
            return None, []  # a shadow decision never spends a standing approval
        used = await standing_approvals.use(
            conn, tenant=self.tenant, run_id=self.run_id, tool=self.call.tool["name"],
            principal_id=str(self.call.principal.get("id")), args=self.call.args,
            now=self.now)
        if used is None:
            return None, []
        standing_id, uses, max_uses = used
        response.update(effect="allow", approval=None, reasons=[{
            "code": standing_approvals.REASON_CODE,
            "message": f"standing approval {standing_id} ({uses} of {max_uses} uses)"}])
        return standing_id, [Event(
            type="standing.used", actor=self.call.caller.actor(),
            decision_id=self.decision_id, run_id=self.run_id, tool=self.call.tool["name"],
            args_hash=self.call.args_hash, payload={"id": standing_id, "uses": uses,
                                                    "max_uses": max_uses})]

    def _writes(self, response: dict[str, Any], *, standing_id: str | None = None
                ) -> tuple[list[Event], list[tuple[Table, dict[str, Any]]]]:
        """The events and rows of ``response``: the decision event (and the permit's for
        an ``allow``), the decision row, and for an ``allow`` the permit row and the call
        input. Fills in ``response["permit"]``."""
        events = [decision_event(self.call, response, self.evaluation, self.mask,
                                 trace_id=self.trace_id, time=self.now)]
        rows: list[tuple[Table, dict[str, Any]]] = [(decisions, self._decision_row(response))]
        if self.call.shadow:
            # Never a permit (so nothing to redeem); the input is kept for replay.
            if response["effect"] != "deny":
                rows.append((call_inputs, self._call_input_row()))
        elif response["effect"] == "allow":
            settings = self.deps.settings
            permit, permit_event, permit_row = permit_ledger.prepare_permit(
                self.deps.keyring, settings, tenant=self.tenant, run_id=self.run_id,
                decision_id=self.decision_id, approval_id=None, tool=self.call.tool["name"],
                args_hash=self.call.args_hash, policy=self.evaluation.policy or {},
                approvers=[], now=self.now, ttl_s=permit_ttl(self),
                actor=self.call.caller.actor(), standing_id=standing_id, event_time=self.now)
            response["permit"] = permit
            events.append(permit_event)
            rows.append((permits, permit_row))
            rows.append((call_inputs, self._call_input_row()))
        return events, rows

    def _call_input_row(self) -> dict[str, Any]:
        return permit_ledger.call_input_row(tenant=self.tenant, decision_id=self.decision_id,
                                            input_doc=self.input_doc, mask=self.mask)

    def _decision_row(self, response: dict[str, Any]) -> dict[str, Any]:
        policy = self.evaluation.policy or {}
        return {"id": self.decision_id, "tenant": self.tenant,
                "request_id": self.call.request_id, "request_hash": self.call.request_hash,
                "run_id": self.run_id, "tool": self.call.tool["name"],
                "args_hash": self.call.args_hash, "effect": response["effect"],
                "caller": self.call.caller.subject, "policy_id": policy.get("id"),
                "policy_version": policy.get("version"),
                "policy_revision": policy.get("revision"), "response": response,
                "created_at": self.now}


def permit_ttl(plan: DecisionPlan) -> int:
    """Permit lifetime (s) for an ``allow``: the policy's ``permit_ttl_s`` or the default,
    capped by ``max_permit_ttl_s``."""
    settings = plan.deps.settings
    ttl = plan.evaluation.result.permit_ttl_s or settings.permit_ttl_s
    return min(ttl, settings.max_permit_ttl_s)


def decision_event(call: Call, response: dict[str, Any], evaluation: Evaluation,
                   mask: tuple[str, ...], *, trace_id: str | None = None,
                   time: datetime | None = None) -> Event:
    """The ``decision.made`` event of ``response`` (args masked by ``audit.append``),
    happening at ``time`` (``append``'s ``now`` when ``None``)."""
    payload: dict[str, Any] = {
        "request_id": call.request_id,
        "reasons": response["reasons"],
        "principal": call.principal,
        "initiator": call.initiator,
        "run": call.run,
        "tool": call.tool,
        # Masked by audit.append before hashing (catalogue + policy paths, secret keys).
        "args": call.args,
        "context": call.context,
        "eval_us": evaluation.elapsed_us,
        # The roles the policy saw as input.caller.roles: a deny has no stored input,
        # so replay (cosigner.policy.replay) rebuilds it from this event.
        "caller_roles": sorted(call.caller.roles),
    }
    if evaluation.opa_revisions is not None:
        payload["opa_revisions"] = evaluation.opa_revisions
    if evaluation.shadow is not None:
        payload["shadow"] = {"policy": evaluation.shadow_policy,
                             "effect": evaluation.shadow.effect,
                             "reasons": [r.as_dict() for r in evaluation.shadow.reasons],
                             "agrees": evaluation.shadow.effect == evaluation.result.effect}
    if response.get("approval"):
        payload["approval"] = response["approval"]
    if call.shadow:
        payload["mode"] = "shadow"
    if trace_id is not None:
        payload["trace_id"] = trace_id
    return Event(
        type="decision.made", actor=call.caller.actor(),
        decision_id=response["decision_id"], run_id=call.run["id"], tool=call.tool["name"],
        args_hash=response["args_hash"], effect=response["effect"],
        principal=str(call.principal.get("id")), policy=evaluation.policy, payload=payload,
        mask=tuple(["/args" + pointer for pointer in mask]) if mask else (),
        mode="shadow" if call.shadow else None, time=time)
